//! [`TimerKeeper`]: keeps a timer of the runtime due within a second, so that the store
//! timeout every claim is bounded by does not wake a parked worker thread each time.
//!
//! tokio's time driver wakes the thread parked on it whenever a timer is registered that is due
//! before the driver's next wake-up (`runtime/time/mod.rs`, `reregister`); with no other timer
//! pending, that is every one. Each claim's store timeout (5 seconds by default) was thus a
//! cross-thread wake-up of an idle worker: at concurrency 1, on PostgreSQL, it cost the layer
//! 1.4 more `epoll_wait` and 1.3 more `recvfrom` calls and 0.6 more `eventfd` writes per
//! request than the floor (strace; docs/performance-history-2026-12.md, "round 5"), and those went
//! away without the timeout.
//!
//! With one timer always due within [`TimerKeeper::period`] (a task that sleeps in a loop), a
//! store timeout due later than that (any of 20 milliseconds and up) never moves the driver's
//! next wake-up earlier, so it is registered without a wake-up. The cost is the keeper's own
//! wake-up, once a period. Nothing depends on it for correctness: every bound is still a tokio
//! timer, and where the keeper is not running (no runtime at the first request, or another
//! runtime than the first) a timer merely costs the wake-up again.
//!
//! One keeper serves a layer and its clones (and every service made from them), and its period
//! is set by the store timeout of the first request's layer;
//! [`IdempotencyLayer::with_store_timeout`] gives the layer a keeper of its own.
//!
//! Under tokio's paused clock (`start_paused`, tests), the runtime advances the clock to the
//! next timer whenever it is idle, also while a task waits for real I/O; with the keeper's timer
//! pending it does so in steps of the period instead of jumping straight to the store timeout,
//! so a store call over real I/O still runs into the store timeout, only in more steps.
//!
//! [`IdempotencyLayer::with_store_timeout`]: crate::IdempotencyLayer::with_store_timeout

use std::sync::OnceLock;
use std::time::Duration;

/// A layer's keeper task: started on the runtime of the first keyed request, ended when the
/// layer, its clones and every service made from them are dropped.
#[derive(Debug, Default)]
pub(crate) struct TimerKeeper {
    task: OnceLock<Option<tokio::task::AbortHandle>>,
}

impl TimerKeeper {
    /// How often the keeper wakes up: half of `store_timeout`, between 10 milliseconds and 1
    /// second (so that a store timeout of 20 milliseconds or more is always due after the
    /// keeper's next wake-up).
    pub(crate) fn period(store_timeout: Duration) -> Duration {
        (store_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Starts the keeper on the current tokio runtime unless it was started (one atomic load
    /// after the first call); nothing outside a runtime.
    pub(crate) fn ensure(&self, store_timeout: Duration) {
        self.task.get_or_init(|| {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let period = Self::period(store_timeout);
            let task = runtime.spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                }
            });
            Some(task.abort_handle())
        });
    }
}

impl Drop for TimerKeeper {
    fn drop(&mut self) {
        if let Some(Some(task)) = self.task.get() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_half_the_store_timeout_within_bounds() {
        assert_eq!(
            TimerKeeper::period(Duration::from_secs(5)),
            Duration::from_secs(1)
        );
        assert_eq!(
            TimerKeeper::period(Duration::from_millis(600)),
            Duration::from_millis(300)
        );
        assert_eq!(
            TimerKeeper::period(Duration::from_millis(4)),
            Duration::from_millis(10)
        );
    }

    #[tokio::test]
    async fn the_keeper_runs_until_dropped() {
        let keeper = TimerKeeper::default();
        keeper.ensure(Duration::from_secs(5));
        keeper.ensure(Duration::from_secs(5));
        let task = keeper
            .task
            .get()
            .and_then(Option::as_ref)
            .expect("started inside a runtime")
            .clone();
        tokio::task::yield_now().await;
        assert!(!task.is_finished());
        drop(keeper);
        // Aborted: it finishes at its next poll.
        for _ in 0..100 {
            if task.is_finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the keeper outlived its layer");
    }

    #[test]
    fn outside_a_runtime_nothing_starts() {
        let keeper = TimerKeeper::default();
        keeper.ensure(Duration::from_secs(5));
        assert!(matches!(keeper.task.get(), Some(None)));
    }
}
