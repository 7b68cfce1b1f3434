//! The background jobs, over any store with [`Maintenance`] (feature `jobs`).
//!
//! - The **reaper** deletes records whose retention ended, in bounded batches with a pause
//!   between them, so that it never holds a store's locks (or its mutex) for long and claims
//!   keep flowing while it runs. It logs in-flight records it deleted (orphans: requests that
//!   were abandoned and never finished, whose effects may be half-done).
//! - The **completer** finds abandoned in-flight requests (lease lapsed at least a grace period
//!   ago) and re-drives each stored request through the service with the same key, through a
//!   [`Redrive`] implementation (the CLI's is an HTTP call to the server with the same
//!   `Idempotency-Key` and the scope's credentials). The service then takes the key over,
//!   resumes from the recovery point and stores the final response, exactly as a client retry
//!   would. It never loops for ever: each record gets a bounded number of attempts with
//!   backoff ([`RedrivePolicy`]: 5, pausing 30 s, 1 min, 2 min, 4 min), counted in the store
//!   so that a restart does not reset them; then it is marked for a person
//!   ([`Redrives::marked_at`](crate::Redrives::marked_at)): never re-driven again, every retry
//!   with its key answered `409 idempotency_request_needs_attention`, and one `error` log line
//!   per marked record on every reaper pass.
//!
//! Both run once ([`reap_all`], [`complete_abandoned`]) or as in-process tokio tasks
//! ([`Reaper`], [`Completer`]).
//!
//! # How the tasks stop
//!
//! [`Reaper::spawn`] and [`Completer::spawn`] take a `shutdown` future, like axum's graceful
//! shutdown: any `Future<Output = ()>` works, e.g. `token.cancelled_owned()` of a
//! `tokio_util::sync::CancellationToken`, `async { rx.await.ok(); }` for a
//! `tokio::sync::oneshot::Receiver`, or a `tokio::sync::watch` change. The task checks it only
//! *between* store operations (while sleeping between batches and between passes), never in
//! the middle of one, so a stop never abandons a database statement halfway; it then returns
//! the totals of everything it did through its [`JoinHandle`]. Aborting the handle instead
//! also stops it, at the cost of possibly dropping an operation in flight (every store
//! operation is atomic, so nothing is left half-written either way).
//!
//! ```
//! use oncely_core::jobs::Reaper;
//! use oncely_core::{Maintenance, MemoryStore};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store: Arc<dyn Maintenance> = Arc::new(MemoryStore::new());
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let reaper = Reaper::new(store, Duration::from_secs(60), 1_000)
//!     .spawn(async { stopped.await.ok(); });
//! // ... serve requests ...
//! stop.send(()).ok();
//! let totals = reaper.await.unwrap();
//! assert_eq!(totals.deleted, 0);
//! # });
//! ```

use crate::record::{Record, RecordState};
use crate::store::{Maintenance, ReapReport, RedriveNote, StoreError};
use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// The pause between reaper batches when none is given: 10 milliseconds, enough for waiting
/// claims to get the connection, the rows or the mutex between two batches.
pub const DEFAULT_REAP_PAUSE: Duration = Duration::from_millis(10);

/// Reaps everything past retention: calls [`Maintenance::reap`] with `batch` (0 is raised to 1)
/// until a call deletes fewer than `batch` records, sleeping `pause` between calls so that
/// claims are never blocked for longer than one batch. Logs (at `warn`) every batch that
/// deleted in-flight orphans. Then logs (at `error`) one line for every record marked for a
/// person that is still kept ([`Maintenance::list_marked`], at most [`MARKED_LOG_LIMIT`]): every
/// pass repeats them, so a record the completer gave up on stays in the logs until a person
/// deals with it or its retention ends.
///
/// Returns the totals ([`ReapReport::marked`]: the marked records it logged).
///
/// # Errors
///
/// The first [`StoreError`] of a batch; records deleted by earlier batches stay deleted (each
/// batch is atomic on its own), and a later call simply continues.
pub async fn reap_all(
    store: &dyn Maintenance,
    batch: usize,
    pause: Duration,
) -> Result<ReapReport, StoreError> {
    let mut shutdown = std::pin::pin!(std::future::pending::<()>());
    reap_pass(store, batch, pause, &mut shutdown)
        .await
        .map(|(report, _)| report)
}

/// One reaper pass; stops early (between batches) when `shutdown` completes. Returns the
/// totals and whether it was stopped.
async fn reap_pass<F: Future<Output = ()>>(
    store: &dyn Maintenance,
    batch: usize,
    pause: Duration,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Result<(ReapReport, bool), StoreError> {
    let batch = batch.max(1);
    let mut total = ReapReport::default();
    loop {
        let r = store.reap(batch).await?;
        total.deleted += r.deleted;
        total.orphaned += r.orphaned;
        if r.orphaned > 0 {
            tracing::warn!(
                orphaned = r.orphaned,
                deleted = r.deleted,
                "reaper deleted in-flight records past retention: their requests were abandoned \
                 and never finished, and may have left a half-done effect"
            );
        }
        if r.deleted < batch as u64 {
            total.marked = log_marked(store).await;
            return Ok((total, false));
        }
        tokio::select! {
            () = shutdown.as_mut() => return Ok((total, true)),
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The most records marked for a person one reaper pass logs (1,000, oldest mark first); the
/// pass says so when there may be more.
pub const MARKED_LOG_LIMIT: usize = 1_000;

/// Logs (at `error`) one line per record marked for a person, up to [`MARKED_LOG_LIMIT`]; returns
/// how many it logged. A store error is logged (at `warn`) and counts 0.
async fn log_marked(store: &dyn Maintenance) -> u64 {
    let marked = match store.list_marked(MARKED_LOG_LIMIT).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "reaper could not list the records marked for a person");
            return 0;
        }
    };
    for r in &marked {
        let request = r.request.as_ref();
        tracing::error!(
            scope = %r.scope,
            key = %r.key,
            attempts = r.redrives.attempts,
            marked_at = r.redrives.marked_at,
            created_at = r.created_at,
            expires_at = r.expires_at,
            recovery_point = r.recovery_point(),
            method = request.map(|q| q.method.as_str()),
            uri = request.map(|q| q.uri.as_str()),
            "abandoned request marked for a person: the completer gave up on it; it may have \
             taken effect part-way (see its recovery point), retries with its key are answered \
             409 idempotency_request_needs_attention, and it is deleted when its retention ends"
        );
    }
    if marked.len() == MARKED_LOG_LIMIT {
        tracing::error!(
            listed = MARKED_LOG_LIMIT,
            "at least this many records are marked for a person; only the oldest are listed"
        );
    }
    marked.len() as u64
}

/// A [`Reaper`]'s running totals, readable while it runs (for metrics): see
/// [`Reaper::counters`].
#[derive(Debug, Default)]
pub struct ReaperCounters {
    deleted: AtomicU64,
    orphaned: AtomicU64,
    marked: AtomicU64,
}

impl ReaperCounters {
    /// The totals so far: records deleted and, of those, orphaned, over every finished pass;
    /// [`ReapReport::marked`] as counted by the last finished pass (a gauge, not a sum).
    pub fn snapshot(&self) -> ReapReport {
        ReapReport {
            deleted: self.deleted.load(Ordering::Relaxed),
            orphaned: self.orphaned.load(Ordering::Relaxed),
            marked: self.marked.load(Ordering::Relaxed),
        }
    }

    fn add(&self, r: &ReapReport, finished: bool) {
        self.deleted.fetch_add(r.deleted, Ordering::Relaxed);
        self.orphaned.fetch_add(r.orphaned, Ordering::Relaxed);
        if finished {
            self.marked.store(r.marked, Ordering::Relaxed);
        }
    }
}

/// The reaper as an in-process tokio task: a pass of [`reap_all`] at start and then every
/// `every` (measured from the end of one pass to the start of the next).
///
/// See the [module docs](self) for how it stops.
#[derive(Clone)]
pub struct Reaper {
    store: Arc<dyn Maintenance>,
    every: Duration,
    batch: usize,
    pause: Duration,
    counters: Arc<ReaperCounters>,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("every", &self.every)
            .field("batch", &self.batch)
            .field("pause", &self.pause)
            .finish_non_exhaustive()
    }
}

impl Reaper {
    /// A reaper over `store` that runs a pass every `every`, deleting up to `batch` records per
    /// store call, pausing [`DEFAULT_REAP_PAUSE`] (10 milliseconds) between calls.
    pub fn new(store: Arc<dyn Maintenance>, every: Duration, batch: usize) -> Self {
        Self {
            store,
            every,
            batch,
            pause: DEFAULT_REAP_PAUSE,
            counters: Arc::default(),
        }
    }

    /// The totals so far, shared with the running task (what [`Reaper::run`] returns when it
    /// stops, readable at any time before).
    pub fn counters(&self) -> Arc<ReaperCounters> {
        Arc::clone(&self.counters)
    }

    /// Sets the pause between batches of one pass.
    #[must_use]
    pub fn with_pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Runs passes until `shutdown` completes; returns the totals. A failed pass is logged (at
    /// `warn`) and retried at the next tick: the reaper never gives up on its own.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> ReapReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = ReapReport::default();
        loop {
            match reap_pass(&*self.store, self.batch, self.pause, &mut shutdown).await {
                Ok((r, stopped)) => {
                    self.counters.add(&r, !stopped);
                    total.deleted += r.deleted;
                    total.orphaned += r.orphaned;
                    total.marked = r.marked;
                    if r.deleted > 0 {
                        tracing::info!(
                            deleted = r.deleted,
                            orphaned = r.orphaned,
                            "reaper pass done"
                        );
                    }
                    if stopped {
                        return total;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reaper pass failed; retrying next tick"),
            }
            tokio::select! {
                () = shutdown.as_mut() => return total,
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// Spawns [`Reaper::run`] on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<ReapReport> {
        tokio::spawn(self.run(shutdown))
    }
}

/// Why a re-drive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// The record kept no request (its claim carried `request: None`), so there is nothing to
    /// re-drive.
    #[error("the record kept no request to re-drive")]
    NoRequest,
    /// The service could not be reached or did not answer.
    #[error("the service could not be reached: {0}")]
    Unreachable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The scope's credentials could not be obtained.
    #[error("no credentials for scope {0}")]
    NoCredentials(String),
}

/// Re-drives one abandoned request through the service with the same key.
///
/// The CLI's implementation sends [`Record::request`] over HTTP to the server with the same
/// `Idempotency-Key` and the scope's credentials; the server's layer then takes the key over
/// (the lease lapsed), resumes at the recovery point, and stores the final response.
#[async_trait]
pub trait Redrive: Send + Sync {
    /// Sends the request; returns the HTTP status the service answered.
    ///
    /// # Errors
    ///
    /// [`RedriveError`] when the request could not be sent or answered.
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError>;
}

/// How hard the completer tries before it gives up on a record and marks it for a person.
///
/// Attempt `n` (1-based) that leaves the record still in flight is followed by a pause of
/// `min(backoff_cap, backoff_base * 2^(n-1))` before attempt `n + 1` may start: with the
/// defaults 30 s, 1 min, 2 min, 4 min. The pause runs from the start of the attempt, and a
/// record is also only listed once its lease lapsed at least the completer's grace ago, so the
/// real pause is the longer of the two. When `max_attempts` attempts have not finished it, the
/// next pass marks it for a person ([`RedriveNote::Mark`]) instead of re-driving it again.
///
/// The pauses are not jittered: every attempt is one compare-and-set on the record
/// ([`Maintenance::note_redrive`]), so several completers never re-drive one record twice, and
/// there is no herd of clients to spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedrivePolicy {
    /// The re-drives one record gets before it is marked for a person. Default
    /// [`RedrivePolicy::DEFAULT_MAX_ATTEMPTS`] (5). 0 marks every abandoned record at once.
    pub max_attempts: u32,
    /// The pause after the first attempt. Default [`RedrivePolicy::DEFAULT_BACKOFF_BASE`]
    /// (30 seconds).
    pub backoff_base: Duration,
    /// The longest pause. Default [`RedrivePolicy::DEFAULT_BACKOFF_CAP`] (10 minutes).
    pub backoff_cap: Duration,
}

impl RedrivePolicy {
    /// The default number of re-drives per record: 5.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
    /// The default pause after the first attempt: 30 seconds.
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(30);
    /// The default longest pause: 10 minutes.
    pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(600);

    /// A policy with these attempts and pauses.
    pub fn new(max_attempts: u32, backoff_base: Duration, backoff_cap: Duration) -> Self {
        Self {
            max_attempts,
            backoff_base,
            backoff_cap,
        }
    }

    /// The pause after attempt `attempt` (1-based): `min(cap, base * 2^(attempt-1))`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.backoff_base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.backoff_cap)
    }
}

impl Default for RedrivePolicy {
    fn default() -> Self {
        Self::new(
            Self::DEFAULT_MAX_ATTEMPTS,
            Self::DEFAULT_BACKOFF_BASE,
            Self::DEFAULT_BACKOFF_CAP,
        )
    }
}

/// What one completer pass did (or, from [`Completer::run`], all of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompleterReport {
    /// Abandoned records re-driven (each attempt counted in the record first).
    pub attempted: u64,
    /// Of those, records that are no longer in flight after their re-drive (complete, released
    /// or gone).
    pub completed: u64,
    /// Of those, records whose re-drive failed or that are still in flight afterwards (for
    /// instance the service answered `503` because an outside system is down); a later pass
    /// tries them again after their backoff, until the attempts run out.
    pub failed: u64,
    /// Records marked for a person: their attempts ran out, or they kept no request to
    /// re-drive.
    pub marked: u64,
}

impl CompleterReport {
    fn add(&mut self, other: &Self) {
        self.attempted += other.attempted;
        self.completed += other.completed;
        self.failed += other.failed;
        self.marked += other.marked;
    }
}

/// Lists up to `limit` abandoned records (in flight, lease lapsed at least `grace` ago, not
/// marked, past their backoff; oldest lease first) and deals with each, one at a time:
///
/// - a record that kept no request, or whose attempts reached `policy.max_attempts`, is marked
///   for a person ([`RedriveNote::Mark`]) and logged at `error`;
/// - any other one has the attempt counted in the store first ([`RedriveNote::Attempt`], so a
///   crash or restart in the middle of the re-drive still counts it), then is re-driven
///   through `redrive`. It counts as completed when, after the re-drive answered, the store no
///   longer holds it in flight.
///
/// A record whose counting or marking is fenced (a client or another completer got to it first)
/// is left alone. Failures are logged (at `warn`) and counted, never returned: one bad record
/// does not stop the others. A store error while listing is logged and yields an empty report.
pub async fn complete_abandoned(
    store: &dyn Maintenance,
    redrive: &dyn Redrive,
    grace: Duration,
    limit: usize,
    policy: &RedrivePolicy,
) -> CompleterReport {
    let mut shutdown = std::pin::pin!(std::future::pending::<()>());
    completer_pass(store, redrive, grace, limit, policy, &mut shutdown)
        .await
        .0
}

/// One completer pass; stops early (between records) when `shutdown` completes. Returns the
/// report and whether it was stopped.
async fn completer_pass<F: Future<Output = ()>>(
    store: &dyn Maintenance,
    redrive: &dyn Redrive,
    grace: Duration,
    limit: usize,
    policy: &RedrivePolicy,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> (CompleterReport, bool) {
    let mut report = CompleterReport::default();
    let records = match store.list_abandoned(grace, limit).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "completer could not list abandoned records");
            return (report, false);
        }
    };
    for record in records {
        if is_done(shutdown.as_mut()).await {
            return (report, true);
        }
        complete_one(store, redrive, policy, record, &mut report).await;
    }
    (report, false)
}

/// Whether `shutdown` has completed, without waiting for it.
async fn is_done<F: Future<Output = ()>>(shutdown: std::pin::Pin<&mut F>) -> bool {
    tokio::select! {
        biased;
        () = shutdown => true,
        () = std::future::ready(()) => false,
    }
}

async fn complete_one(
    store: &dyn Maintenance,
    redrive: &dyn Redrive,
    policy: &RedrivePolicy,
    record: Record,
    report: &mut CompleterReport,
) {
    let id = crate::key::RecordKey::new(record.scope.clone(), record.key.clone());
    let seen = record.redrives.attempts;
    let give_up = if record.request.is_none() {
        Some("it kept no request to re-drive")
    } else if seen >= policy.max_attempts {
        Some("its re-drive attempts ran out")
    } else {
        None
    };
    if let Some(why) = give_up {
        match store
            .note_redrive(&id, record.token, seen, RedriveNote::Mark)
            .await
        {
            Ok(r) => {
                report.marked += 1;
                tracing::error!(scope = %record.scope, key = %record.key, attempts = r.attempts,
                    recovery_point = record.recovery_point(),
                    "completer gave up on an abandoned request ({why}) and marked it for a \
                     person: it is not re-driven again, and retries with its key are answered \
                     409 idempotency_request_needs_attention");
            }
            Err(StoreError::Fenced) => {
                tracing::debug!(scope = %record.scope, key = %record.key,
                    "abandoned record changed before it could be marked; left alone");
            }
            Err(e) => {
                tracing::warn!(scope = %record.scope, key = %record.key, error = %e,
                    "could not mark an abandoned record for a person");
            }
        }
        return;
    }
    let attempt = seen + 1;
    let backoff = policy.backoff(attempt);
    match store
        .note_redrive(&id, record.token, seen, RedriveNote::Attempt { backoff })
        .await
    {
        Ok(_) => {}
        Err(StoreError::Fenced) => {
            tracing::debug!(scope = %record.scope, key = %record.key,
                "abandoned record changed before its re-drive; left alone");
            return;
        }
        Err(e) => {
            tracing::warn!(scope = %record.scope, key = %record.key, error = %e,
                "could not count a re-drive attempt; not re-driving");
            return;
        }
    }
    report.attempted += 1;
    let status = match redrive.redrive(&record).await {
        Ok(status) => status,
        Err(e) => {
            tracing::warn!(scope = %record.scope, key = %record.key, error = %e, attempt,
                max_attempts = policy.max_attempts, next_in_ms = backoff.as_millis() as u64,
                "re-drive failed");
            report.failed += 1;
            return;
        }
    };
    match store.get(&id).await {
        Ok(Some(Record {
            state: RecordState::InFlight { .. },
            ..
        })) => {
            tracing::warn!(scope = %record.scope, key = %record.key, status, attempt,
                max_attempts = policy.max_attempts, next_in_ms = backoff.as_millis() as u64,
                "re-driven request is still in flight");
            report.failed += 1;
        }
        Ok(_) => {
            tracing::info!(scope = %record.scope, key = %record.key, status, attempt,
                recovery_point = record.recovery_point(), "completed abandoned request");
            report.completed += 1;
        }
        Err(e) => {
            tracing::warn!(scope = %record.scope, key = %record.key, error = %e,
                "could not read the record after its re-drive");
            report.failed += 1;
        }
    }
}

/// The running totals of a [`Completer`] task, readable while it runs (for metrics).
#[derive(Debug, Default)]
pub struct CompleterCounters {
    attempted: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    marked: AtomicU64,
}

impl CompleterCounters {
    /// The totals so far.
    pub fn snapshot(&self) -> CompleterReport {
        CompleterReport {
            attempted: self.attempted.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            marked: self.marked.load(Ordering::Relaxed),
        }
    }

    fn add(&self, r: &CompleterReport) {
        self.attempted.fetch_add(r.attempted, Ordering::Relaxed);
        self.completed.fetch_add(r.completed, Ordering::Relaxed);
        self.failed.fetch_add(r.failed, Ordering::Relaxed);
        self.marked.fetch_add(r.marked, Ordering::Relaxed);
    }
}

/// The completer as an in-process tokio task: a pass of [`complete_abandoned`] at start and
/// then every `every` (from the end of one pass to the start of the next).
///
/// See the [module docs](self) for how it stops; it checks `shutdown` between records and
/// between passes, so a re-drive in progress is finished first and no new one starts after
/// the signal.
#[derive(Clone)]
pub struct Completer {
    store: Arc<dyn Maintenance>,
    redrive: Arc<dyn Redrive>,
    every: Duration,
    grace: Duration,
    limit: usize,
    policy: RedrivePolicy,
    counters: Arc<CompleterCounters>,
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer")
            .field("every", &self.every)
            .field("grace", &self.grace)
            .field("limit", &self.limit)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Completer {
    /// A completer over `store` that re-drives through `redrive`, every `every`, the records
    /// whose lease lapsed at least `grace` ago, up to `limit` per pass, with the default
    /// [`RedrivePolicy`] (5 attempts per record, then marked for a person).
    ///
    /// Choose `grace` longer than a client's whole retry schedule, so that a client still
    /// retrying gets the first chance to resume its own request.
    pub fn new(
        store: Arc<dyn Maintenance>,
        redrive: Arc<dyn Redrive>,
        every: Duration,
        grace: Duration,
        limit: usize,
    ) -> Self {
        Self {
            store,
            redrive,
            every,
            grace,
            limit,
            policy: RedrivePolicy::default(),
            counters: Arc::default(),
        }
    }

    /// Sets how many attempts a record gets and the pauses between them.
    #[must_use]
    pub fn with_policy(mut self, policy: RedrivePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The task's running totals (shared: read them while it runs).
    pub fn counters(&self) -> Arc<CompleterCounters> {
        Arc::clone(&self.counters)
    }

    /// Runs passes until `shutdown` completes; returns the totals.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> CompleterReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = CompleterReport::default();
        loop {
            let (r, stopped) = completer_pass(
                &*self.store,
                &*self.redrive,
                self.grace,
                self.limit,
                &self.policy,
                &mut shutdown,
            )
            .await;
            total.add(&r);
            self.counters.add(&r);
            if stopped {
                tracing::info!("completer stopped");
                return total;
            }
            tokio::select! {
                () = shutdown.as_mut() => {
                    tracing::info!("completer stopped");
                    return total;
                }
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// Spawns [`Completer::run`] on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<CompleterReport> {
        tokio::spawn(self.run(shutdown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::conformance::{LEASE, RETENTION, claim_req, fresh_id, tricky_response};
    use crate::key::RecordKey;
    use crate::record::StoredResponse;
    use crate::store::memory::MemoryStore;
    use crate::store::{ClaimOutcome, ClaimRequest, KeyStore};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts reap calls and their batch sizes, to prove the batching.
    struct CountingStore {
        inner: MemoryStore,
        reaps: Mutex<Vec<u64>>,
    }
    use std::sync::Mutex;

    #[async_trait]
    impl crate::store::StoreWrapper for CountingStore {
        type Inner = MemoryStore;
        fn inner(&self) -> Result<&MemoryStore, StoreError> {
            Ok(&self.inner)
        }
        async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
            let r = self.inner.reap(batch).await?;
            self.reaps.lock().unwrap().push(r.deleted);
            Ok(r)
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// 25 completed records and 2 in-flight orphans past retention, 3 records inside it.
    async fn populate(
        store: &dyn Maintenance,
        clock: &ManualClock,
    ) -> (Vec<RecordKey>, Vec<RecordKey>) {
        let mut doomed = Vec::new();
        for _ in 0..25 {
            let id = fresh_id();
            let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, "{}")).await.unwrap() else {
                panic!()
            };
            store
                .complete(&id, c.token, tricky_response(), HOUR)
                .await
                .unwrap();
            doomed.push(id);
        }
        for _ in 0..2 {
            let id = fresh_id();
            let mut req = claim_req(&id, "{}");
            req.retention = HOUR;
            assert!(matches!(
                store.claim(req).await.unwrap(),
                ClaimOutcome::Claimed(_)
            ));
            doomed.push(id);
        }
        let mut kept = Vec::new();
        for _ in 0..3 {
            let id = fresh_id();
            let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, "{}")).await.unwrap() else {
                panic!()
            };
            store
                .complete(&id, c.token, tricky_response(), RETENTION)
                .await
                .unwrap();
            kept.push(id);
        }
        clock.advance(2 * HOUR);
        (doomed, kept)
    }

    #[tokio::test]
    async fn reap_all_deletes_in_bounded_batches() {
        let clock = ManualClock::starting_now();
        let store = CountingStore {
            inner: MemoryStore::with_clock(Arc::new(clock.clone())),
            reaps: Mutex::default(),
        };
        let (doomed, kept) = populate(&store, &clock).await;
        let report = reap_all(&store, 10, Duration::ZERO).await.unwrap();
        assert_eq!(
            report,
            ReapReport {
                deleted: 27,
                orphaned: 2,
                marked: 0
            }
        );
        assert_eq!(*store.reaps.lock().unwrap(), vec![10, 10, 7]);
        for id in &doomed {
            assert_eq!(store.get(id).await.unwrap(), None);
        }
        for id in &kept {
            assert!(store.get(id).await.unwrap().is_some());
        }
        // An exact multiple of the batch needs one more (empty) call to know it is done.
        let report = reap_all(&store, 3, Duration::ZERO).await.unwrap();
        assert_eq!(report, ReapReport::default());
    }

    #[tokio::test]
    async fn reaper_task_reaps_then_stops_on_signal() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let (doomed, kept) = populate(&*store, &clock).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A long period: after its first pass the task sleeps, and the stop signal must wake it.
        let reaper = Reaper::new(store.clone(), Duration::from_secs(3600), 4)
            .with_pause(Duration::from_millis(1));
        let counters = reaper.counters();
        assert_eq!(counters.snapshot(), ReapReport::default());
        let handle = reaper.spawn(async {
            stopped.await.ok();
        });
        // Wait for the first pass to finish (every doomed record gone).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut left = 0;
            for id in &doomed {
                left += usize::from(store.get(id).await.unwrap().is_some());
            }
            if left == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "reaper did not run");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The running totals are readable before the task stops, once its pass finished.
        while counters.snapshot().deleted < 27 {
            assert!(tokio::time::Instant::now() < deadline, "no running totals");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(()).unwrap();
        let totals = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the reaper stops promptly on its signal")
            .unwrap();
        assert_eq!(
            totals,
            ReapReport {
                deleted: 27,
                orphaned: 2,
                marked: 0
            }
        );
        assert_eq!(counters.snapshot(), totals);
        for id in &kept {
            assert!(store.get(id).await.unwrap().is_some());
        }
    }

    /// A stand-in for the service behind the CLI's HTTP re-drive: it takes the key over through
    /// the store (as the layer would), "resumes", and completes with 201.
    struct FakeService {
        store: Arc<MemoryStore>,
        calls: AtomicU64,
        resumed_from: Mutex<Vec<Option<String>>>,
    }

    #[async_trait]
    impl Redrive for FakeService {
        async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let request = record.request.as_ref().ok_or(RedriveError::NoRequest)?;
            let id = RecordKey::new(record.scope.clone(), record.key.clone());
            let req = ClaimRequest {
                id: id.clone(),
                fingerprint: record.fingerprint,
                lease: LEASE,
                replay_window: crate::conformance::WINDOW,
                retention: RETENTION,
                request: Some(request.clone()),
            };
            match self.store.claim(req).await.unwrap() {
                ClaimOutcome::Claimed(c) => {
                    self.resumed_from.lock().unwrap().push(c.recovery_point);
                    let resp = StoredResponse {
                        status: 201,
                        headers: vec![],
                        body: request.body.clone(),
                        body_retained: true,
                        trailers: Vec::new(),
                    };
                    self.store
                        .complete(&id, c.token, resp, RETENTION)
                        .await
                        .unwrap();
                    Ok(201)
                }
                ClaimOutcome::InFlight { .. } => Ok(409),
                ClaimOutcome::Replay { response, .. } => Ok(response.status),
                ClaimOutcome::Mismatch => Ok(422),
                ClaimOutcome::NeedsAttention { .. } => Ok(409),
            }
        }
    }

    struct Unreachable;
    #[async_trait]
    impl Redrive for Unreachable {
        async fn redrive(&self, _: &Record) -> Result<u16, RedriveError> {
            Err(RedriveError::Unreachable("connection refused".into()))
        }
    }

    #[tokio::test]
    async fn completer_redrives_abandoned_requests_only() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        // Two requests abandoned mid-way (one after a committed phase), one without a stored
        // request, then (later) one whose lease lapsed too recently and one alive.
        let a = fresh_id();
        let ClaimOutcome::Claimed(ca) = store.claim(claim_req(&a, r#"{"n":1}"#)).await.unwrap()
        else {
            panic!()
        };
        store
            .checkpoint(&a, ca.token, "charge_created", LEASE)
            .await
            .unwrap();
        // One second apart, so "oldest lease first" has one right answer.
        clock.advance(Duration::from_secs(1));
        let b = fresh_id();
        assert!(matches!(
            store.claim(claim_req(&b, r#"{"n":2}"#)).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        let bare = fresh_id();
        let mut req = claim_req(&bare, "{}");
        req.request = None;
        assert!(matches!(
            store.claim(req).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        clock.advance(Duration::from_secs(90));
        let recent = fresh_id();
        assert!(matches!(
            store.claim(claim_req(&recent, "{}")).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        clock.advance(Duration::from_secs(40)); // recent: lapsed 10 s ago; a, b: 100 s ago
        let alive = fresh_id();
        assert!(matches!(
            store.claim(claim_req(&alive, "{}")).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        let policy = RedrivePolicy::default();
        let grace = Duration::from_secs(60);

        // The service is down: both attempts fail and are counted; the record without a
        // request cannot be re-driven at all and is marked for a person at once.
        let down = complete_abandoned(&*store, &Unreachable, grace, 100, &policy).await;
        assert_eq!(
            down,
            CompleterReport {
                attempted: 2,
                completed: 0,
                failed: 2,
                marked: 1
            }
        );
        for id in [&a, &b] {
            let r = store.get(id).await.unwrap().unwrap().redrives;
            assert_eq!(r.attempts, 1);
            assert_eq!(r.next_attempt_at, Some(clock.now_millis() + 30_000));
        }
        assert!(store.get(&bare).await.unwrap().unwrap().is_marked());

        let service = FakeService {
            store: store.clone(),
            calls: AtomicU64::new(0),
            resumed_from: Mutex::default(),
        };
        // Inside the 30 s backoff nothing is re-driven.
        clock.advance(Duration::from_secs(29));
        let early = complete_abandoned(&*store, &service, grace, 100, &policy).await;
        assert_eq!(early, CompleterReport::default());
        assert_eq!(service.calls.load(Ordering::SeqCst), 0);
        clock.advance(Duration::from_secs(1));
        let r = complete_abandoned(&*store, &service, grace, 100, &policy).await;
        assert_eq!(
            r,
            CompleterReport {
                attempted: 2,
                completed: 2,
                failed: 0,
                marked: 0
            }
        );
        assert_eq!(
            service.calls.load(Ordering::SeqCst),
            2,
            "no call for a record without a request"
        );
        assert_eq!(
            *service.resumed_from.lock().unwrap(),
            vec![Some("charge_created".to_owned()), None],
            "oldest lease first, resumed at its recovery point"
        );
        for (id, body) in [(&a, r#"{"n":1}"#), (&b, r#"{"n":2}"#)] {
            match store.claim(claim_req(id, body)).await.unwrap() {
                ClaimOutcome::Replay { response, .. } => {
                    assert_eq!(response.status, 201);
                    assert_eq!(response.body, body.as_bytes());
                }
                other => panic!("{other:?}"),
            }
        }
        for id in [&recent, &alive, &bare] {
            assert_eq!(
                store.get(id).await.unwrap().unwrap().state_name(),
                "in_flight"
            );
        }
        // A marked record is not listed again.
        let again = complete_abandoned(&*store, &service, grace, 100, &policy).await;
        assert_eq!(again, CompleterReport::default());
        // The limit bounds a pass.
        clock.advance(Duration::from_secs(3600));
        let limited = complete_abandoned(&*store, &service, grace, 1, &policy).await;
        assert_eq!(limited.attempted, 1);
    }

    /// A re-drive that never finishes the request.
    struct AlwaysFails(AtomicU64);
    #[async_trait]
    impl Redrive for AlwaysFails {
        async fn redrive(&self, _: &Record) -> Result<u16, RedriveError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(RedriveError::Unreachable("connection refused".into()))
        }
    }

    #[tokio::test]
    async fn completer_backs_off_then_gives_up_and_never_redrives_a_marked_record() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let id = fresh_id();
        let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, r#"{"x":1}"#)).await.unwrap()
        else {
            panic!()
        };
        store
            .checkpoint(&id, c.token, "payment_recorded", LEASE)
            .await
            .unwrap();
        clock.advance(LEASE);
        let policy = RedrivePolicy::new(3, Duration::from_secs(10), Duration::from_secs(15));
        assert_eq!(
            (1..=4).map(|n| policy.backoff(n)).collect::<Vec<_>>(),
            [10, 15, 15, 15].map(Duration::from_secs)
        );
        let service = AlwaysFails(AtomicU64::new(0));
        let pass = || complete_abandoned(&*store, &service, Duration::ZERO, 10, &policy);
        let t0 = clock.now_millis();
        // Attempts at t0, t0 + 10 s and t0 + 25 s (pauses 10 s, 15 s, 15 s); nothing between.
        // Every pass is a fresh call: the count lives in the store only, as it would across a
        // restart of the process that runs the completer.
        for (at, attempts) in [(0, 1), (10_000, 2), (25_000, 3)] {
            clock.advance(Duration::from_millis(
                (t0 + at - 1 - clock.now_millis()).max(0) as u64,
            ));
            if at > 0 {
                assert_eq!(pass().await, CompleterReport::default(), "backoff at {at}");
            }
            clock.advance(Duration::from_millis((t0 + at - clock.now_millis()) as u64));
            let r = pass().await;
            assert_eq!((r.attempted, r.failed, r.marked), (1, 1, 0), "at {at}");
            assert_eq!(
                store.get(&id).await.unwrap().unwrap().redrives.attempts,
                attempts
            );
        }
        clock.advance(Duration::from_millis(14_999));
        assert_eq!(pass().await, CompleterReport::default());
        clock.advance(Duration::from_millis(1));
        let gave_up = pass().await;
        assert_eq!(
            gave_up,
            CompleterReport {
                marked: 1,
                ..CompleterReport::default()
            }
        );
        assert_eq!(
            service.0.load(Ordering::SeqCst),
            3,
            "three attempts, no more"
        );
        let rec = store.get(&id).await.unwrap().unwrap();
        assert!(rec.is_marked());
        assert_eq!(rec.redrives.attempts, 3);
        assert_eq!(rec.redrives.marked_at, Some(clock.now_millis()));
        // Never again: not re-driven, and a client retry is answered "needs attention".
        clock.advance(Duration::from_secs(3600));
        assert_eq!(pass().await, CompleterReport::default());
        assert_eq!(service.0.load(Ordering::SeqCst), 3);
        assert_eq!(
            store.claim(claim_req(&id, r#"{"x":1}"#)).await.unwrap(),
            ClaimOutcome::NeedsAttention {
                marked_at: rec.redrives.marked_at.unwrap(),
                attempts: 3,
                recovery_point: Some("payment_recorded".into()),
            }
        );
        // The reaper logs it on every pass, and counts it.
        for _ in 0..2 {
            let r = reap_all(&*store, 100, Duration::ZERO).await.unwrap();
            assert_eq!(r.marked, 1);
            assert_eq!(r.deleted, 0);
        }
        // Past retention it is reaped like any orphan, and no longer counted.
        clock.advance(RETENTION);
        let r = reap_all(&*store, 100, Duration::ZERO).await.unwrap();
        assert_eq!((r.deleted, r.orphaned, r.marked), (1, 1, 0));
    }

    #[tokio::test]
    async fn completer_task_runs_and_stops_on_signal() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let ids: Vec<RecordKey> = (0..5).map(|_| fresh_id()).collect();
        for id in &ids {
            assert!(matches!(
                store.claim(claim_req(id, "{}")).await.unwrap(),
                ClaimOutcome::Claimed(_)
            ));
        }
        clock.advance(Duration::from_secs(120));
        let service = Arc::new(FakeService {
            store: store.clone(),
            calls: AtomicU64::new(0),
            resumed_from: Mutex::default(),
        });
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let completer = Completer::new(
            store.clone(),
            service.clone(),
            Duration::from_millis(5),
            Duration::from_secs(60),
            2,
        );
        let counters = completer.counters();
        let handle = completer.spawn(async move {
            stopped.wait_for(|s| *s).await.ok();
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while counters.snapshot().completed < 5 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "completer did not run"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(true).unwrap();
        let totals = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the completer stops promptly on its signal")
            .unwrap();
        let five = CompleterReport {
            attempted: 5,
            completed: 5,
            failed: 0,
            marked: 0,
        };
        assert_eq!(totals, five);
        assert_eq!(counters.snapshot(), five);
        assert_eq!(
            service.calls.load(Ordering::SeqCst),
            5,
            "each record re-driven once"
        );
        for id in &ids {
            assert_eq!(
                store.get(id).await.unwrap().unwrap().state_name(),
                "complete"
            );
        }
    }

    /// A re-drive that takes until the test lets it go, and says when it started.
    struct Gated {
        started: tokio::sync::mpsc::UnboundedSender<()>,
        go: tokio::sync::Semaphore,
        calls: AtomicU64,
    }
    #[async_trait]
    impl Redrive for Gated {
        async fn redrive(&self, _: &Record) -> Result<u16, RedriveError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.started.send(()).ok();
            self.go.acquire().await.expect("open").forget();
            Err(RedriveError::Unreachable("shutting down".into()))
        }
    }

    #[tokio::test]
    async fn completer_stops_between_records_on_signal() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        for _ in 0..3 {
            assert!(matches!(
                store.claim(claim_req(&fresh_id(), "{}")).await.unwrap(),
                ClaimOutcome::Claimed(_)
            ));
        }
        clock.advance(Duration::from_secs(120));
        let (started, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
        let service = Arc::new(Gated {
            started,
            go: tokio::sync::Semaphore::new(0),
            calls: AtomicU64::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = Completer::new(
            store.clone(),
            service.clone(),
            Duration::from_secs(3600),
            Duration::from_secs(60),
            10,
        )
        .spawn(async {
            stopped.await.ok();
        });
        // The signal arrives while the first re-drive runs: that one is finished, no other
        // starts.
        started_rx.recv().await.unwrap();
        stop.send(()).unwrap();
        service.go.add_permits(10);
        let totals = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the completer stops on its signal")
            .unwrap();
        assert_eq!(service.calls.load(Ordering::SeqCst), 1);
        assert_eq!((totals.attempted, totals.failed), (1, 1));
    }
}
