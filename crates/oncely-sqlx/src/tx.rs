//! [`Tx`]: the handler's transaction that already holds its claim, and [`Between`]: a
//! multi-step request between two phases.

use crate::error::{PhaseFailed, TxError, stopped_answer};
use crate::store::SqlStore;
use axum::response::{IntoResponse, Response};
use oncely_core::{ClaimKind, FencingToken, RecordKey, StoreError};
use oncely_tower::LeaseWatch;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::{Database, Transaction};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the claimer, the handler's [`Tx`] and the layer share about one claimed request.
pub(crate) struct Shared<S: SqlStore> {
    pub(crate) store: S,
    pub(crate) id: RecordKey,
    pub(crate) token: FencingToken,
    pub(crate) kind: ClaimKind,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) max_response_bytes: usize,
    pub(crate) state: Mutex<State>,
    /// The first phase's transaction (it holds the claim) until the handler takes it.
    pub(crate) first: Mutex<Option<Transaction<'static, S::Database>>>,
    /// What to run when the claim first commits (the layer's heartbeat start).
    pub(crate) on_commit: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The rollback of a phase the handler dropped unfinished, running on a task of its own:
    /// whether that transaction had ended behind the phase's back
    /// ([`SqlStore::rollback_abandoned`]).
    pub(crate) abandoned: Mutex<Option<tokio::task::JoinHandle<bool>>>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) committed: bool,
    pub(crate) completed: bool,
    pub(crate) recovery_point: Option<String>,
    /// The request the claim left out (an atomic store's claimer defers it), until a
    /// checkpoint commits it.
    pub(crate) deferred_request: Option<oncely_core::StoredRequest>,
    /// A phase the handler dropped had been ended by the handler itself (`COMMIT` or
    /// `ROLLBACK` through its `Tx`).
    pub(crate) ended_behind: bool,
}

impl<S: SqlStore> Shared<S> {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the flags half-written (each update is
        // one assignment), so a poisoned lock is still sound to read.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<S: SqlStore> oncely_tower::ClaimProgress for Shared<S> {
    fn committed(&self) -> bool {
        self.state().committed
    }
    fn completed(&self) -> bool {
        self.state().completed
    }
    fn recovery_point(&self) -> Option<String> {
        self.state().recovery_point.clone()
    }
    /// A [`TxError`] answer (it says nothing of its step committed) of a request that has a
    /// committed recovery point becomes "stopped there, retry resumes" (see
    /// [`TxError`]'s docs, "After an earlier phase committed").
    fn unfinished_answer(
        &self,
        extensions: &http::Extensions,
    ) -> Option<(oncely_core::Problem, Option<u64>)> {
        let state = self.state();
        if state.completed {
            return None;
        }
        if state.ended_behind {
            return Some((crate::error::ended_problem(), None));
        }
        let failed = *extensions.get::<PhaseFailed>()?;
        Some(stopped_answer(failed, state.recovery_point.as_deref()?))
    }
    /// Waits for the rollback of a phase the handler dropped, and notes (and logs) a
    /// transaction the handler had ended itself.
    fn settle(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        let handle = self
            .abandoned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        Box::pin(async move {
            let Some(handle) = handle else { return };
            if handle.await.unwrap_or(false) {
                log_ended(self);
                self.state().ended_behind = true;
            }
        })
    }
    fn on_first_commit(&self, start: Box<dyn FnOnce() + Send>) {
        if self.state().committed {
            start();
        } else {
            *self.on_commit.lock().unwrap_or_else(|p| p.into_inner()) = Some(start);
        }
    }
}

impl<S: SqlStore> Shared<S> {
    /// Marks the claim committed (with `recovery_point`, if given) and runs the waiting
    /// heartbeat start, outside the state lock.
    fn committed_with(&self, recovery_point: Option<String>) {
        {
            let mut state = self.state();
            state.committed = true;
            if recovery_point.is_some() {
                state.recovery_point = recovery_point;
            }
        }
        let start = self
            .on_commit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(start) = start {
            start();
        }
    }
}

/// The request extension through which the claimer hands the first phase to the handler.
pub(crate) struct TxSlot<S: SqlStore>(pub(crate) Arc<Shared<S>>);

impl<S: SqlStore> Clone for TxSlot<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// One atomic phase of an idempotent request: an open database transaction that already holds
/// the request's claim (or, in a later phase, began with the conditional fencing write).
///
/// Use it as an executor for the business writes (`&mut *tx` is a `&mut PgConnection` or
/// `&mut SqliteConnection`), then end it with exactly one of:
///
/// - [`Tx::commit`]: the business writes and the stored response commit together; the
///   response is returned for the handler to send, and it is byte for byte what every retry
///   replays (case S8: a crash after the commit leaves a record that replays);
/// - [`Tx::checkpoint`]: the business writes and a typed recovery point commit together (a
///   phase of a multi-step request, before an outside call);
/// - dropping it (or an error with `?`): everything rolls back. In the first phase of a new
///   request that includes the claim, so the key is free again and a retry executes afresh;
///   after a committed phase, the layer keeps the record at its recovery point for the retry.
///
/// Never run `COMMIT` or `ROLLBACK` through it: the phase would no longer be one unit.
/// [`Tx::commit`] and [`Tx::checkpoint`] refuse to record anything on a transaction that ended
/// early ([`TxError::TransactionEnded`]; on PostgreSQL a `COMMIT` is not checked at the
/// commit of the transaction that carries the claim), and a `Tx` dropped after its handler
/// ended it gets the same `500 idempotency_handler_misuse` answer instead of the handler's
/// (the layer learns it from the rollback: at no extra hop on SQLite, one round trip on
/// PostgreSQL, on that path only). Nested `sqlx` transactions (savepoints) are fine.
///
/// In axum, take it as a handler argument (it is an extractor); in plain tower, with
/// [`Tx::from_extensions`].
pub struct Tx<S: SqlStore> {
    tx: Option<Transaction<'static, S::Database>>,
    shared: Arc<Shared<S>>,
    /// Whether this is the transaction that carries the claim (not one of
    /// [`Between::begin`]).
    first: bool,
    /// The claim's lease as the layer's heartbeat last saw it.
    lease: Option<LeaseWatch>,
    /// When this phase's transaction began (for the warning about phases held open long).
    opened: Instant,
}

impl<S: SqlStore> fmt::Debug for Tx<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("id", &self.shared.id)
            .field("token", &self.shared.token)
            .field("kind", &self.shared.kind)
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
        // layer waits for it before answering (`ClaimProgress::settle`), so that a handler
        // that had ended the transaction itself is not answered "nothing committed".
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (store, id) = (self.shared.store.clone(), self.shared.id.clone());
                let handle = runtime.spawn(async move { store.rollback_abandoned(tx, &id).await });
                *self
                    .shared
                    .abandoned
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(handle);
            }
            // No runtime: sqlx rolls back on drop, unchecked.
            Err(_) => drop(tx),
        }
        warn_if_long(&self.shared, self.opened);
    }
}

impl<S: SqlStore> Tx<S> {
    /// Takes the first phase from a claimed request's extensions (plain tower; in axum, use
    /// `Tx<S>` as an extractor).
    ///
    /// # Errors
    ///
    /// [`TxError::NoTransaction`] when the request was not claimed by [`layer`](crate::layer)
    /// for this store type, or its transaction was taken already.
    pub fn from_extensions(extensions: &http::Extensions) -> Result<Self, TxError> {
        let slot = extensions
            .get::<TxSlot<S>>()
            .ok_or(TxError::NoTransaction)?;
        let tx = slot
            .0
            .first
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(TxError::AlreadyTaken)?;
        // The layer's view of the claim's lease, checked before outside calls (absent only
        // where no layer claimed, as in the server's baseline mode).
        let lease = extensions
            .get::<oncely_tower::IdempotencyContext>()
            .map(|ctx| ctx.lease_watch().clone());
        Ok(Self {
            tx: Some(tx),
            shared: Arc::clone(&slot.0),
            first: true,
            lease,
            opened: Instant::now(),
        })
    }

    /// `(scope, key)` of the request.
    pub fn id(&self) -> &RecordKey {
        &self.shared.id
    }

    /// Why the claim was granted: a first attempt ([`ClaimKind::New`]), a reuse after the replay
    /// window, or a takeover of a request whose owner died ([`ClaimKind::Takeover`]): resume
    /// from [`Tx::resume_from`].
    pub fn kind(&self) -> ClaimKind {
        self.shared.kind
    }

    /// The last step a previous attempt of this request committed with [`Tx::checkpoint`],
    /// decoded as `T` (the handler's own step type, usually a serde enum); `None` on a first
    /// attempt.
    ///
    /// # Errors
    ///
    /// [`TxError::RecoveryPoint`] when the stored point does not decode as `T`.
    pub fn resume_from<T: DeserializeOwned>(&self) -> Result<Option<T>, TxError> {
        decode_step(self.shared.state().recovery_point.as_deref())
    }

    fn take(&mut self) -> Transaction<'static, S::Database> {
        self.tx
            .take()
            .expect("a Tx holds its transaction until it ends")
    }

    /// Completes the request: stores `response` exactly as it will be sent (status, the
    /// headers that pass the replay filter, the body up to the policy's
    /// `max_response_bytes`; a larger body is sent but not retained, see
    /// [`oncely_tower::capture`]) in this transaction, and commits it together with the
    /// business writes. Returns the response to send.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`] when the record is no longer this request's (nothing commits);
    /// [`TxError::Store`] or [`TxError::Database`] when the write or the commit failed
    /// (nothing commits, unless the connection was lost during the commit itself: then the
    /// outcome is known only to the next claim, which replays or executes).
    pub async fn commit(self, response: impl IntoResponse) -> Result<Response, TxError> {
        self.finish(None, response).await
    }

    /// [`Tx::commit`] for a phase that creates something the retry must not create again
    /// (a row whose id this attempt minted): `step` names it. On the transactional stores this
    /// is exactly [`Tx::commit`] (one commit; `step` is not written, the response is). On a
    /// [`Split`](crate::Split) store, whose response cannot commit with the writes, `step` is
    /// recorded first as the intent, so a crash between the business commit and the stored
    /// response resumes with the same id.
    ///
    /// # Errors
    ///
    /// As [`Tx::commit`], and [`TxError::RecoveryPoint`] when `step` does not serialize.
    pub async fn commit_as<T: Serialize>(
        self,
        step: &T,
        response: impl IntoResponse,
    ) -> Result<Response, TxError> {
        self.finish(Some(serde_json::to_string(step)?), response)
            .await
    }

    async fn finish(
        mut self,
        intent: Option<String>,
        response: impl IntoResponse,
    ) -> Result<Response, TxError> {
        let response = response.into_response().map(|b| {
            use http_body_util::BodyExt;
            oncely_tower::Body::new(b.map_err(Into::into))
        });
        let (response, stored, failed) =
            oncely_tower::capture_response(response, self.shared.max_response_bytes).await;
        if failed {
            // The response body broke while it was produced: nothing commits (the writes roll
            // back with the dropped transaction), rather than a truncated answer presented as
            // the result.
            return Err(TxError::ResponseFailed);
        }
        let mut tx = self.take();
        let sh = Arc::clone(&self.shared);
        let hot = self.first;
        warn_if_long(&sh, self.opened);
        ensure_open(&sh, &mut tx, hot).await?;
        // Whether a split store recorded the intent (then it is the recovery point, whatever
        // happens next).
        let mut recorded = false;
        let result = if sh.store.atomic() {
            match sh
                .store
                .complete_in(&mut tx, &sh.id, sh.token, &stored, sh.retention)
                .await
            {
                Ok(()) => tx.commit().await.map_err(TxError::from),
                // Fenced on the hot path, where the guard was not asked (PostgreSQL): the
                // usual cause is a takeover, but a handler's own `ROLLBACK` (the claim undone)
                // looks the same; telling them apart costs a statement only on this rare path.
                Err(StoreError::Fenced) if hot => match ensure_open(&sh, &mut tx, false).await {
                    Ok(()) => Err(TxError::Fenced),
                    Err(e) => Err(e),
                },
                Err(e) => Err(ended_or(&sh, e)),
            }
        } else {
            // A split store: the intent, the business commit, then the stored response.
            split_finish(&sh, tx, intent.as_deref(), &stored, &mut recorded).await
        };
        let mut state = sh.state();
        if let Some(rp) = intent.filter(|_| recorded) {
            state.recovery_point = Some(rp);
        }
        result?;
        state.committed = true;
        state.completed = true;
        drop(state);
        Ok(response.map(axum::body::Body::new))
    }

    /// Commits this phase with `step` as its recovery point (serialized as JSON): a retry that
    /// takes the request over after a crash gets it back from [`Tx::resume_from`] and goes on
    /// from there. Call it before every outside call; the call itself then carries an
    /// idempotency key derived from ours (see [`derived_key`](crate::derived_key)). Returns the
    /// handle that begins the next phase.
    ///
    /// # Errors
    ///
    /// As [`Tx::commit`], and [`TxError::RecoveryPoint`] when `step` does not serialize.
    pub async fn checkpoint<T: Serialize>(mut self, step: &T) -> Result<Between<S>, TxError> {
        let rp = serde_json::to_string(step)?;
        let mut tx = self.take();
        let sh = &self.shared;
        warn_if_long(sh, self.opened);
        ensure_open(sh, &mut tx, false).await?;
        let request = sh
            .state()
            .deferred_request
            .as_ref()
            .map(oncely_core::StoredRequest::encode);
        if let Err(e) = sh
            .store
            .checkpoint_in(&mut tx, &sh.id, sh.token, &rp, sh.lease, request.as_deref())
            .await
        {
            return Err(ended_or(sh, e));
        }
        tx.commit().await?;
        sh.state().deferred_request = None;
        sh.committed_with(Some(rp));
        Ok(Between {
            shared: Arc::clone(&self.shared),
            lease: self.lease.clone(),
        })
    }
}

/// The error of a phase's write: [`TxError::TransactionEnded`] (logged) when the store's
/// write found the transaction ended behind the phase's back ([`SqlStore::ended_behind`]);
/// [`TxError::Database`] with the database's error (logged) when an earlier statement of the
/// handler failed and aborted the transaction, its error ignored (PostgreSQL's SQLSTATE
/// `25P02`, "current transaction is aborted"): the handler's failure, not the key store's, so
/// it is answered as a failure in the database (`500 database_error`, not retryable), never as
/// a store outage (`503`, retryable). The error that aborted the transaction is gone by then
/// (only the handler's `?` on its statement keeps it, with its own answer: `503` for a
/// transient one, `422` for a refused value), so the answer cannot say whether a retry would
/// succeed.
fn ended_or<S: SqlStore>(sh: &Shared<S>, e: StoreError) -> TxError {
    if sh.store.ended_behind(&e) {
        log_ended(sh);
        return TxError::TransactionEnded;
    }
    match e {
        StoreError::Unavailable(source) if aborted_by_the_handler(&*source) => {
            match source.downcast::<sqlx::Error>() {
                Ok(db) => {
                    tracing::error!(
                        scope = %sh.id.scope,
                        key = %sh.id.key,
                        token = sh.token.0,
                        "a statement of the handler failed and aborted its idempotent transaction, and the handler went on to Tx::commit or Tx::checkpoint: nothing of this phase is recorded; return the statement's error (with `?`) instead of ignoring it"
                    );
                    TxError::Database(*db)
                }
                Err(source) => StoreError::Unavailable(source).into(),
            }
        }
        other => other.into(),
    }
}

/// Whether a store error is PostgreSQL's "current transaction is aborted, commands ignored
/// until end of transaction block" (SQLSTATE `25P02`): the transaction failed before the
/// store's write was sent.
fn aborted_by_the_handler(source: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02")
    )
}

fn log_ended<S: SqlStore>(sh: &Shared<S>) {
    tracing::error!(
        scope = %sh.id.scope,
        key = %sh.id.key,
        token = sh.token.0,
        "the handler ended its idempotent transaction itself (COMMIT or ROLLBACK through the Tx): nothing of this phase is recorded, and the key is not released (writes may have committed outside the phase)"
    );
}

/// Warns about a phase whose transaction was open for more than half the lease: an outside
/// call made inside it holds its connection and locks meanwhile (on SQLite, the write lock that
/// every other writer and this request's lease renewal wait for). See [`Between`].
fn warn_if_long<S: SqlStore>(sh: &Shared<S>, opened: Instant) {
    let open = opened.elapsed();
    if open > sh.lease / 2 {
        tracing::warn!(
            scope = %sh.id.scope,
            key = %sh.id.key,
            open_ms = open.as_millis() as u64,
            lease_ms = sh.lease.as_millis() as u64,
            "a phase's transaction was open for more than half the lease: hold no transaction across an outside call (make it between phases, with Between::call); on SQLite an open phase holds the write lock, so the lease could not be renewed meanwhile"
        );
    }
}

/// Refuses to record anything on a transaction that ended behind the phase's back (see
/// [`SqlStore::still_open`] and [`TxError::TransactionEnded`]).
async fn ensure_open<S: SqlStore>(
    sh: &Shared<S>,
    tx: &mut Transaction<'static, S::Database>,
    hot: bool,
) -> Result<(), TxError> {
    if !sh.store.checks_still_open(hot) {
        return Ok(());
    }
    // The check is itself a statement: in a transaction a failed statement aborted, it fails
    // as the phase's write would (see `ended_or`).
    match sh.store.still_open(tx, &sh.id, hot).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(e) => return Err(ended_or(sh, e)),
    }
    log_ended(sh);
    Err(TxError::TransactionEnded)
}

async fn split_finish<S: SqlStore>(
    sh: &Shared<S>,
    mut tx: Transaction<'static, S::Database>,
    intent: Option<&str>,
    stored: &oncely_core::StoredResponse,
    recorded: &mut bool,
) -> Result<(), TxError> {
    if let Some(rp) = intent {
        sh.store
            .checkpoint_in(&mut tx, &sh.id, sh.token, rp, sh.lease, None)
            .await?;
        *recorded = true;
    }
    tx.commit().await?;
    sh.store
        .complete(&sh.id, sh.token, stored.clone(), sh.retention)
        .await?;
    Ok(())
}

fn decode_step<T: DeserializeOwned>(rp: Option<&str>) -> Result<Option<T>, TxError> {
    rp.map(serde_json::from_str).transpose().map_err(Into::into)
}

/// A multi-step request between two phases, after [`Tx::checkpoint`] committed: make the
/// outside call with [`Between::call`], then [`Between::begin`] the next phase.
///
/// # Outside calls, phases and the lease
///
/// The rule: record the intent, commit, call the outside system with **no transaction open**,
/// record its result in the next phase. That is the shape this type gives a handler:
///
/// ```text
/// let between = tx.checkpoint(&Step::Recorded { .. }).await?;   // phase 1 commits the intent
/// let charge = between.call(|| charge_card(key)).await?;        // no transaction open
/// let mut tx = between.begin().await?;                           // phase 2 records the result
/// ```
///
/// Between phases the request holds no database connection and no lock, and the layer's
/// heartbeat renews its lease (every `Policy::heartbeat`, a third of the lease by default),
/// also while a phase is open, so an outside call may take many times the lease. An outside
/// call made inside a phase (a `Tx` held across it) works, but holds a pooled connection and
/// the phase's locks for the call's whole duration: on SQLite that is the database's one write
/// lock, so no other request (and no renewal of this one's lease) can write meanwhile, and
/// readers see this request's lease lapse. A phase held open for more than half the lease is
/// logged as a warning for that reason.
///
/// Before each outside call, [`Between::call`] makes sure the request still holds its claim:
/// a request whose heartbeat fell behind (a blocked runtime thread, a slow or failing store)
/// may have lost its lease to another request, which then resumes the work from the last
/// recovery point and makes the call itself. A request that lost its claim never makes its
/// next outside call ([`TxError::Fenced`], answered `409 idempotency_request_in_flight`).
pub struct Between<S: SqlStore> {
    shared: Arc<Shared<S>>,
    lease: Option<LeaseWatch>,
}

impl<S: SqlStore> fmt::Debug for Between<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Between")
            .field("id", &self.shared.id)
            .field("token", &self.shared.token)
            .finish_non_exhaustive()
    }
}

impl<S: SqlStore> Between<S> {
    /// `(scope, key)` of the request.
    pub fn id(&self) -> &RecordKey {
        &self.shared.id
    }

    /// Makes one outside call between two phases, with no transaction open: runs `call` once
    /// this request is known to hold its claim (see the [type docs](Between)), and returns
    /// its output. Derive the idempotency key the call carries from ours
    /// ([`derived_key`](crate::derived_key)), so that even a repeated call is collapsed by a
    /// system that honours keys.
    ///
    /// The check answers at once while the layer's heartbeat keeps the lease (no store call);
    /// if the heartbeat fell behind, it renews the lease first (one store call).
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`] when another request took the key over (its lease lapsed): `call`
    /// is not made, and the request must stop (return the error: it answers
    /// `409 idempotency_request_in_flight`). [`TxError::Store`] when the lease may have lapsed
    /// and the store did not answer a renewal in time: `call` is not made either, and the
    /// request is suspended at its recovery point for a retry to resume.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, TxError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        if self.shared.state().completed {
            return Err(TxError::AlreadyCompleted);
        }
        if let Some(lease) = &self.lease {
            lease.ensure_held().await?;
        }
        Ok(call().await)
    }

    /// Begins the next phase: a new transaction, opened by the store's fencing step
    /// ([`SqlStore::open_phase`]: on SQLite and on split stores a conditional renewal of the
    /// lease; on PostgreSQL nothing, so the phase takes no lock on the record), whose closing
    /// write ([`Tx::checkpoint`] or [`Tx::commit`]) carries the fencing token: if another
    /// request took the key over meanwhile, nothing of the phase commits.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`] when this request is known to have lost its claim, or the store's
    /// fencing step found another owner (stop: it owns the work now); [`TxError::Store`] when
    /// the store failed.
    pub async fn begin(&self) -> Result<Tx<S>, TxError> {
        let sh = &self.shared;
        if sh.state().completed {
            return Err(TxError::AlreadyCompleted);
        }
        if self.lease.as_ref().is_some_and(LeaseWatch::is_lost) {
            return Err(TxError::Fenced);
        }
        let mut tx = sh.store.begin().await?;
        sh.store
            .open_phase(&mut tx, &sh.id, sh.token, sh.lease)
            .await?;
        Ok(Tx {
            tx: Some(tx),
            shared: Arc::clone(&self.shared),
            first: false,
            lease: self.lease.clone(),
            opened: Instant::now(),
        })
    }
}

/// The axum extractor.
impl<S: SqlStore, St: Send + Sync> axum::extract::FromRequestParts<St> for Tx<S> {
    type Rejection = TxError;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &St,
    ) -> Result<Self, Self::Rejection> {
        Self::from_extensions(&parts.extensions)
    }
}
