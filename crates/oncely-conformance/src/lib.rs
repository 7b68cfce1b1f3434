//! # oncely-conformance
//!
//! The backend conformance suite of Oncely's key stores: the same scenarios, concurrency
//! included, for every [`KeyStore`](oncely_core::KeyStore) and its
//! [`Maintenance`](oncely_core::Maintenance) operations (the reaper's and the completer's
//! scenarios need both; the others only the request path).
//!
//! A backend runs it with one line in an integration test:
//!
//! ```ignore
//! // tests/conformance.rs of a store crate
//! async fn make(clock: oncely_core::ManualClock) -> Option<MyStore> {
//!     // Return None (after printing why) to skip, e.g. when a database URL is unset.
//!     Some(MyStore::connect_with_clock("...", std::sync::Arc::new(clock)).await.unwrap())
//! }
//! oncely_conformance::conformance_tests!(make);
//! ```
//!
//! The factory gets a [`ManualClock`](oncely_core::ManualClock) that the store must read for
//! "now": the scenarios move it to lapse leases and replay windows without sleeping. Every
//! scenario works in its own fresh scope, so the suite can share one database with other tests
//! running at the same time; the reaper scenario runs its clock in the year 2000 and the
//! abandoned-list scenario in 2002, so that each only ever touches its own records (and the
//! reaper never deletes the list's).
//!
//! The scenarios, by concept (each also callable on its own, with the same factory):
//!
//! - [`claim`]: the key state machine: claim, replay, in flight, mismatch, release, the replay
//!   window, scopes, and many concurrent claims of one key.
//! - [`fencing`]: leases and fencing tokens: a takeover fences the old owner, a zero lease is
//!   still a lease, concurrent stale writes.
//! - [`completion`]: what a completion stores: the response byte for byte, the stored request
//!   dropped, records written before responses kept trailers.
//! - [`maintenance`]: the [`Maintenance`](oncely_core::Maintenance) operations: the reaper, the
//!   abandoned list, the completer's attempts and the mark for a person.
//! - [`operator`]: the [`Operator`](oncely_core::Operator) operations (what a person does to a
//!   record: list, release, resolve, retry), fenced like every store write. A store that
//!   implements [`Operator`](oncely_core::Operator) runs them with
//!   [`operator_conformance_tests!`] beside [`conformance_tests!`]:
//!
//!   ```ignore
//!   oncely_conformance::conformance_tests!(make);
//!   oncely_conformance::operator_conformance_tests!(make);
//!   ```
//! - [`fixtures`]: the requests, responses and durations the scenarios use, for a store's own
//!   tests too.
//! - [`instances`]: scenarios over several instances of one store, which a store's own tests
//!   run on instances they make (many concurrent claims over them, a replay by a cold one).

/// The store the factory makes for `$clock`, or return from the scenario (the factory printed
/// why it skips).
macro_rules! skip_unless {
    ($make:expr, $clock:expr) => {
        match $crate::fixtures::store_of($make, $clock).await {
            Some(s) => s,
            None => return,
        }
    };
}

pub mod claim;
pub mod completion;
pub mod fencing;
pub mod fixtures;
pub mod instances;
pub mod maintenance;
pub mod operator;
pub mod plans;

pub use claim::{
    claim_complete_replay, concurrent_claims_one_winner, in_flight_and_renew,
    mismatch_in_every_state, release_then_reclaim, replay_window_expiry, scopes_are_independent,
};
pub use completion::{
    completion_drops_the_stored_request, legacy_headers_column, legacy_record_still_replays,
    response_fidelity,
};
pub use fencing::{
    concurrent_stale_writes_are_fenced, lease_takeover_fences_old_owner,
    zero_lease_is_still_a_lease,
};
pub use fixtures::{
    LEASE, RETENTION, WINDOW, claim_req, fp, fresh_id, grpc_response, tricky_response,
};
pub use maintenance::{
    list_abandoned_finds_lapsed_leases, marked_record_is_never_claimed_again,
    reaper_respects_retention_and_batches, redrive_attempts_are_counted_once_and_kept,
};
pub use operator::{
    operator_changes_race_completions, operator_lists_with_filters_and_pages,
    operator_release_fences_the_old_owner, operator_resolve_replays_the_decided_answer,
    operator_retry_lifts_the_mark,
};

/// Generates one `#[tokio::test]` per conformance scenario for a store factory
/// `async fn(ManualClock) -> Option<S>` (return `None`, after printing why, to skip).
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@tests $make;
            claim_complete_replay,
            in_flight_and_renew,
            mismatch_in_every_state,
            lease_takeover_fences_old_owner,
            zero_lease_is_still_a_lease,
            completion_drops_the_stored_request,
            release_then_reclaim,
            replay_window_expiry,
            scopes_are_independent,
            response_fidelity,
            concurrent_claims_one_winner,
            concurrent_stale_writes_are_fenced,
            reaper_respects_retention_and_batches,
            list_abandoned_finds_lapsed_leases,
            redrive_attempts_are_counted_once_and_kept,
            marked_record_is_never_claimed_again
        );
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::$name(&$make).await;
            }
        )*
    };
}

/// Generates one `#[tokio::test]` per [`operator`] scenario for a store factory
/// `async fn(ManualClock) -> Option<S>` whose store implements
/// [`Operator`](oncely_core::Operator) (the same factory as [`conformance_tests!`]'s; return
/// `None`, after printing why, to skip).
#[macro_export]
macro_rules! operator_conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@tests $make;
            operator_lists_with_filters_and_pages,
            operator_release_fences_the_old_owner,
            operator_resolve_replays_the_decided_answer,
            operator_retry_lifts_the_mark,
            operator_changes_race_completions
        );
    };
}
