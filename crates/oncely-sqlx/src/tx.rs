//! [`Tx`]: the handler's transaction that already holds its claim, and its [`Tx::commit`].
//! [`Tx::checkpoint`], which commits a phase at a recovery point, is in `checkpoint.rs`.

use crate::phase::{reported, split_finish, warn_if_long};
use crate::shared::{Shared, TxSlot};
use crate::store::SqlStore;
use axum::response::{IntoResponse, Response};
use oncely_core::response::capture_response;
use oncely_core::{ClaimKind, RecordKey};
use oncely_tower::{ClaimState, ResponseCommitted};
use serde::de::DeserializeOwned;
use sqlx::{Database, Transaction};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Instant;

/// One atomic phase of an idempotent request: an open database transaction that already holds
/// the request's claim (or, in a later phase, began with the store's fencing step).
///
/// Use it as an executor for the business writes (`&mut *tx` is a `&mut PgConnection` or
/// `&mut SqliteConnection`), then end it with exactly one of:
///
/// - [`Tx::commit`]: the business writes and the stored response commit together; the
///   response is returned for the handler to send, and it is byte for byte what every retry
///   replays (a crash after the commit leaves a record that replays);
/// - [`Tx::checkpoint`]: the business writes and a typed recovery point commit together (a
///   phase of a multi-step request, before an outside call);
/// - dropping it (or an error with `?`): everything rolls back. In the first phase of a new
///   request that includes the claim, so the key is free again and a retry executes afresh;
///   after a committed phase, the layer keeps the record at its recovery point for the retry.
///
/// Never run `COMMIT` or `ROLLBACK` through it: the phase would no longer be one unit.
/// [`Tx::commit`] and [`Tx::checkpoint`] refuse to record anything on a transaction that ended
/// early ([`TxError::TransactionEnded`](crate::TxError::TransactionEnded); on PostgreSQL and
/// MySQL a `COMMIT` is not checked at the commit of the transaction that carries the claim),
/// and a `Tx` dropped after its handler ended it gets the same `500 idempotency_handler_misuse`
/// answer instead of the handler's (the layer learns it from the rollback: at no extra hop on
/// SQLite, one round trip on PostgreSQL, up to two on MySQL, on that path only; a transaction
/// that MySQL rolled back as a deadlock's victim is not taken for one the handler ended). Nested `sqlx` transactions
/// (savepoints) are fine.
///
/// In axum, take it as a handler argument (it is an extractor); in plain tower, with
/// [`Tx::from_extensions`].
pub struct Tx<S: SqlStore> {
    tx: Option<Transaction<'static, S::Database>>,
    pub(crate) shared: Arc<Shared<S>>,
    /// The claim as the layer tracks it (absent where no layer claimed, as in a benchmark's
    /// baseline run without idempotency).
    pub(crate) claim: Option<Arc<ClaimState>>,
    /// Whether this is the transaction that carries the claim (not one of
    /// [`Between::begin`](crate::Between::begin)).
    first: bool,
    /// When this phase's transaction began (for the warning about phases held open long).
    pub(crate) opened: Instant,
}

impl<S: SqlStore> fmt::Debug for Tx<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("id", &self.shared.id)
            .field("token", &self.shared.token)
            .field("kind", &self.kind())
            .finish_non_exhaustive()
    }
}

impl<S: SqlStore> Deref for Tx<S> {
    type Target = <S::Database as Database>::Connection;
    fn deref(&self) -> &Self::Target {
        self.tx
            .as_ref()
            .expect("a Tx holds its transaction until it ends")
    }
}

impl<S: SqlStore> DerefMut for Tx<S> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.tx
            .as_mut()
            .expect("a Tx holds its transaction until it ends")
    }
}

impl<S: SqlStore> Drop for Tx<S> {
    fn drop(&mut self) {
        let Some(tx) = self.tx.take() else { return };
        // Rolled back at once, on a task of its own (the record is as last committed); the
        // layer waits for it before answering, so that a handler that had ended the
        // transaction itself is not answered "nothing committed".
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (store, id) = (self.shared.store.clone(), self.shared.id.clone());
                let handle = runtime.spawn(async move { store.rollback_abandoned(tx, &id).await });
                if let Some(claim) = &self.claim {
                    claim.rollback_started(handle);
                }
            }
            // No runtime: sqlx rolls back on drop, unchecked.
            Err(_) => drop(tx),
        }
        warn_if_long(&self.shared, self.opened);
    }
}

impl<S: SqlStore> Tx<S> {
    /// A phase on `tx`.
    pub(crate) fn new(
        tx: Transaction<'static, S::Database>,
        shared: Arc<Shared<S>>,
        claim: Option<Arc<ClaimState>>,
        first: bool,
    ) -> Self {
        Self {
            tx: Some(tx),
            shared,
            claim,
            first,
            opened: Instant::now(),
        }
    }

    /// Takes the first phase from a claimed request's extensions (plain tower; in axum, use
    /// `Tx<S>` as an extractor).
    ///
    /// # Errors
    ///
    /// [`TxError::NoTransaction`](crate::TxError::NoTransaction) when the request was not
    /// claimed by [`layer`](crate::layer) for this store type;
    /// [`TxError::AlreadyTaken`](crate::TxError::AlreadyTaken) when its transaction was taken
    /// already.
    pub fn from_extensions(extensions: &http::Extensions) -> Result<Self, crate::TxError> {
        let slot = extensions
            .get::<TxSlot<S>>()
            .ok_or(crate::TxError::NoTransaction)?;
        let tx = slot
            .0
            .first
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(crate::TxError::AlreadyTaken)?;
        let claim = extensions
            .get::<oncely_tower::IdempotencyContext>()
            .map(|ctx| Arc::clone(ctx.claim()));
        Ok(Self::new(tx, Arc::clone(&slot.0), claim, true))
    }

    /// `(scope, key)` of the request.
    pub fn id(&self) -> &RecordKey {
        &self.shared.id
    }

    /// Why the claim was granted: a first attempt ([`ClaimKind::New`]), a reuse after the replay
    /// window, or a takeover of a request whose owner died ([`ClaimKind::Takeover`]): resume
    /// from [`Tx::resume_from`].
    pub fn kind(&self) -> ClaimKind {
        self.claim.as_ref().map_or(ClaimKind::New, |c| c.kind())
    }

    /// The last step a previous attempt of this request committed with [`Tx::checkpoint`],
    /// decoded as `T` (the handler's own step type, usually a serde enum); `None` on a first
    /// attempt.
    ///
    /// # Errors
    ///
    /// [`TxError::RecoveryPoint`](crate::TxError::RecoveryPoint) when the stored point does not
    /// decode as `T`.
    pub fn resume_from<T: DeserializeOwned>(&self) -> Result<Option<T>, crate::TxError> {
        let rp = self.claim.as_ref().and_then(|c| c.recovery_point());
        rp.map(|rp| serde_json::from_str(&rp))
            .transpose()
            .map_err(Into::into)
    }

    pub(crate) fn take(&mut self) -> Transaction<'static, S::Database> {
        self.tx
            .take()
            .expect("a Tx holds its transaction until it ends")
    }

    /// Completes the request: stores `response` exactly as it will be sent (status, the
    /// headers that pass the replay filter, the body up to the policy's
    /// `max_response_bytes`; a larger body is sent but not retained, see
    /// [`oncely_core::response`]) in this transaction, and commits it together with the
    /// business writes. Returns the response to send: return it from the handler (the layer
    /// checks that it is the committed one, and sends the committed one if not).
    ///
    /// What is committed is judged like what is returned
    /// ([`StorePolicy::keeps_commit`](oncely_core::StorePolicy::keeps_commit)): a `5xx`, `408`,
    /// `409`, `425` or `429` response says the request did not complete, so it is **not**
    /// committed: this phase rolls back, the response is returned unstored, and the layer
    /// releases the key (or suspends the request at its last recovery point), so that a retry
    /// runs again rather than replaying "come back later" for the whole replay window.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`](crate::TxError::Fenced) when the record is no longer this request's
    /// (nothing commits); [`TxError::Store`](crate::TxError::Store) or
    /// [`TxError::Database`](crate::TxError::Database) when the write or the commit failed
    /// (nothing commits, unless the connection was lost during the commit itself: then the
    /// outcome is known only to the next claim, which replays or executes);
    /// [`TxError::ResponseFailed`](crate::TxError::ResponseFailed) when the response body broke
    /// while it was read (nothing commits).
    pub async fn commit(self, response: impl IntoResponse) -> Result<Response, crate::TxError> {
        self.finish(response).await
    }

    async fn finish(mut self, response: impl IntoResponse) -> Result<Response, crate::TxError> {
        let response = response.into_response().map(|b| {
            use http_body_util::BodyExt;
            oncely_core::response::Body::new(b.map_err(Into::into))
        });
        let limit = self
            .claim
            .as_ref()
            .map_or(usize::MAX, |c| c.max_response_bytes());
        let (mut response, stored, failed) = capture_response(response, limit).await;
        if failed {
            // The response body broke while it was produced: nothing commits (the writes roll
            // back with the dropped transaction), rather than a truncated answer presented as
            // the result.
            return Err(crate::TxError::ResponseFailed);
        }
        let tx = self.take();
        let sh = Arc::clone(&self.shared);
        warn_if_long(&sh, self.opened);
        let Some(claim) = self.claim.clone() else {
            // No claim (a run without idempotency): the business writes commit alone.
            sh.store.commit(tx).await?;
            return Ok(response.map(axum::body::Body::new));
        };
        if !claim.keeps(response.status(), response.headers(), &stored.trailers) {
            // Not a result to keep: nothing of this phase commits, and the layer ends the
            // claim as for a phase that failed.
            let _ = tx.rollback().await;
            return Ok(response.map(axum::body::Body::new));
        }
        let result = if sh.store.atomic() {
            sh.store
                .complete_and_commit(tx, &sh.id, sh.token, &stored, sh.retention, self.first)
                .await
                .map_err(|e| reported(&sh, e))
        } else {
            // A split store: the response into its progress ledger with the business writes,
            // the business commit, then the stored response in the key store.
            split_finish(&sh, tx, &stored).await
        };
        result?;
        claim.response_committed(Arc::new(stored));
        response
            .extensions_mut()
            .insert(ResponseCommitted::default());
        Ok(response.map(axum::body::Body::new))
    }
    // `Tx::checkpoint`, which ends a phase into a `Between`, is in `checkpoint.rs`.
}

/// The axum extractor.
impl<S: SqlStore, St: Send + Sync> axum::extract::FromRequestParts<St> for Tx<S> {
    type Rejection = crate::TxError;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &St,
    ) -> Result<Self, Self::Rejection> {
        Self::from_extensions(&parts.extensions)
    }
}
