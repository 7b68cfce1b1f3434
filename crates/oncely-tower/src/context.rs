//! What a claimed request's handler sees ([`IdempotencyContext`]) and what it can tell the
//! layer back ([`HandlerOutcome`]).
//!
//! ```
//! use axum::{Extension, http::StatusCode, response::IntoResponse};
//! use oncely_tower::{HandlerOutcome, IdempotencyContext};
//!
//! async fn create_payment(ctx: IdempotencyContext, body: String) -> axum::response::Response {
//!     if body.is_empty() {
//!         // Rejected before any effect: returned, not stored, and the key is released, so the
//!         // client may fix the request and retry with the same key.
//!         return (StatusCode::BAD_REQUEST, Extension(HandlerOutcome::NotExecuted), "empty body")
//!             .into_response();
//!     }
//!     // A multi-step request records each committed phase (and resumes from it on a
//!     // takeover: `ctx.recovery_point`).
//!     if ctx.recovery_point.as_deref() != Some("charged") {
//!         // ... call the card processor with a key derived from ours ...
//!         ctx.checkpoint("charged").await.expect("still the owner");
//!     }
//!     (StatusCode::CREATED, "paid").into_response()
//! }
//! # let _ = axum::Router::<()>::new().route("/", axum::routing::post(create_payment));
//! ```

use crate::lease::LeaseWatch;
use oncely_core::{ClaimKind, FencingToken, KeyStore, RecordKey, StoreError};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The claim a request holds, inserted by the layer into the request extensions of every
/// claimed request (extract it in axum as an argument, or read it from
/// `req.extensions()` in any tower service).
///
/// It is absent on requests that pass through without a claim (ignored routes, and optional
/// routes called without a key).
#[derive(Clone)]
#[non_exhaustive]
pub struct IdempotencyContext {
    /// `(scope, key)`.
    pub id: RecordKey,
    /// The fencing token of this claim; every write to the record must carry it.
    pub token: FencingToken,
    /// Why the claim was granted: a first attempt, a takeover of a lapsed lease (resume from
    /// `recovery_point`), or a reuse after the replay window (a brand-new request).
    pub kind: ClaimKind,
    /// The last committed phase of a taken-over multi-step request; `None` on a first attempt.
    pub recovery_point: Option<String>,
    /// The lease of the claim (the policy's, e.g. 30 seconds), renewed by the layer's heartbeat
    /// while the handler runs.
    pub lease: Duration,
    /// How long the record is kept after completion (the policy's retention, e.g. 72 hours).
    pub retention: Duration,
    /// The store holding the record (for transactional handlers that complete it themselves).
    pub store: Arc<dyn KeyStore>,
    /// Where a claim made by a transactional [`Claimer`](crate::Claimer) stands; `None` for
    /// a claim committed at once (the default).
    pub progress: Option<Arc<dyn crate::ClaimProgress>>,
    /// The claim's lease as the layer's heartbeat last saw it.
    pub(crate) lease_watch: LeaseWatch,
}

impl fmt::Debug for IdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyContext")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("kind", &self.kind)
            .field("recovery_point", &self.recovery_point)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl IdempotencyContext {
    /// Records that the phase named `recovery_point` committed (non-transactional mode), and
    /// extends the lease. A retry that takes the key over after a crash sees it in
    /// [`IdempotencyContext::recovery_point`] and resumes after that phase.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when this request lost its claim (its lease lapsed and another
    /// request took the key over): stop, the other request owns the work now.
    /// [`StoreError::Unavailable`] when the store cannot be reached.
    pub async fn checkpoint(&self, recovery_point: &str) -> Result<(), StoreError> {
        self.store
            .checkpoint(&self.id, self.token, recovery_point, self.lease)
            .await
    }

    /// Makes sure this request still holds its claim before an outside call (see
    /// [`LeaseWatch::ensure_held`]): call it right before every call to a system outside the
    /// key store (a card processor, a mailer), with no database transaction of the request
    /// open. It answers at once while the heartbeat keeps the lease; if the heartbeat fell
    /// behind (a blocked runtime thread, a slow or failing store), it renews the lease first.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when another request took the key over (its lease lapsed): make
    /// no outside call and stop; the other request owns the work now. [`StoreError::Unavailable`]
    /// when the lease may have lapsed and the store did not answer a renewal in time: stop
    /// too, and answer with a retryable error (the record stays in flight at its recovery
    /// point, and a retry resumes it).
    pub async fn ensure_lease(&self) -> Result<(), StoreError> {
        self.lease_watch.ensure_held().await
    }

    /// The claim's lease as the layer's heartbeat last saw it (shared with the heartbeat:
    /// `oncely_sqlx` checks it before every outside call a transactional handler makes).
    pub fn lease_watch(&self) -> &LeaseWatch {
        &self.lease_watch
    }
}

/// What a handler tells the layer about its response, by inserting this into the **response**
/// extensions (in axum: `(Extension(HandlerOutcome::NotExecuted), response)`).
///
/// Without it, the layer stores the response when the policy's
/// [`StorePolicy`](oncely_core::StorePolicy) says so, and releases the key otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerOutcome {
    /// The handler completed the record itself, inside its own database transaction
    /// (transactional mode, with [`stored_response`](crate::stored_response) and its
    /// context's token). The layer returns the response and writes nothing.
    AlreadyStored,
    /// Nothing executed: validation rejected the request before any effect, or the transaction
    /// rolled back. The layer returns the response **without** storing it and releases the key,
    /// so the client may correct the request and retry with the same key (as Stripe does for
    /// invalid parameters).
    NotExecuted,
    /// The handler stopped part-way, at its last committed recovery point (an outside system
    /// failed or timed out, so the outcome of the next step is unknown). The layer returns the
    /// response without storing it and keeps the record **in flight** with its recovery point,
    /// but cuts its lease short (to 1 millisecond), so that the client's next retry (or the
    /// completer) takes the key over at once and resumes where this attempt stopped. Releasing
    /// the key instead would lose the recovery point and could repeat an outside call.
    Suspended,
}

#[cfg(feature = "axum")]
mod extract {
    use super::IdempotencyContext;
    use crate::problem::problem_response;
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::request::Parts;
    use oncely_core::{ErrorCode, Problem};
    use std::convert::Infallible;

    /// The rejection of the [`IdempotencyContext`] extractor: the request carries no claim,
    /// because the route is not behind an `IdempotencyLayer`, or the route's key is optional or
    /// ignored and none was used. Renders `500` with an `idempotency_layer_missing` problem (a
    /// server misconfiguration). Use `Option<IdempotencyContext>` on routes where a key is
    /// optional.
    #[derive(Debug, Clone, Copy, Default)]
    #[non_exhaustive]
    pub struct MissingIdempotencyContext;

    impl std::fmt::Display for MissingIdempotencyContext {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("no IdempotencyContext: the route is not behind an IdempotencyLayer, or it ran without a claim")
        }
    }

    impl std::error::Error for MissingIdempotencyContext {}

    impl IntoResponse for MissingIdempotencyContext {
        fn into_response(self) -> Response {
            let p = Problem::from_code(
                ErrorCode::LayerMissing,
                "This route needs an idempotency claim, but the request carries none (server misconfiguration).",
            );
            problem_response(&p, None).into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for IdempotencyContext {
        type Rejection = MissingIdempotencyContext;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<IdempotencyContext>()
                .cloned()
                .ok_or(MissingIdempotencyContext)
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyContext {
        type Rejection = Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<IdempotencyContext>().cloned())
        }
    }
}

#[cfg(feature = "axum")]
pub use extract::MissingIdempotencyContext;
