//! The lease heartbeat of one claimed request.

use crate::config::Config;
use crate::lease::LeaseBook;
use crate::metrics::Counter;
use crate::store_call::timed;
use oncely_core::StoreError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

/// The lease heartbeat: a task that renews the claim every `Policy::heartbeat` while the
/// handler runs, so a slow but live request is never taken over. It starts when the claim is
/// committed ([`ClaimState`](crate::ClaimState): at once for a store's claim, at the first phase's commit for a
/// claim that rides in the handler's transaction; a single-phase request, whose only commit
/// completes it, pays for no heartbeat at all).
///
/// It renews whatever the handler is doing, also while one of its phases has a transaction
/// open: a live request keeps its lease. (A phase of `oncely-sqlx` takes no lock on the record
/// that a renewal would wait for, except on SQLite, whose one write lock the phase holds: there
/// the renewal waits, bounded by the store timeout, and the phase's own commit extends the lease
/// too.) Renewals keep a fixed rate, each due one interval after the start of the last one that
/// succeeded, so a slow store does not stretch the interval; a renewal that failed is tried
/// again after a quarter of the interval (at least 10 milliseconds), not a whole one, so one
/// failed renewal does not cost a third of a lease. Every renewal the store grants moves the
/// claim's lease end on ([`ClaimState::held_until`](crate::ClaimState::held_until)); a fenced
/// one marks it lost, and the handler's next outside call is refused.
///
/// How it stops: [`Heartbeat::stop`] signals it and waits, so that no renew is in flight when
/// the record is completed. If the handler's task is dropped instead (the runtime shuts down),
/// dropping the sender wakes the heartbeat task, which then ends: no heartbeat outlives its
/// request by more than one renew call.
pub(crate) struct Heartbeat {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    pub(crate) fn start(config: &Arc<Config>, claim: Arc<LeaseBook>) -> Self {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let config = Arc::clone(config);
        let mut suspended = claim.suspended();
        let task = tokio::spawn(
            async move {
                let every = config.policy.heartbeat;
                let again = (every / 4).max(Duration::from_millis(10)).min(every);
                let mut due = tokio::time::Instant::now() + every;
                loop {
                    tokio::select! {
                        biased;
                        _ = &mut stopped => return,
                        // The server is shutting down and suspended this claim: renewing it
                        // would undo the suspension. (A claim inside an outside call is not
                        // suspended: it keeps its lease until the call returns.)
                        _ = suspended.wait_for(|a| *a) => return,
                        () = tokio::time::sleep_until(due) => {}
                    }
                    if claim.is_suspended() {
                        return;
                    }
                    if claim.is_completed() {
                        return;
                    }
                    let (id, token) = (&claim.id, claim.token);
                    let started = tokio::time::Instant::now();
                    let sent = config.clock.now_millis();
                    match timed(&config, config.store.renew(id, token, config.policy.lease)).await {
                        // The drain cut this lease short while the renewal was on its way: cut
                        // it again, so the renewal cannot undo the suspension.
                        Ok(_) if claim.is_suspended() => {
                            let cut = config.store.renew(id, token, Duration::ZERO);
                            let _ = timed(&config, cut).await;
                            return;
                        }
                        Ok(_) => {
                            claim.renewed(sent, config.policy.lease);
                            due = started + every;
                        }
                        Err(StoreError::Fenced) => {
                            // A transactional handler may have completed the record itself
                            // while this renewal waited for its phase's lock: that is not a
                            // lost claim.
                            let completed_by_us = matches!(
                                timed(&config, config.store.get(id)).await,
                                Ok(Some(rec)) if rec.token == token && matches!(rec.state, oncely_core::RecordState::Complete { .. })
                            );
                            if !completed_by_us {
                                claim.lose();
                                config.metrics.inc(Counter::fencing_rejections);
                                tracing::warn!(scope = %id.scope, key = %id.key, token = token.0, "lease renewal fenced: this request lost its claim to another one; it makes no further outside call, and its completion will be rejected");
                            }
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, retry_in_ms = again.as_millis() as u64, "lease renewal failed; trying again");
                            due = tokio::time::Instant::now() + again;
                        }
                    }
                }
            }
            .in_current_span(),
        );
        Self { stop, task }
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
