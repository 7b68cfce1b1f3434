//! The claim of one request: the claim call itself (`claim_key`, here), and what the layer
//! knows of the claim while the handler runs ([`ClaimState`] in `state.rs`: its lease, its
//! progress, its heartbeat in `heartbeat.rs`).
//!
//! What the claim rests on lies below this folder, in files the layer's configuration and its
//! drain read too: the plug point that makes the claim ([`Claimer`](crate::Claimer), in
//! `src/claimer.rs`), the lease as its heartbeat learned it and the outside calls in flight
//! (`src/lease.rs`), and the duplicates of this process's own claims waiting in the process
//! (`src/local_claims.rs`).
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
//! A transactional claimer ([`ClaimerKind::Transactional`](crate::ClaimerKind::Transactional)) claims inside the handler's own
//! database transaction, so the handler's phases commit the claim, the recovery points and the
//! stored response themselves. They report each commit to the [`ClaimState`], which is plain
//! shared state, not a callback: [`ClaimState::phase_committed`] (the heartbeat starts at the
//! first), [`ClaimState::response_committed`] (the record is complete), and
//! [`ClaimState::rollback_started`] (a phase was dropped unfinished). After the handler the
//! layer reads it, and ends what the handler left (see [`ClaimerKind`](crate::ClaimerKind)).

pub(crate) mod heartbeat;
mod state;

pub use state::ClaimState;

use crate::config::Config;
use crate::local_claims::Hold;
use crate::store_call::timed;
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
    /// [`Claimer::local_wait`](crate::Claimer::local_wait): the request is in flight, and the store was not asked.
    LocalBusy,
    /// The store failed or did not answer within the store timeout (logged): fail closed.
    Failed,
}

/// Claims `id` for a request whose fingerprint is `fingerprint`, keeping `request` for the
/// completer, with the policy's lease, replay window and retention: one call of the layer's
/// [`Claimer`](crate::Claimer), bounded by the store timeout. On a claim, the claimer may put what the handler
/// needs (an open transaction) into `extensions`.
///
/// A duplicate of a claim this process is claiming or running waits first, holding no store
/// connection, until that claim has committed (see [`Claimer::local_wait`](crate::Claimer::local_wait)).
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
    let started = std::time::Instant::now();
    let sent = config.clock.now_millis();
    let outcome = timed(config, config.claimer.claim(claim, extensions)).await;
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
