//! The reaper: deletes records past retention in bounded batches, and logs the records marked
//! for a person on every pass (`docs/DESIGN.md`, "Replay window, retention, reaper and
//! completer").

use oncely_core::{Maintenance, ReapReport, StoreError};
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
        ReapReport::new(
            self.deleted.load(Ordering::Relaxed),
            self.orphaned.load(Ordering::Relaxed),
            self.marked.load(Ordering::Relaxed),
        )
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
/// See the [crate docs](crate#how-the-tasks-stop) for how it stops.
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

#[cfg(test)]
mod tests;
