//! Transactional mode: a phase's business writes commit together with its recovery point or
//! stored response, or not at all.

mod common;

use common::TempStore;
use oncely_core::conformance::{LEASE, RETENTION, claim_req, fresh_id, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, FencingToken, KeyStore, ManualClock, RecordKey, RecordState,
    StoreError, StoredResponse,
};
use oncely_sqlite::{SqliteStore, SqliteStoreError};
use sqlx::sqlite::SqlitePoolOptions;
use std::sync::Arc;
use std::time::Duration;

const CREATE_PAYMENTS: &str = "CREATE TABLE IF NOT EXISTS payments (id TEXT PRIMARY KEY, scope TEXT NOT NULL, amount INTEGER NOT NULL)";
const INSERT_PAYMENT: &str = "INSERT INTO payments (id, scope, amount) VALUES (?1, ?2, ?3)";
const COUNT_PAYMENTS: &str = "SELECT COUNT(*) FROM payments WHERE scope = ?1";

async fn open() -> (TempStore, ManualClock) {
    let clock = ManualClock::starting_now();
    let store = TempStore::open(clock.clone()).await;
    sqlx::query(CREATE_PAYMENTS)
        .execute(store.pool())
        .await
        .unwrap();
    (store, clock)
}

async fn payments(store: &SqliteStore, id: &RecordKey) -> i64 {
    sqlx::query_scalar(COUNT_PAYMENTS)
        .bind(id.scope.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn claim(store: &SqliteStore, id: &RecordKey) -> oncely_core::Claim {
    match store.claim(claim_req(id, "{}")).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn insert_payment(phase: &mut oncely_sqlite::Phase, id: &RecordKey, pay: &str) {
    sqlx::query(INSERT_PAYMENT)
        .bind(pay)
        .bind(id.scope.as_str())
        .bind(100_i64)
        .execute(&mut **phase.tx())
        .await
        .unwrap();
}

/// Case S8: the business row and the stored response commit together. Before the commit,
/// neither is visible to anyone else; after it, both are, and a retry replays.
#[tokio::test]
async fn business_row_and_response_commit_together() {
    let (store, _clock) = open().await;
    let id = fresh_id();
    let c = claim(&store, &id).await;
    let mut phase = store.begin_phase(&id, c.token, LEASE).await.unwrap();
    assert_eq!(phase.token(), c.token);
    assert_eq!(phase.id(), &id);
    insert_payment(&mut phase, &id, "pay_s8").await;
    // Another connection sees neither the row nor a completion yet.
    assert_eq!(payments(&store, &id).await, 0);
    assert!(matches!(
        store.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    phase.complete(tricky_response(), RETENTION).await.unwrap();
    assert_eq!(payments(&store, &id).await, 1);
    match store.claim(claim_req(&id, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, tricky_response()),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// A phase dropped before it finishes (the process "crashed" mid-phase) leaves no business row
/// and the claim in flight; after the lease a retry takes over with no recovery point.
#[tokio::test]
async fn dropped_phase_commits_nothing() {
    let (store, clock) = open().await;
    let id = fresh_id();
    let c = claim(&store, &id).await;
    let mut phase = store.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_payment(&mut phase, &id, "pay_dropped").await;
    drop(phase);
    assert_eq!(payments(&store, &id).await, 0);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().state_name(),
        "in_flight"
    );
    clock.advance(LEASE + Duration::from_millis(1));
    let t = claim(&store, &id).await;
    assert_eq!(t.kind, ClaimKind::Takeover);
    assert_eq!(t.recovery_point, None);
}

/// An owner that was taken over cannot begin a phase (Fenced, nothing written); and a phase
/// whose finishing write finds the record no longer its own is Fenced and its business write is
/// rolled back with it.
#[tokio::test]
async fn taken_over_owner_is_fenced_and_commits_nothing() {
    let (store, clock) = open().await;
    let id = fresh_id();
    let old = claim(&store, &id).await;
    clock.advance(LEASE + Duration::from_millis(1));
    let new = claim(&store, &id).await;
    assert_eq!(new.kind, ClaimKind::Takeover);
    assert!(matches!(
        store.begin_phase(&id, old.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
    // The old owner's begin_phase wrote nothing: the new owner's lease is untouched.
    match store.get(&id).await.unwrap().unwrap().state {
        RecordState::InFlight {
            lease_expires_at, ..
        } => assert_eq!(lease_expires_at, new.lease_expires_at),
        other => panic!("{other:?}"),
    }

    // The finishing write is conditional too. Inside one SQLite transaction no other
    // connection can change the record, so the only way to make it fail is from the phase's
    // own transaction: the record moves on to another token there, then `complete` is fenced
    // and the business row goes with the rollback.
    let mut phase = store.begin_phase(&id, new.token, LEASE).await.unwrap();
    insert_payment(&mut phase, &id, "pay_fenced").await;
    sqlx::query("UPDATE oncely_idempotency_keys SET token = token + 1 WHERE scope = ?1")
        .bind(id.scope.as_str())
        .execute(&mut **phase.tx())
        .await
        .unwrap();
    assert!(matches!(
        phase.complete(tricky_response(), RETENTION).await,
        Err(StoreError::Fenced)
    ));
    assert_eq!(payments(&store, &id).await, 0);
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        rec.token, new.token,
        "the in-transaction change was rolled back"
    );
    assert_eq!(rec.state_name(), "in_flight");
}

/// While a phase is open its lease may lapse, but a takeover cannot interleave: the claim
/// waits for SQLite's write lock and, once the phase commits its response, replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_cannot_interleave_with_an_open_phase() {
    let (store, clock) = open().await;
    let store = Arc::new(store);
    let id = fresh_id();
    let c = claim(&store, &id).await;
    let mut phase = store.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_payment(&mut phase, &id, "pay_slow").await;
    clock.advance(LEASE + Duration::from_secs(1));
    let contender = {
        let store = store.clone();
        let id = id.clone();
        tokio::spawn(async move { store.claim(claim_req(&id, "{}")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!contender.is_finished(), "the takeover waits for the phase");
    phase.complete(tricky_response(), RETENTION).await.unwrap();
    match contender.await.unwrap().unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, tricky_response()),
        other => panic!("expected the phase's response, got {other:?}"),
    }
    assert_eq!(payments(&store, &id).await, 1);
}

/// rollback_and_release leaves no business row, and the key is claimable again as new (its
/// failure was not stored), with a larger token.
#[tokio::test]
async fn rollback_and_release_frees_the_key() {
    let (store, _clock) = open().await;
    let id = fresh_id();
    let c = claim(&store, &id).await;
    let mut phase = store.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_payment(&mut phase, &id, "pay_rolled_back").await;
    phase.rollback_and_release().await.unwrap();
    assert_eq!(payments(&store, &id).await, 0);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().state,
        RecordState::Released
    );
    let again = claim(&store, &id).await;
    assert_eq!(again.kind, ClaimKind::New);
    assert_eq!(again.token, FencingToken(c.token.0 + 1));
    // The released owner's token is fenced from then on.
    assert!(matches!(
        store.begin_phase(&id, c.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
}

/// A multi-step request: phase 1 commits its row and recovery point; the owner dies; after the
/// lease a retry takes over at that recovery point (the row is there, once), the dead owner is
/// fenced, and the new owner's last phase completes.
#[tokio::test]
async fn checkpoint_then_takeover_resumes_at_the_recovery_point() {
    let (store, clock) = open().await;
    let id = fresh_id();
    let first = claim(&store, &id).await;
    let mut phase = store.begin_phase(&id, first.token, LEASE).await.unwrap();
    insert_payment(&mut phase, &id, "pay_multi").await;
    phase.checkpoint("payment_recorded").await.unwrap();
    assert_eq!(payments(&store, &id).await, 1);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().recovery_point(),
        Some("payment_recorded")
    );

    // The checkpoint renewed the lease from its own time.
    clock.advance(LEASE - Duration::from_millis(1));
    assert!(matches!(
        store.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    clock.advance(Duration::from_millis(2));
    let resumed = claim(&store, &id).await;
    assert_eq!(resumed.kind, ClaimKind::Takeover);
    assert_eq!(resumed.recovery_point.as_deref(), Some("payment_recorded"));
    assert!(matches!(
        store.begin_phase(&id, first.token, LEASE).await,
        Err(StoreError::Fenced)
    ));

    let mut last = store.begin_phase(&id, resumed.token, LEASE).await.unwrap();
    // The resumed request sees phase 1's row and does not insert it again.
    let existing: i64 = sqlx::query_scalar(COUNT_PAYMENTS)
        .bind(id.scope.as_str())
        .fetch_one(&mut **last.tx())
        .await
        .unwrap();
    assert_eq!(existing, 1);
    let response = StoredResponse::new(
        201,
        vec![("content-type".into(), b"application/json".to_vec())],
        br#"{"id":"pay_multi"}"#.to_vec(),
    );
    last.complete(response.clone(), RETENTION).await.unwrap();
    match store.claim(claim_req(&id, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response: r, .. } => assert_eq!(r, response),
        other => panic!("{other:?}"),
    }
    assert_eq!(payments(&store, &id).await, 1);
}

/// If the phase's transaction ends behind its back (here an explicit ROLLBACK, as SQLite does
/// by itself after some errors), `complete` records nothing instead of committing the response
/// without the business writes, and the pooled connection stays usable afterwards.
#[tokio::test]
async fn lost_transaction_records_nothing_and_the_connection_recovers() {
    let clock = ManualClock::starting_now();
    let tmp = TempStore::open(clock.clone()).await;
    // One connection, so every later operation reuses the one the phase had.
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(oncely_sqlite::connect_options(tmp.path().to_str().unwrap()).unwrap())
        .await
        .unwrap();
    let store = SqliteStore::from_pool(pool, Arc::new(clock.clone()));
    sqlx::query(CREATE_PAYMENTS)
        .execute(store.pool())
        .await
        .unwrap();

    for finish in ["complete", "checkpoint", "release"] {
        let id = fresh_id();
        let c = claim(&store, &id).await;
        let mut phase = store.begin_phase(&id, c.token, LEASE).await.unwrap();
        insert_payment(&mut phase, &id, &format!("pay_lost_{finish}")).await;
        sqlx::query("ROLLBACK")
            .execute(&mut **phase.tx())
            .await
            .unwrap();
        let result = match finish {
            "complete" => phase.complete(tricky_response(), RETENTION).await,
            "checkpoint" => phase.checkpoint("late").await,
            _ => phase.rollback_and_release().await,
        };
        assert_eq!(payments(&store, &id).await, 0, "{finish}");
        let rec = store.get(&id).await.unwrap().unwrap();
        if finish == "release" {
            // Nothing to keep: the key is released all the same.
            result.unwrap();
            assert_eq!(rec.state, RecordState::Released);
        } else {
            match result {
                Err(StoreError::Unavailable(e)) => assert!(
                    matches!(
                        e.downcast_ref::<SqliteStoreError>(),
                        Some(SqliteStoreError::PhaseTransactionLost)
                    ),
                    "{finish}: {e}"
                ),
                other => panic!("{finish}: expected PhaseTransactionLost, got {other:?}"),
            }
            assert_eq!(rec.state_name(), "in_flight", "{finish}");
            assert_eq!(rec.recovery_point(), None, "{finish}");
        }
        // The single connection still works for claims and for a new phase.
        let next = fresh_id();
        let c = claim(&store, &next).await;
        let mut phase = store.begin_phase(&next, c.token, LEASE).await.unwrap();
        insert_payment(&mut phase, &next, &format!("pay_after_{finish}")).await;
        phase.complete(tricky_response(), RETENTION).await.unwrap();
        assert_eq!(payments(&store, &next).await, 1, "{finish}");
    }
}
