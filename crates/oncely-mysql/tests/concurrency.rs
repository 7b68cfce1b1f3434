//! Real concurrency against MySQL / MariaDB: many tasks on one key, spread over several pool
//! connections and several separate store instances (separate pools, as separate server
//! processes would have), counting side effects. Skipped when `ONCELY_TEST_MYSQL_URL` is unset.

mod common;

use oncely_conformance::{LEASE, RETENTION, claim_req, fp, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, IdempotencyKey, KeyStore, ManualClock, RecordKey, RecordState,
};
use oncely_mysql::MySqlStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TASKS: usize = 300;

#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    claimed: Vec<(ClaimKind, i64)>,
    in_flight: usize,
    replays: usize,
}

/// Fires `tasks` concurrent claims of `id`, round-robin over `stores`; every granted claim
/// counts one "side effect".
async fn storm(
    stores: &[Arc<MySqlStore>],
    id: &RecordKey,
    tasks: usize,
    effects: &AtomicU64,
) -> Tally {
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let store = stores[i % stores.len()].clone();
        let req = claim_req(id, r#"{"amount":100}"#);
        let start = start.clone();
        handles.push(tokio::spawn(async move {
            start.wait().await;
            store.claim(req).await
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

async fn instances(clock: &ManualClock) -> Option<Vec<Arc<MySqlStore>>> {
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(Arc::new(common::instance(clock, 6).await?));
    }
    Some(stores)
}

fn fresh_id(tag: &str) -> RecordKey {
    RecordKey::new(
        common::fresh_scope(tag),
        IdempotencyKey::new("pay-1").unwrap(),
    )
}

/// 300 concurrent identical claims of one key over 3 instances (6 connections each): exactly
/// one is granted (one side effect), 299 see it in flight. After the lease lapses, 300 more:
/// exactly one takeover. After completion, 300 more: 300 byte-identical replays. 10 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_claims_one_winner_across_instances() {
    let clock = ManualClock::starting_now();
    let Some(stores) = instances(&clock).await else {
        return;
    };
    for run in 0..10 {
        let id = fresh_id("storm");
        let effects = AtomicU64::new(0);

        let first = storm(&stores, &id, TASKS, &effects).await;
        assert_eq!(first.claimed, vec![(ClaimKind::New, 1)], "run {run}");
        assert_eq!(first.in_flight, TASKS - 1, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 1, "run {run}");

        clock.advance(LEASE + Duration::from_millis(1));
        let takeover = storm(&stores, &id, TASKS, &effects).await;
        assert_eq!(
            takeover.claimed,
            vec![(ClaimKind::Takeover, 2)],
            "run {run}"
        );
        assert_eq!(takeover.in_flight, TASKS - 1, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 2, "run {run}");

        stores[run % 3]
            .complete(
                &id,
                oncely_core::FencingToken(2),
                tricky_response(),
                RETENTION,
            )
            .await
            .unwrap();
        let replay = storm(&stores, &id, TASKS, &effects).await;
        assert_eq!(replay.replays, TASKS, "run {run}");
        assert_eq!(
            effects.load(Ordering::SeqCst),
            2,
            "run {run}: replays run nothing"
        );
    }
}

/// The deadlock of concurrent inserts of one key: a transaction claims a key and stays open
/// while 24 claims of the same key (over 3 instances) wait for it; then it rolls back. The
/// waiters' locks become gap locks under REPEATABLE READ, and their inserts deadlock each other
/// (InnoDB rolls victims back with error 1213). The store runs a victim's claim again: no claim
/// fails, exactly one is granted (one side effect), every other one sees it in flight. 10 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_of_a_rolled_back_claim_deadlock_and_one_wins() {
    let clock = ManualClock::starting_now();
    let Some(stores) = instances(&clock).await else {
        return;
    };
    for run in 0..10 {
        let id = fresh_id("deadlock");
        let effects = AtomicU64::new(0);
        let (outcome, first) = stores[0]
            .claim_tx(&claim_req(&id, r#"{"amount":100}"#))
            .await
            .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Claimed(_)), "{outcome:?}");
        let waiters = {
            let stores = stores.clone();
            let id = id.clone();
            tokio::spawn(async move { storm(&stores, &id, 24, &AtomicU64::new(0)).await })
        };
        // Long enough for the waiters to queue on the uncommitted row (they wait up to 4 s).
        tokio::time::sleep(Duration::from_millis(500)).await;
        first
            .expect("the claim's transaction")
            .rollback()
            .await
            .unwrap();
        let tally = waiters.await.unwrap();
        effects.fetch_add(tally.claimed.len() as u64, Ordering::SeqCst);
        assert_eq!(tally.claimed, vec![(ClaimKind::New, 1)], "run {run}");
        assert_eq!(tally.in_flight, 23, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 1, "run {run}");
    }
}

/// Another instance (fresh pool, no local state) replays byte for byte (see "Replay on a cold
/// process" in docs/DESIGN.md), and the stored fingerprint (with its version) matches the one it
/// computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_instance_replays() {
    let clock = ManualClock::starting_now();
    let Some(a) = common::store(clock.clone()).await else {
        return;
    };
    let id = fresh_id("cold");
    let ClaimOutcome::Claimed(c) = a.claim(claim_req(&id, r#"{"amount":100}"#)).await.unwrap()
    else {
        panic!("first claim")
    };
    a.complete(&id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    a.pool().close().await;
    drop(a);

    clock.advance(Duration::from_secs(600));
    let b = common::store(clock.clone()).await.unwrap();
    // The retry serializes the same JSON differently: still the same fingerprint.
    match b
        .claim(claim_req(&id, r#"{ "amount" : 100 }"#))
        .await
        .unwrap()
    {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => {
            assert_eq!(response, tricky_response());
            assert_eq!(completed_at, clock.now_millis() - 600_000);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let rec = b.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, fp(r#"{"amount":100}"#));
    assert_eq!(rec.fingerprint.version(), 1);
    assert!(matches!(rec.state, RecordState::Complete { .. }));
}
