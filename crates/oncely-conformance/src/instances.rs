//! Scenarios over several instances of one store (separate pools, as separate server processes
//! would have): many concurrent claims of one key spread over them, and a replay by an
//! instance that shares nothing with the one that completed. The SQL stores' own tests run
//! them on their instances (the factories differ: pool sizes, session settings).

use crate::fixtures::{LEASE, RETENTION, claim_req, fp, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, ClaimRequest, Clock, FencingToken, KeyStore, ManualClock, RecordKey,
    RecordState, StoreError,
};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a [`storm`] of claims was answered.
#[derive(Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tally {
    /// The granted claims: their kind and fencing token, in the order the tasks were spawned.
    pub claimed: Vec<(ClaimKind, i64)>,
    /// How many were answered in flight.
    pub in_flight: usize,
    /// How many were replays (each checked byte for byte against [`tricky_response`]).
    pub replays: usize,
}

/// Fires `tasks` concurrent claims of `id` (the same body), released together by a barrier,
/// round-robin over `stores`; every granted claim adds one "side effect" to `effects`.
///
/// # Panics
///
/// When a claim fails, a replay is not [`tricky_response`] byte for byte, or an answer is
/// neither a claim, in flight nor a replay.
pub async fn storm<S: KeyStore>(
    stores: &[Arc<S>],
    id: &RecordKey,
    tasks: usize,
    effects: &AtomicU64,
) -> Tally {
    storm_by(stores, id, tasks, effects, |store, req| async move {
        store.claim(req).await
    })
    .await
}

/// [`storm`] with each claim made by `claim` (a store's own claim path, such as a
/// transactional handler's claim that commits its transaction) instead of
/// [`KeyStore::claim`].
///
/// # Panics
///
/// As [`storm`].
pub async fn storm_by<S, F, Fut>(
    stores: &[Arc<S>],
    id: &RecordKey,
    tasks: usize,
    effects: &AtomicU64,
    claim: F,
) -> Tally
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, ClaimRequest) -> Fut,
    Fut: Future<Output = Result<ClaimOutcome, StoreError>> + Send + 'static,
{
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let store = stores[i % stores.len()].clone();
        // Not started until awaited, after the barrier.
        let claimed = claim(store, claim_req(id, r#"{"amount":100}"#));
        let start = start.clone();
        handles.push(tokio::spawn(async move {
            start.wait().await;
            claimed.await
        }));
    }
    let mut tally = Tally::default();
    for t in handles {
        match t.await.expect("task").expect("no claim may fail") {
            ClaimOutcome::Claimed(c) => {
                effects.fetch_add(1, Ordering::SeqCst);
                tally.claimed.push((c.kind, c.token.0));
            }
            ClaimOutcome::InFlight { .. } => tally.in_flight += 1,
            ClaimOutcome::Replay { response, .. } => {
                assert_eq!(response, tricky_response(), "a replay is byte-identical");
                tally.replays += 1;
            }
            // Mismatch, needs attention, or an outcome this test does not know.
            other => panic!("same body, never marked: {other:?}"),
        }
    }
    tally
}

/// `runs` times, on a fresh key from `fresh_id`: `tasks` concurrent identical claims over
/// `stores` grant exactly one (one side effect), the others see it in flight; after the lease
/// lapses (on `clock`, which the stores read), `tasks` more: exactly one takeover (token 2);
/// after its completion, `tasks` more: as many byte-identical replays, and no side effect.
///
/// # Panics
///
/// When any of that does not hold (the run is named).
pub async fn one_winner_across_instances<S: KeyStore>(
    stores: &[Arc<S>],
    clock: &ManualClock,
    fresh_id: impl Fn() -> RecordKey,
    tasks: usize,
    runs: usize,
) {
    one_winner_across_instances_by(
        stores,
        clock,
        fresh_id,
        tasks,
        runs,
        |store, req| async move { store.claim(req).await },
    )
    .await;
}

/// [`one_winner_across_instances`] with each claim made by `claim` (see [`storm_by`]); the
/// completion before the replays is [`KeyStore::complete`].
///
/// # Panics
///
/// As [`one_winner_across_instances`].
pub async fn one_winner_across_instances_by<S, F, Fut>(
    stores: &[Arc<S>],
    clock: &ManualClock,
    fresh_id: impl Fn() -> RecordKey,
    tasks: usize,
    runs: usize,
    claim: F,
) where
    S: KeyStore,
    F: Fn(Arc<S>, ClaimRequest) -> Fut,
    Fut: Future<Output = Result<ClaimOutcome, StoreError>> + Send + 'static,
{
    for run in 0..runs {
        let id = fresh_id();
        let effects = AtomicU64::new(0);

        let first = storm_by(stores, &id, tasks, &effects, &claim).await;
        assert_eq!(first.claimed, vec![(ClaimKind::New, 1)], "run {run}");
        assert_eq!(first.in_flight, tasks - 1, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 1, "run {run}");

        clock.advance(LEASE + Duration::from_millis(1));
        let takeover = storm_by(stores, &id, tasks, &effects, &claim).await;
        assert_eq!(
            takeover.claimed,
            vec![(ClaimKind::Takeover, 2)],
            "run {run}"
        );
        assert_eq!(takeover.in_flight, tasks - 1, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 2, "run {run}");

        stores[run % stores.len()]
            .complete(&id, FencingToken(2), tricky_response(), RETENTION)
            .await
            .unwrap();
        let replay = storm_by(stores, &id, tasks, &effects, &claim).await;
        assert_eq!(replay.replays, tasks, "run {run}");
        assert_eq!(
            effects.load(Ordering::SeqCst),
            2,
            "run {run}: replays run nothing"
        );
    }
}

/// docs/DESIGN.md, "Replay on a cold process": instance `a` claims and completes `id`; then
/// `cold` (which the caller writes to close `a`'s pool, move `clock` on and connect another
/// instance, sharing nothing with `a`) gives instance `b`, which replays byte for byte a retry
/// whose JSON is serialized differently (docs/DESIGN.md, "Serializer differences"), with the
/// completion time `a` stored, and reads the record with the fingerprint (and version) it
/// computes itself.
///
/// # Panics
///
/// When any of that does not hold.
pub async fn cold_instance_replays<S: KeyStore>(
    a: &S,
    id: &RecordKey,
    clock: &ManualClock,
    cold: impl Future<Output = S>,
) {
    let ClaimOutcome::Claimed(c) = a.claim(claim_req(id, r#"{"amount":100}"#)).await.unwrap()
    else {
        panic!("first claim")
    };
    let completed = clock.now_millis();
    a.complete(id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();

    let b = cold.await;
    match b
        .claim(claim_req(id, r#"{ "amount" : 100 }"#))
        .await
        .unwrap()
    {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => {
            assert_eq!(response, tricky_response());
            assert_eq!(completed_at, completed);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let rec = b.get(id).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, fp(r#"{"amount":100}"#));
    assert_eq!(rec.fingerprint.version(), 1);
    assert!(matches!(rec.state, RecordState::Complete { .. }));
}
