//! A claim inside a transaction (`claim_tx`, `claim_in`) that waits for another open
//! transaction's claim of the same key, and what it answers once that transaction ends: the
//! insert waits on the uncommitted row; after a commit it finds the row and its locking read
//! reads the committed record; after a rollback the insert goes through and the waiting request
//! claims the key. The wait is bounded, also on a pool whose sessions run with the server's
//! 50-second default: on MariaDB by `MySqlStore::CLAIM_WAIT` (1 second of tries that do not
//! wait for the key), on MySQL 8 by the 4-second `innodb_lock_wait_timeout` that every claim
//! transaction sets.
//!
//! Skipped, with a message, when `ONCELY_TEST_MYSQL_URL` is unset (`.ci/run` sets it).

mod common;

use oncely_conformance::claim_req;
use oncely_core::{
    ClaimKind, ClaimOutcome, IdempotencyKey, KeyStore, ManualClock, RecordKey, StoredResponse,
};
use oncely_mysql::MySqlStore;
use std::time::Duration;

/// Transaction A claims the key and stays open; B's claim (`claim_tx`, or the pool-level
/// `KeyStore::claim` when `pooled`) starts and must still be waiting 300 milliseconds later.
/// Returns A's transaction, its token and B's pending claim.
async fn b_waits_for_a(
    store: &MySqlStore,
    id: &RecordKey,
    pooled: bool,
) -> (
    sqlx::Transaction<'static, sqlx::MySql>,
    oncely_core::FencingToken,
    tokio::task::JoinHandle<ClaimOutcome>,
) {
    let (outcome, a) = store.claim_tx(&claim_req(id, "{}")).await.expect("claim A");
    let ClaimOutcome::Claimed(claim) = outcome else {
        panic!("A claims a new key: {outcome:?}");
    };
    let b = {
        let (store, id) = (store.clone(), id.clone());
        tokio::spawn(async move {
            if pooled {
                return store
                    .claim(claim_req(&id, "{}"))
                    .await
                    .expect("claim B is answered, not failed");
            }
            let (outcome, b) = store
                .claim_tx(&claim_req(&id, "{}"))
                .await
                .expect("claim B is answered, not failed");
            if let Some(b) = b {
                b.commit().await.expect("commit B");
            }
            outcome
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished(), "B waits while A's claim is uncommitted");
    (a.expect("A's transaction"), claim.token, b)
}

/// B's answer once A's transaction ended (bounded, so a wait that never ends fails the test).
async fn answer_of(b: tokio::task::JoinHandle<ClaimOutcome>) -> ClaimOutcome {
    tokio::time::timeout(Duration::from_secs(20), b)
        .await
        .expect("B is answered once A's transaction ended")
        .expect("B's task")
}

/// A store on a plain pool: its sessions keep the server's `innodb_lock_wait_timeout` (50
/// seconds by default), so only the claim transaction's own setting bounds a wait.
async fn store() -> Option<MySqlStore> {
    common::instance(&ManualClock::starting_now(), 4).await
}

fn fresh_id() -> RecordKey {
    RecordKey::new(
        common::fresh_scope("claim-wait"),
        IdempotencyKey::new("k-1").unwrap(),
    )
}

#[tokio::test]
async fn a_claim_that_waited_for_a_completed_claim_replays_it() {
    let Some(store) = store().await else { return };
    for pooled in [false, true] {
        let id = fresh_id();
        let (mut a, token, b) = b_waits_for_a(&store, &id, pooled).await;
        let response = StoredResponse::new(
            201,
            vec![("content-type".to_owned(), b"application/json".to_vec())],
            br#"{"id":"pay_1"}"#.to_vec(),
        );
        store
            .complete_in(&mut a, &id, token, &response, Duration::from_secs(3600))
            .await
            .expect("complete A");
        a.commit().await.expect("commit A");
        match answer_of(b).await {
            ClaimOutcome::Replay { response: got, .. } => assert_eq!(got, response),
            other => panic!("B replays A's committed response (pooled {pooled}): {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_claim_that_waited_for_a_committed_in_flight_claim_is_in_flight() {
    let Some(store) = store().await else { return };
    let id = fresh_id();
    let (a, _token, b) = b_waits_for_a(&store, &id, false).await;
    // A's first phase commits its claim only (a multi-step request at its first checkpoint).
    a.commit().await.expect("commit A");
    let outcome = answer_of(b).await;
    assert!(
        matches!(outcome, ClaimOutcome::InFlight { .. }),
        "A's live lease holds the key: {outcome:?}"
    );
}

#[tokio::test]
async fn a_claim_that_waited_for_a_rolled_back_claim_claims_the_key() {
    let Some(store) = store().await else { return };
    for pooled in [false, true] {
        let id = fresh_id();
        let (a, _token, b) = b_waits_for_a(&store, &id, pooled).await;
        a.rollback().await.expect("roll A back");
        match answer_of(b).await {
            ClaimOutcome::Claimed(claim) => {
                assert_eq!(claim.kind, ClaimKind::New, "nothing of A's remains");
                assert_eq!(claim.token.0, 1);
            }
            other => panic!("B claims the key A gave up (pooled {pooled}): {other:?}"),
        }
    }
}

/// A transaction that holds the key past the bound: the waiting claim is answered in flight
/// (never an error, never the server's 50-second wait: the test's own bound is 20 seconds),
/// and its transaction writes nothing; once A commits, the key is A's.
#[tokio::test]
async fn a_claim_past_the_lock_wait_bound_is_in_flight() {
    let Some(store) = store().await else { return };
    let seen: u64 = sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(seen, 50, "the plain pool keeps the server's default");
    let id = fresh_id();
    let (a, token, b) = b_waits_for_a(&store, &id, false).await;
    let outcome = answer_of(b).await;
    assert!(
        matches!(outcome, ClaimOutcome::InFlight { .. }),
        "past the bound: {outcome:?}"
    );
    a.commit().await.expect("commit A");
    let rec = store.get(&id).await.unwrap().expect("A's record");
    assert_eq!((rec.token, rec.state_name()), (token, "in_flight"));
}
