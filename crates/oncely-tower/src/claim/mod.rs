//! The claim of one request, in one place: the claim call itself (`claim_key`), how it is made
//! ([`Claimer`]: one store call by default, or inside the handler's transaction), and what the
//! layer knows of it while the handler runs ([`ClaimState`]: its lease, its progress, its
//! heartbeat).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the claim call: the wait in this process, the claim request, the store's answer |
//! | `claimer.rs` | [`Claimer`], [`ClaimerKind`], [`StoreClaimer`]: who claims, and who ends the claim |
//! | `state.rs` | [`ClaimState`]: the claim while the handler runs |
//! | `heartbeat.rs` | the task that renews the lease |
//! | `lease.rs` | the lease as its heartbeat learned it, and the outside calls in flight (the drain reads both) |
//! | `local.rs` | duplicates of this process's own claims, waiting in the process |
//!
//! # Who ends a claim
//!
//! The layer owns every claim's life: it claims, starts the lease heartbeat once the claim is
//! committed, and, when the handler returned, completes the record with the response (the
//! completion, `KeyStore::complete`), releases the key or suspends the request at its recovery
//! point. A handler sees one handle: the
//! [`IdempotencyContext`](crate::IdempotencyContext) (or, on a transactional route,
//! `oncely_sqlx::Tx`, which holds the context) with one phase API: `checkpoint` with a typed
//! step, then the final response.
//!
//! A transactional claimer ([`ClaimerKind::Transactional`]) claims inside the handler's own
//! database transaction, so the handler's phases commit the claim, the recovery points and the
//! stored response themselves. They report each commit to the [`ClaimState`], which is plain
//! shared state, not a callback: [`ClaimState::phase_committed`] (the heartbeat starts at the
//! first), [`ClaimState::response_committed`] (the record is complete), and
//! [`ClaimState::rollback_started`] (a phase was dropped unfinished). After the handler the
//! layer reads it, and ends what the handler left (see [`ClaimerKind`]).

mod claimer;
mod heartbeat;
pub(crate) mod lease;
pub(crate) mod local;
mod state;

pub use claimer::{Claimer, ClaimerKind, StoreClaimer};
pub use state::ClaimState;

use crate::config::Config;
use crate::store_call::timed;
use local::Hold;
use oncely_core::{ClaimOutcome, ClaimRequest, Fingerprint, RecordKey, StoredRequest, UnixMillis};

/// What the claim call found.
pub(crate) enum Claimed {
    /// The store's answer; `sent` is when the claim call was sent (epoch milliseconds of the
    /// layer's clock), `hold` the key's turn in this process, if the claimer waits in it.
    Answer {
        outcome: ClaimOutcome,
        sent: UnixMillis,
        hold: Option<Hold>,
    },
    /// Another request of this process kept the key's turn for all of
    /// [`Claimer::local_wait`]: the request is in flight, and the store was not asked.
    LocalBusy,
    /// The store failed or did not answer within the store timeout (logged): fail closed.
    Failed,
}

/// Claims `id` for a request whose fingerprint is `fingerprint`, keeping `request` for the
/// completer, with the policy's lease, replay window and retention: one call of the layer's
/// [`Claimer`], bounded by the store timeout. On a claim, the claimer may put what the handler
/// needs (an open transaction) into `extensions`.
///
/// A duplicate of a claim this process is claiming or running waits first, holding no store
/// connection, until that claim has committed (see [`Claimer::local_wait`]).
pub(crate) async fn claim_key(
    config: &Config,
    id: &RecordKey,
    fingerprint: Fingerprint,
    request: StoredRequest,
    extensions: &mut http::Extensions,
) -> Claimed {
    let policy = &config.policy;
    let hold = match config.claimer.local_wait() {
        None => None,
        Some(bound) => match config.local.turn(id, bound).await {
            Some(hold) => Some(hold),
            None => return Claimed::LocalBusy,
        },
    };
    let claim = ClaimRequest::new(
        id.clone(),
        fingerprint,
        policy.lease,
        policy.replay_window,
        policy.retention,
    )
    .with_request(Some(request));
    #[cfg(feature = "metrics")]
    let started = std::time::Instant::now();
    let sent = config.clock.now_millis();
    let outcome = timed(config, config.claimer.claim(claim, extensions)).await;
    #[cfg(feature = "metrics")]
    crate::metrics::facade::claim(
        config.metrics.store_label(),
        match &outcome {
            Ok(ClaimOutcome::Claimed(_)) => "claimed",
            Ok(ClaimOutcome::Replay { .. }) => "replayed",
            Ok(ClaimOutcome::InFlight { .. }) => "in_flight",
            Ok(ClaimOutcome::Mismatch) => "mismatch",
            Ok(ClaimOutcome::NeedsAttention { .. }) => "needs_attention",
            Ok(_) => "unknown",
            Err(_) => "store_error",
        },
        started.elapsed(),
    );
    match outcome {
        Ok(outcome) => Claimed::Answer {
            outcome,
            sent,
            hold,
        },
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "idempotency claim failed; failing closed with 503");
            Claimed::Failed
        }
    }
}
