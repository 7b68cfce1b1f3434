//! The completer: re-drives abandoned in-flight requests through the service with the same key
//! (`docs/DESIGN.md`, "Replay window, retention, reaper and completer").

use crate::redrive::{Redrive, RedrivePolicy};
use oncely_core::{Maintenance, Record, RecordKey, RecordState, RedriveNote, StoreError};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

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
    let id = RecordKey::new(record.scope.clone(), record.key.clone());
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
/// See the [crate docs](crate#how-the-tasks-stop) for how it stops; it checks `shutdown` between
/// records and between passes, so a re-drive in progress is finished first and no new one starts
/// after the signal.
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
mod tests;
