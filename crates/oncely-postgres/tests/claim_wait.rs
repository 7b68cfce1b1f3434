//! A claim inside a transaction (`claim_in`) that waits for another open transaction's claim
//! of the same key, and what it answers once that transaction ends: the bare insert waits on
//! the uncommitted row; after a commit it inserts nothing and its own `SELECT` (a statement
//! with a fresh snapshot under READ COMMITTED) reads the committed record; after a rollback
//! the insert goes through and the waiting request claims the key.
//!
//! Skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset (`.ci/run` sets it).

mod common;

use oncely_conformance::claim_req;
use oncely_core::{
    ClaimKind, ClaimOutcome, IdempotencyKey, RecordKey, StoredResponse, SystemClock,
};
use oncely_postgres::PostgresStore;
use std::time::Duration;

/// Transaction A claims the key and stays open; B's claim starts and must still be waiting
/// 300 milliseconds later. Returns A's transaction, its token and B's pending claim.
async fn b_waits_for_a(
    store: &PostgresStore,
    id: &RecordKey,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    oncely_core::FencingToken,
    tokio::task::JoinHandle<ClaimOutcome>,
) {
    let mut a = store.begin_tx().await.expect("begin A");
    let ClaimOutcome::Claimed(claim) = store
        .claim_in(&mut a, &claim_req(id, "{}"))
        .await
        .expect("claim A")
    else {
        panic!("A claims a new key");
    };
    let b = {
        let (store, id) = (store.clone(), id.clone());
        tokio::spawn(async move {
            let mut b = store.begin_tx().await.expect("begin B");
            let outcome = store
                .claim_in(&mut b, &claim_req(&id, "{}"))
                .await
                .expect("claim B is answered, not failed");
            if matches!(outcome, ClaimOutcome::Claimed(_)) {
                b.commit().await.expect("commit B");
            }
            outcome
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished(), "B waits while A's claim is uncommitted");
    (a, claim.token, b)
}

/// B's answer once A's transaction ended (bounded, so a wait that never ends fails the test).
async fn answer_of(b: tokio::task::JoinHandle<ClaimOutcome>) -> ClaimOutcome {
    tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("B is answered once A's transaction ended")
        .expect("B's task")
}

async fn store() -> Option<PostgresStore> {
    common::store(SystemClock).await
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
    let id = fresh_id();
    let (mut a, token, b) = b_waits_for_a(&store, &id).await;
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
    let outcome = answer_of(b).await;
    match outcome {
        ClaimOutcome::Replay { response: got, .. } => assert_eq!(got, response),
        other => panic!("B replays A's committed response: {other:?}"),
    }
}

#[tokio::test]
async fn a_claim_that_waited_for_a_committed_in_flight_claim_is_in_flight() {
    let Some(store) = store().await else { return };
    let id = fresh_id();
    let (a, _token, b) = b_waits_for_a(&store, &id).await;
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
    let id = fresh_id();
    let (a, _token, b) = b_waits_for_a(&store, &id).await;
    a.rollback().await.expect("roll A back");
    let outcome = answer_of(b).await;
    match outcome {
        ClaimOutcome::Claimed(claim) => {
            assert_eq!(claim.kind, ClaimKind::New, "nothing of A's remains");
            assert_eq!(claim.token.0, 1);
        }
        other => panic!("B claims the key A gave up: {other:?}"),
    }
}
