//! [`LeaseBook`]: what is known of a claim's lease, written by its heartbeat and read before
//! every outside call.

use oncely_core::{FencingToken, RecordKey, UnixMillis};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

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
}

impl LeaseBook {
    pub(crate) fn new(id: RecordKey, token: FencingToken, held_until: UnixMillis) -> Self {
        Self {
            id,
            token,
            held_until: AtomicI64::new(held_until),
            lost: AtomicBool::new(false),
            completed: AtomicBool::new(false),
        }
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
}
