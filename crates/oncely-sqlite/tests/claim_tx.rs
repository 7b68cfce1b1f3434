//! `SqliteStore::claim_tx`, the transactional claim of `oncely-sqlx`'s layer: the read, the
//! write lock and the insert go to the connection in one hop, and the read alone answers a
//! replay or a mismatch, so those never wait for (nor take) SQLite's write lock.

mod common;

use common::TempStore;
use oncely_conformance::{RETENTION, claim_req, fresh_id, tricky_response};
use oncely_core::store::lease_millis;
use oncely_core::{ClaimKind, ClaimOutcome, Clock, KeyStore, ManualClock, RecordState};
use oncely_sqlite::{LEASE_SLACK, SqliteStore, connect_options};
use sqlx::SqlitePool;
use sqlx::sqlite::SqlitePoolOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A second pool on the store's file (its own connections, as another process would have).
async fn other_pool(store: &TempStore) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(connect_options(store.path().to_str().unwrap()).unwrap())
        .await
        .unwrap()
}

/// Whether SQLite's write lock is free: `BEGIN IMMEDIATE` on `pool` succeeds within a second
/// (the busy timeout is 5 seconds, so a lock still held, by a transaction left open on one of
/// the store's connections, makes this `false`).
async fn write_lock_is_free(pool: &SqlitePool) -> bool {
    match tokio::time::timeout(Duration::from_secs(1), pool.begin_with("BEGIN IMMEDIATE")).await {
        Ok(Ok(tx)) => {
            tx.rollback().await.unwrap();
            true
        }
        _ => false,
    }
}

#[tokio::test]
async fn a_replay_and_a_mismatch_answer_while_another_connection_holds_the_write_lock() {
    let store = TempStore::open(ManualClock::starting_now()).await;
    let id = fresh_id();
    let req = claim_req(&id, r#"{"amount":100}"#);
    let (outcome, tx) = store.claim_tx(&req).await.unwrap();
    let ClaimOutcome::Claimed(claim) = outcome else {
        panic!("a fresh key is claimed: {outcome:?}")
    };
    assert_eq!(claim.kind, ClaimKind::New);
    let mut tx = tx.expect("a claim comes with its transaction");
    store
        .complete_in(&mut tx, &id, claim.token, &tricky_response(), RETENTION)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let other = other_pool(&store).await;
    let mut holder = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("CREATE TABLE held (x INTEGER)")
        .execute(&mut *holder)
        .await
        .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let (outcome, tx) = tokio::time::timeout(Duration::from_secs(1), store.claim_tx(&req))
            .await
            .expect("a replay does not wait for the write lock")
            .unwrap();
        assert!(tx.is_none(), "a replay comes without a transaction");
        match outcome {
            ClaimOutcome::Replay { response, .. } => assert_eq!(response, tricky_response()),
            other => panic!("expected a replay, got {other:?}"),
        }
        let mismatch = claim_req(&id, r#"{"amount":999}"#);
        let (outcome, tx) = tokio::time::timeout(Duration::from_secs(1), store.claim_tx(&mismatch))
            .await
            .expect("a mismatch does not wait for the write lock")
            .unwrap();
        assert!(tx.is_none());
        assert!(
            matches!(outcome, ClaimOutcome::Mismatch),
            "expected a mismatch, got {outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    holder.rollback().await.unwrap();
    // No replay left a transaction open on one of the store's connections.
    assert!(write_lock_is_free(&other).await);
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.token, claim.token);
    assert!(
        matches!(rec.state, RecordState::Complete { .. }),
        "{:?}",
        rec.state
    );
}

/// The race between the lock-free read and the write lock: another connection's claim of the
/// same key is open (uncommitted, so the read finds nothing) while ours waits for the lock.
/// When it commits, ours finds the record under the lock and replays it (no second claim);
/// when it rolls back, ours claims the key afresh.
#[tokio::test]
async fn a_key_claimed_between_the_read_and_the_write_lock_is_decided_under_the_lock() {
    for commits in [true, false] {
        let clock = ManualClock::starting_now();
        let store = TempStore::open(clock.clone()).await;
        let other = other_pool(&store).await;
        let first = SqliteStore::from_pool(other.clone(), Arc::new(clock.clone()));
        let id = fresh_id();
        let req = claim_req(&id, r#"{"amount":100}"#);

        let mut holder = first.begin_tx().await.unwrap();
        let ClaimOutcome::Claimed(theirs) = first.claim_in(&mut holder, &req).await.unwrap() else {
            panic!("the first claim is granted")
        };
        first
            .complete_in(
                &mut holder,
                &id,
                theirs.token,
                &tricky_response(),
                RETENTION,
            )
            .await
            .unwrap();
        let ours = {
            let store = store.store.clone();
            let req = req.clone();
            tokio::spawn(async move { store.claim_tx(&req).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!ours.is_finished(), "our claim waits for the write lock");
        if commits {
            holder.commit().await.unwrap();
        } else {
            holder.rollback().await.unwrap();
        }
        let (outcome, tx) = ours.await.unwrap().unwrap();
        if commits {
            assert!(tx.is_none());
            match outcome {
                ClaimOutcome::Replay { response, .. } => assert_eq!(response, tricky_response()),
                other => panic!("expected the committed record's replay, got {other:?}"),
            }
        } else {
            let ClaimOutcome::Claimed(claim) = outcome else {
                panic!("a rolled-back claim leaves the key free: {outcome:?}")
            };
            assert_eq!((claim.kind, claim.token), (ClaimKind::New, theirs.token));
            tx.expect("a claim comes with its transaction")
                .commit()
                .await
                .unwrap();
            let rec = store.get(&id).await.unwrap().unwrap();
            assert!(
                matches!(rec.state, RecordState::InFlight { .. }),
                "{:?}",
                rec.state
            );
        }
        assert!(write_lock_is_free(&other).await);
    }
}

/// A claim that waited for the write lock longer than `LEASE_SLACK` gets its lease counted
/// from when it took the lock, not from before the wait.
#[tokio::test]
async fn a_claim_that_waited_for_the_lock_leases_from_when_it_took_it() {
    let clock = ManualClock::starting_now();
    let store = TempStore::open(clock.clone()).await;
    let other = other_pool(&store).await;
    let id = fresh_id();
    let req = claim_req(&id, r#"{"amount":100}"#);
    let mut holder = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("CREATE TABLE held (x INTEGER)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let ours = {
        let store = store.store.clone();
        let req = req.clone();
        tokio::spawn(async move { store.claim_tx(&req).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = LEASE_SLACK * 10;
    clock.advance(waited);
    let took_lock = clock.now_millis();
    holder.commit().await.unwrap();
    let (outcome, tx) = ours.await.unwrap().unwrap();
    let ClaimOutcome::Claimed(claim) = outcome else {
        panic!("a fresh key is claimed: {outcome:?}")
    };
    assert_eq!(claim.lease_expires_at, took_lock + lease_millis(req.lease));
    tx.unwrap().commit().await.unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    match rec.state {
        RecordState::InFlight {
            lease_expires_at, ..
        } => assert_eq!(lease_expires_at, claim.lease_expires_at),
        other => panic!("expected in flight, got {other:?}"),
    }
}
