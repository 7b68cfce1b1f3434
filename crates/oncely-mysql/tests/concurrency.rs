//! Real concurrency against MySQL / MariaDB: many tasks on one key, spread over several pool
//! connections and several separate store instances (separate pools, as separate server
//! processes would have), counting side effects. Skipped when `ONCELY_TEST_MYSQL_URL` is unset.

mod common;

use oncely_conformance::claim_req;
use oncely_conformance::instances::{one_winner_across_instances, storm};
use oncely_core::{ClaimKind, ClaimOutcome, IdempotencyKey, ManualClock, RecordKey};
use oncely_mysql::MySqlStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TASKS: usize = 300;

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
    one_winner_across_instances(&stores, &clock, || fresh_id("storm"), TASKS, 10).await;
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
    let cold = async {
        a.pool().close().await;
        clock.advance(Duration::from_secs(600));
        common::store(clock.clone()).await.unwrap()
    };
    oncely_conformance::instances::cold_instance_replays(&a, &fresh_id("cold"), &clock, cold).await;
}
