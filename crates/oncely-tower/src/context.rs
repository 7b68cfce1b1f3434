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
//!     // A multi-step request records each committed step (and resumes from it on a
//!     // takeover).
//!     if ctx.resume_from::<String>().ok().flatten().as_deref() != Some("charged") {
//!         // Every outside call through the context: it checks the claim first, and a
//!         // graceful shutdown waits for it.
//!         ctx.call(|| async { /* the card processor, with a key derived from ours */ })
//!             .await
//!             .expect("still the owner");
//!         ctx.checkpoint(&"charged").await.expect("still the owner");
//!     }
//!     (StatusCode::CREATED, "paid").into_response()
//! }
//! # let _ = axum::Router::<()>::new().route("/", axum::routing::post(create_payment));
//! ```

use crate::claim::ClaimState;
use oncely_core::{ClaimKind, FencingToken, RecordKey, StoreError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::sync::Arc;

/// The claim a request holds: the handle a non-transactional handler works with, inserted by
/// the layer into the request extensions of every claimed request (extract it in axum as an
/// argument, or read it from `req.extensions()` in any tower service). Cloning is cheap and
/// shares the claim.
///
/// It is absent on requests that pass through without a claim (ignored routes, and optional
/// routes called without a key).
///
/// # One phase API
///
/// A multi-step request records each committed step with [`IdempotencyContext::checkpoint`]
/// (a typed step, serialized as JSON), and a request that took the key over after a crash reads
/// the last one back with [`IdempotencyContext::resume_from`]. Before every call to a system
/// outside the key store it asks [`IdempotencyContext::ensure_lease`]. Its response is then
/// stored by the layer (or the key released, by the store policy or [`HandlerOutcome`]). A
/// transactional handler (`oncely_sqlx::Tx`) has the same API on its transaction.
#[derive(Clone)]
pub struct IdempotencyContext {
    claim: Arc<ClaimState>,
}

impl fmt::Debug for IdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.claim, f)
    }
}

/// Why a step could not be recorded or read ([`IdempotencyContext::checkpoint`],
/// [`IdempotencyContext::resume_from`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The store refused or failed: [`StoreError::Fenced`] when this request lost its claim
    /// (another request took the key over: stop, it owns the work now),
    /// [`StoreError::Unavailable`] when the store cannot be reached.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The step does not serialize, or the stored one does not decode as the handler's type.
    #[error("recovery point: {0}")]
    Step(#[from] serde_json::Error),
}

impl IdempotencyContext {
    pub(crate) fn new(claim: Arc<ClaimState>) -> Self {
        Self { claim }
    }

    /// `(scope, key)`.
    pub fn id(&self) -> &RecordKey {
        self.claim.id()
    }

    /// The fencing token of this claim; every write to the record carries it.
    pub fn token(&self) -> FencingToken {
        self.claim.token()
    }

    /// Why the claim was granted: a first attempt, a takeover of a lapsed lease (resume from
    /// [`IdempotencyContext::resume_from`]), or a reuse after the replay window (a brand-new
    /// request).
    pub fn kind(&self) -> ClaimKind {
        self.claim.kind()
    }

    /// The last committed step, as stored (a JSON document for steps recorded through this
    /// API); `None` on a first attempt.
    pub fn recovery_point(&self) -> Option<String> {
        self.claim.recovery_point()
    }

    /// The last committed step, decoded as `T` (the handler's own step type, usually a serde
    /// enum); `None` on a first attempt.
    ///
    /// # Errors
    ///
    /// [`StepError::Step`] when the stored step does not decode as `T`.
    pub fn resume_from<T: DeserializeOwned>(&self) -> Result<Option<T>, StepError> {
        self.claim
            .recovery_point()
            .map(|rp| serde_json::from_str(&rp))
            .transpose()
            .map_err(Into::into)
    }

    /// Records that `step` committed (serialized as JSON) and extends the lease. A retry that
    /// takes the key over after a crash reads it back with
    /// [`IdempotencyContext::resume_from`] and resumes after that step.
    ///
    /// # Errors
    ///
    /// [`StepError::Store`] with [`StoreError::Fenced`] when this request lost its claim (its
    /// lease lapsed and another request took the key over): stop, the other request owns the
    /// work now; with [`StoreError::Unavailable`] when the store cannot be reached.
    /// [`StepError::Step`] when `step` does not serialize.
    pub async fn checkpoint<T: Serialize>(&self, step: &T) -> Result<(), StepError> {
        let rp = serde_json::to_string(step)?;
        let c = &self.claim;
        c.store()
            .checkpoint(c.id(), c.token(), &rp, c.lease())
            .await?;
        c.phase_committed(Some(rp));
        Ok(())
    }

    /// Makes one call to a system outside the key store (a card processor, a mailer) as this
    /// request, with no database transaction of the request open: checks that the request
    /// still holds its claim (as [`IdempotencyContext::ensure_lease`]), then runs `call` and
    /// returns its output. A graceful shutdown of the server never suspends the request while
    /// `call` runs ([`Drain::abandon`](crate::Drain::abandon) waits for it, keeping its lease,
    /// and past its bound leaves the lease to lapse rather than hand the key over while the
    /// call may still land). Derive the key the call carries from ours, so that a system that
    /// honours keys collapses a repeat.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyContext::ensure_lease`]; `call` is then not made.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        self.claim.outside_call(call).await
    }

    /// Makes sure this request still holds its claim before an outside call (see
    /// [`ClaimState::ensure_held`]): call it right before every call to a system outside the
    /// key store (a card processor, a mailer), with no database transaction of the request
    /// open. It answers at once while the heartbeat keeps the lease; if the heartbeat fell
    /// behind (a blocked runtime thread, a slow or failing store), it renews the lease first.
    /// A graceful shutdown cannot see a call made after this check, and may hand the key over
    /// while it runs: prefer [`IdempotencyContext::call`], which it waits for.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when another request took the key over (its lease lapsed): make
    /// no outside call and stop; the other request owns the work now. [`StoreError::Unavailable`]
    /// when the lease may have lapsed and the store did not answer a renewal in time, or the
    /// server is shutting down: stop too, and answer with a retryable error (the record stays
    /// in flight at its recovery point, and a retry resumes it).
    pub async fn ensure_lease(&self) -> Result<(), StoreError> {
        self.claim.ensure_held().await
    }

    /// The claim's state as the layer tracks it (its lease and progress). Transactional
    /// claimers (`oncely-sqlx`) report their phases' commits to it.
    pub fn claim(&self) -> &Arc<ClaimState> {
        &self.claim
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
            problem_response(&p).into_response()
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
