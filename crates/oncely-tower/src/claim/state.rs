//! [`ClaimState`]: what the layer knows of one claim while the handler runs (its lease, its
//! progress, its heartbeat), shared with the handler.

use super::heartbeat::Heartbeat;
use crate::claimer::ClaimerKind;
use crate::config::Config;
use crate::lease::LeaseBook;
use crate::local_claims::Hold;
use http::{HeaderMap, StatusCode};
use oncely_core::{
    ClaimKind, FencingToken, KeyStore, RecordKey, StoreError, StoredResponse, UnixMillis,
};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::JoinHandle;

/// One claimed request's claim as the layer tracks it, shared by the layer, its heartbeat and
/// the handler (through [`IdempotencyContext::claim`](crate::IdempotencyContext::claim)).
///
/// # The lease
///
/// A live request keeps its lease whatever it is doing: the heartbeat renews it every
/// `Policy::heartbeat` from the moment the claim is committed until the request ends, also while
/// one of its phases has a transaction open. But a heartbeat can fall behind: the runtime
/// thread it needs is blocked by synchronous work, the store answers renewals slowly or not at
/// all. Then the lease may lapse, and another request may take the key over and resume the
/// work. A request in that state must not make its next outside call (a charge, an e-mail): the
/// other request will make it. So before every outside call the handler asks
/// [`ClaimState::ensure_held`], which answers at once from what the heartbeat last learned when
/// the lease is known to be held for a while yet, and otherwise renews the lease itself (one
/// store call) before saying yes. A renewal that is fenced means another request owns the key:
/// the state remembers it, and every later question is answered [`StoreError::Fenced`] without
/// asking the store.
pub struct ClaimState {
    config: Arc<Config>,
    book: Arc<LeaseBook>,
    kind: ClaimKind,
    claimer: ClaimerKind,
    /// Whether the claim is committed in the store (for a claim that rides in the handler's
    /// first transaction, not before that transaction commits: until then no other request can
    /// see the key, and the store could not renew it).
    committed: AtomicBool,
    progress: Mutex<Progress>,
    /// The rollback of a phase the handler dropped unfinished, running on a task of its own:
    /// whether that transaction had ended behind the phase's back.
    rollback: Mutex<Option<JoinHandle<bool>>>,
    heartbeat: Mutex<Option<Heartbeat>>,
    /// The key's turn in this process ([`crate::local_claims`]), passed on at the first commit.
    hold: Mutex<Option<Hold>>,
}

#[derive(Default)]
struct Progress {
    recovery_point: Option<String>,
    /// The response a transaction committed as the record's.
    committed_response: Option<Arc<StoredResponse>>,
}

impl fmt::Debug for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimState")
            .field("id", self.id())
            .field("token", &self.token())
            .field("kind", &self.kind)
            .field("committed", &self.is_committed())
            .field("completed", &self.is_completed())
            .field("held_until", &self.held_until())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is one assignment: a panic cannot leave them half-written.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ClaimState {
    /// The state of `claim`, whose claim call was sent at `sent` (epoch milliseconds of the
    /// layer's clock).
    pub(crate) fn new(
        config: Arc<Config>,
        id: RecordKey,
        claim: &oncely_core::Claim,
        sent: UnixMillis,
        hold: Option<Hold>,
    ) -> Arc<Self> {
        let claimer = config.claimer.kind();
        let lease = oncely_core::clock::duration_millis(config.policy.lease);
        let committed = !matches!(
            claimer,
            ClaimerKind::Transactional {
                claim_in_transaction: true
            }
        );
        let state = Arc::new(Self {
            config,
            book: Arc::new(LeaseBook::new(id, claim.token, sent.saturating_add(lease))),
            kind: claim.kind,
            claimer,
            committed: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                recovery_point: claim.recovery_point.clone(),
                committed_response: None,
            }),
            rollback: Mutex::new(None),
            heartbeat: Mutex::new(None),
            hold: Mutex::new(hold),
        });
        if committed {
            state.on_commit();
        }
        state
    }

    /// `(scope, key)` of the claim.
    pub fn id(&self) -> &RecordKey {
        &self.book.id
    }

    /// The claim's fencing token.
    pub fn token(&self) -> FencingToken {
        self.book.token
    }

    /// Why the claim was granted: a first attempt, a takeover of a lapsed lease, or a reuse
    /// after the replay window.
    pub fn kind(&self) -> ClaimKind {
        self.kind
    }

    /// The policy's lease (e.g. 30 seconds).
    pub fn lease(&self) -> Duration {
        self.config.policy.lease
    }

    /// How long the record is kept after completion (the policy's retention, e.g. 72 hours).
    pub fn retention(&self) -> Duration {
        self.config.policy.retention
    }

    /// The store the record is in.
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.config.store
    }

    /// The largest response body stored for replay, in bytes (the policy's
    /// `max_response_bytes`).
    pub fn max_response_bytes(&self) -> usize {
        self.config.policy.max_response_bytes
    }

    /// The last committed recovery point: the one the claim resumed from, or the last one
    /// a phase of this request committed since.
    pub fn recovery_point(&self) -> Option<String> {
        lock(&self.progress).recovery_point.clone()
    }

    /// Whether the claim is committed in the store (see [`ClaimerKind`]).
    pub fn is_committed(&self) -> bool {
        self.committed.load(Ordering::Acquire)
    }

    /// Whether a transaction committed the record's response.
    pub fn is_completed(&self) -> bool {
        self.book.is_completed()
    }

    /// Whether this request is known to have lost its claim: a renewal was fenced (another
    /// request took the key over after the lease lapsed). A request that has lost its claim
    /// must stop: it makes no further outside call, and its later writes are rejected.
    pub fn is_lost(&self) -> bool {
        self.book.is_lost()
    }

    /// When the last lease the store granted this claim ends at the latest, in epoch
    /// milliseconds of the layer's clock: the time its claim or renewal was sent plus the
    /// lease, so a store whose clock runs ahead of the layer's (a Redis store on the server's
    /// clock) cannot make it look longer than it is (a phase's own commit may have extended the
    /// lease further).
    pub fn held_until(&self) -> UnixMillis {
        self.book.held_until()
    }

    /// Makes sure the claim is still this request's before an outside call: answers at once
    /// when the lease is known to be held for at least one more heartbeat interval (the usual
    /// case: the heartbeat keeps it so), else renews it now (one store call, bounded by the
    /// layer's store timeout). Call it with no transaction of the request open: on SQLite a
    /// renewal needs the database's write lock, which an open phase holds.
    ///
    /// A graceful shutdown cannot see a call made after this check: make outside calls
    /// through [`ClaimState::outside_call`] (or `oncely_sqlx::Between::call`), which the
    /// shutdown waits for.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when another request owns the key now (this request must stop
    /// and make no outside call); [`StoreError::Unavailable`] when the lease may have lapsed
    /// and the store could not renew it in time (stop too: the request is suspended and a
    /// retry resumes it), and once a graceful shutdown began suspending the running requests
    /// ([`Drain::abandon`](crate::Drain::abandon)): an outside call that started then could
    /// still be running when the key is handed over.
    pub async fn ensure_held(&self) -> Result<(), StoreError> {
        if self.book.is_closed() {
            return Err(shutting_down());
        }
        self.check_held().await
    }

    /// Makes one outside call (a card processor, a mailer) as this request: checks that the
    /// claim is still held ([`ClaimState::ensure_held`]), then runs `call` and returns its
    /// output. While `call` runs, a graceful shutdown of the server does not suspend the
    /// request nor cut its lease short: it waits for the call to return, at most its
    /// documented bound ([`Drain::with_outside_call_wait`](crate::Drain::with_outside_call_wait)),
    /// and past that bound leaves the lease to lapse instead of handing the key over while
    /// the call may still land (`docs/DESIGN.md`, "Operating the server"). Call it with no
    /// database transaction of the request open.
    ///
    /// # Errors
    ///
    /// As [`ClaimState::ensure_held`]; `call` is then not made.
    pub async fn outside_call<T, F, Fut>(self: &Arc<Self>, call: F) -> Result<T, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let _in_call = self.book.enter_call().ok_or_else(shutting_down)?;
        self.check_held().await?;
        Ok(call().await)
    }

    /// [`ClaimState::ensure_held`] without the shutdown check.
    async fn check_held(&self) -> Result<(), StoreError> {
        if self.is_lost() {
            return Err(StoreError::Fenced);
        }
        if !self.is_committed() {
            // The claim rides in this request's own open transaction: nobody else can take
            // it before that transaction commits.
            return Ok(());
        }
        let margin = oncely_core::clock::duration_millis(self.config.policy.heartbeat);
        if self.config.clock.now_millis().saturating_add(margin) < self.held_until() {
            return Ok(());
        }
        let sent = self.config.clock.now_millis();
        let renewal = self
            .config
            .store
            .renew(self.id(), self.token(), self.lease());
        match crate::store_call::timed(&self.config, renewal).await {
            Ok(_) => {
                self.book.renewed(sent, self.lease());
                Ok(())
            }
            Err(StoreError::Fenced) => {
                self.book.lose();
                Err(StoreError::Fenced)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the layer's store policy keeps a response the handler's transaction is about
    /// to commit (`status`, `headers` and `trailers` as captured; a gRPC status is read from
    /// them): what a handler commits is judged like what it returns
    /// ([`StorePolicy::keeps_commit`](oncely_core::StorePolicy::keeps_commit)). A response the
    /// policy does not keep is not committed: its phase rolls back, and the layer releases the
    /// key or suspends the request at its recovery point, so that a retry runs again.
    pub fn keeps(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        trailers: &[(String, Vec<u8>)],
    ) -> bool {
        let status = self
            .config
            .dialect
            .effective_status(status, headers, trailers);
        self.config
            .policy
            .store_policy
            .keeps_commit(status.as_u16())
    }

    /// For transactional claimers: a phase of the request committed, with `recovery_point` if
    /// it recorded one. The first commit of a claim that rode in the handler's transaction
    /// starts the lease heartbeat.
    pub fn phase_committed(self: &Arc<Self>, recovery_point: Option<String>) {
        if recovery_point.is_some() {
            lock(&self.progress).recovery_point = recovery_point;
        }
        self.on_commit();
    }

    /// For transactional claimers: the request's transaction committed `response` as the
    /// record's: it replays from now on. The layer sends it, whatever the handler returns.
    pub fn response_committed(&self, response: Arc<StoredResponse>) {
        lock(&self.progress).committed_response = Some(response);
        self.book.complete();
        self.committed.store(true, Ordering::Release);
    }

    /// For transactional claimers: a phase the handler dropped unfinished is being rolled back
    /// by `rollback`, whose output says whether that transaction had ended behind the phase's
    /// back (the handler ran `COMMIT` or `ROLLBACK` through it). The layer waits for it before
    /// it answers.
    pub fn rollback_started(&self, rollback: JoinHandle<bool>) {
        *lock(&self.rollback) = Some(rollback);
    }

    /// The first commit: the claim is in the store, the heartbeat starts, and a duplicate
    /// waiting in this process may go to the store (it answers at once now).
    fn on_commit(self: &Arc<Self>) {
        if self.committed.swap(true, Ordering::AcqRel) {
            return;
        }
        drop(lock(&self.hold).take());
        *lock(&self.heartbeat) = Some(Heartbeat::start(&self.config, Arc::clone(&self.book)));
    }

    /// The response the transaction committed, if one did.
    pub(crate) fn committed_response(&self) -> Option<Arc<StoredResponse>> {
        lock(&self.progress).committed_response.clone()
    }

    /// Waits for the rollback of a phase the handler dropped; whether its transaction had
    /// ended behind the phase's back.
    pub(crate) async fn settle(&self) -> bool {
        let handle = lock(&self.rollback).take();
        match handle {
            Some(h) => h.await.unwrap_or(false),
            None => false,
        }
    }

    /// Stops the heartbeat and waits for its renewal in flight, if any.
    pub(crate) async fn stop_heartbeat(&self) {
        let running = lock(&self.heartbeat).take();
        if let Some(h) = running {
            h.stop().await;
        }
    }

    /// Stops the heartbeat without waiting for it (it ends after its renewal in flight).
    pub(crate) fn drop_heartbeat(&self) {
        drop(lock(&self.heartbeat).take());
    }

    /// Ends the key's turn in this process (at the latest when the execution ends).
    pub(crate) fn release_hold(&self) {
        drop(lock(&self.hold).take());
    }

    /// The lease and the outside calls in flight, shared with the heartbeat and the drain.
    pub(crate) fn book(&self) -> &Arc<LeaseBook> {
        &self.book
    }

    pub(crate) fn claimer(&self) -> ClaimerKind {
        self.claimer
    }
}

/// Why an outside call is refused once the server began suspending its running requests.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server is shutting down and suspends this request at its recovery point: no new outside call"
)]
struct ShuttingDown;

fn shutting_down() -> StoreError {
    StoreError::unavailable(ShuttingDown)
}
