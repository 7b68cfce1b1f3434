//! [`LeaseBook`]: what is known of a claim's lease, written by its heartbeat and read before
//! every outside call; and the outside calls in flight, which a graceful shutdown waits for.

use oncely_core::{FencingToken, RecordKey, UnixMillis};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// The claim's lease as its heartbeat last learned it, and whether its record completed.
#[derive(Debug)]
pub(crate) struct LeaseBook {
    pub(crate) id: RecordKey,
    pub(crate) token: FencingToken,
    /// When the last lease the store granted ends at the latest, on the **layer's** clock
    /// (epoch milliseconds): the time the renewal (or the claim) was sent plus the lease. The
    /// store sets the lease from a time no earlier than that on its own clock, so whatever the
    /// skew between the two clocks (a Redis store on the server's clock), this is never later
    /// than the lease's real end by the layer's reckoning of elapsed time.
    held_until: AtomicI64,
    /// Whether the store answered a renewal of this claim with `StoreError::Fenced`.
    lost: AtomicBool,
    /// Whether a transaction completed the record (nothing to renew any more).
    completed: AtomicBool,
    /// The outside calls in flight, and whether a graceful shutdown closed the claim to new
    /// ones (`docs/DESIGN.md`, "Operating the server").
    calls: Mutex<Calls>,
    /// `true` once a graceful shutdown cut this claim's lease short: its heartbeat stops.
    suspended: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Calls {
    in_flight: usize,
    closed: bool,
}

/// One outside call in flight, from [`LeaseBook::enter_call`] until dropped.
pub(crate) struct InCall(Arc<LeaseBook>);

impl Drop for InCall {
    fn drop(&mut self) {
        self.0.calls().in_flight -= 1;
    }
}

impl LeaseBook {
    pub(crate) fn new(id: RecordKey, token: FencingToken, held_until: UnixMillis) -> Self {
        Self {
            id,
            token,
            held_until: AtomicI64::new(held_until),
            lost: AtomicBool::new(false),
            completed: AtomicBool::new(false),
            calls: Mutex::new(Calls::default()),
            suspended: watch::Sender::new(false),
        }
    }

    fn calls(&self) -> MutexGuard<'_, Calls> {
        // Plain counters, each update one statement: a panic cannot leave them half-written.
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn held_until(&self) -> UnixMillis {
        self.held_until.load(Ordering::Acquire)
    }

    /// The store granted a renewal sent at `sent` (epoch milliseconds, the layer's clock):
    /// the lease holds until `sent` plus the lease, at least.
    pub(crate) fn renewed(&self, sent: UnixMillis, lease: std::time::Duration) {
        let until = sent.saturating_add(oncely_core::clock::duration_millis(lease));
        self.held_until.fetch_max(until, Ordering::AcqRel);
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The claim is lost to another request.
    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::Acquire)
    }

    pub(crate) fn complete(&self) {
        self.completed.store(true, Ordering::Release);
    }

    /// An outside call begins, unless a graceful shutdown closed the claim (`None`).
    pub(crate) fn enter_call(self: &Arc<Self>) -> Option<InCall> {
        let mut calls = self.calls();
        if calls.closed {
            return None;
        }
        calls.in_flight += 1;
        Some(InCall(Arc::clone(self)))
    }

    /// Whether a graceful shutdown closed the claim to new outside calls.
    pub(crate) fn is_closed(&self) -> bool {
        self.calls().closed
    }

    /// Closes the claim to new outside calls (a graceful shutdown); whether none is in flight.
    pub(crate) fn close(&self) -> bool {
        let mut calls = self.calls();
        calls.closed = true;
        calls.in_flight == 0
    }

    /// How many outside calls are in flight.
    pub(crate) fn calls_in_flight(&self) -> usize {
        self.calls().in_flight
    }

    /// A graceful shutdown cut the lease short: the heartbeat stops renewing it.
    pub(crate) fn suspend(&self) {
        self.suspended.send_replace(true);
    }

    pub(crate) fn is_suspended(&self) -> bool {
        *self.suspended.borrow()
    }

    /// A receiver that turns `true` when the lease is cut short by a graceful shutdown.
    pub(crate) fn suspended(&self) -> watch::Receiver<bool> {
        self.suspended.subscribe()
    }
}
