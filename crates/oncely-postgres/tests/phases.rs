//! Transactional mode on PostgreSQL: business writes, recovery points and stored responses
//! commit in one transaction. "Crashes" drop every piece of the owner's process state (its
//! phase, its store, its pool) and a fresh store instance carries on, as a restarted server
//! would. Skipped when `ONCELY_TEST_POSTGRES_URL` is unset.

mod common;

use oncely_core::conformance::{LEASE, RETENTION, claim_req};
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, IdempotencyKey, KeyStore, ManualClock, RecordKey, StoreError,
    StoredResponse,
};
use oncely_postgres::{Phase, PostgresStore};
use std::time::{Duration, Instant};

const CREATE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS oncely_pg_test_orders ( \
    scope TEXT NOT NULL, key TEXT NOT NULL, step TEXT NOT NULL, amount BIGINT NOT NULL)";
const INSERT_ORDER: &str =
    "INSERT INTO oncely_pg_test_orders (scope, key, step, amount) VALUES ($1, $2, $3, $4)";
const COUNT_ORDERS: &str =
    "SELECT count(*) FROM oncely_pg_test_orders WHERE scope = $1 AND key = $2";

/// An owner instance (5 s lock timeout) and a second instance, sharing one clock.
async fn setup(
    other_lock_timeout: Duration,
) -> Option<(ManualClock, PostgresStore, PostgresStore)> {
    let clock = ManualClock::starting_now();
    let a = common::instance(&clock, 4, Duration::from_secs(5), &[]).await?;
    let b = common::instance(&clock, 4, other_lock_timeout, &[]).await?;
    // Concurrent tests create the business table once, one at a time.
    let mut tx = a.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(4242)")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(CREATE_ORDERS).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    Some((clock, a, b))
}

fn new_id(tag: &str) -> RecordKey {
    RecordKey::new(common::fresh_scope(tag), IdempotencyKey::new("K").unwrap())
}

async fn claimed(store: &PostgresStore, id: &RecordKey) -> Claim {
    match store
        .claim(claim_req(id, r#"{"amount":100}"#))
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn insert_order(phase: &mut Phase, id: &RecordKey, step: &str) {
    sqlx::query(INSERT_ORDER)
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .bind(step)
        .bind(100_i64)
        .execute(&mut **phase.tx())
        .await
        .unwrap();
}

async fn orders(store: &PostgresStore, id: &RecordKey) -> i64 {
    sqlx::query_scalar(COUNT_ORDERS)
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
}

fn created() -> StoredResponse {
    StoredResponse::new(
        201,
        vec![("content-type".into(), b"application/json".to_vec())],
        br#"{"id":"ord_1","amount":100}"#.to_vec(),
    )
}

async fn crash(store: PostgresStore) {
    store.pool().close().await;
    drop(store);
}

/// Case S8: the business row and the stored response commit together; the process "crashes"
/// right after the commit (before answering); a retry on a fresh instance replays, and there
/// is exactly one business row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_then_crash_replays_s8() {
    let Some((clock, a, b)) = setup(Duration::from_secs(5)).await else {
        return;
    };
    let id = new_id("s8");
    let c = claimed(&a, &id).await;
    let mut phase = a.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;
    phase.complete(created(), RETENTION).await.unwrap();
    crash(a).await;

    // The client retries after a while, on another instance; even past the lease.
    clock.advance(LEASE * 3);
    match b.claim(claim_req(&id, r#"{"amount":100}"#)).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, created()),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(orders(&b, &id).await, 1);
}

/// The other half of S8: a crash *before* the commit leaves no business row and the claim in
/// flight; after the lease a retry takes over from the start and the row is written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_commit_leaves_nothing_and_retry_runs_once() {
    let Some((clock, a, b)) = setup(Duration::from_secs(5)).await else {
        return;
    };
    let id = new_id("precommit");
    let c = claimed(&a, &id).await;
    let mut phase = a.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;
    drop(phase); // the process dies mid-phase
    crash(a).await;
    assert_eq!(orders(&b, &id).await, 0);
    assert!(matches!(
        b.claim(claim_req(&id, r#"{"amount":100}"#)).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    clock.advance(LEASE + Duration::from_millis(1));
    let t = claimed(&b, &id).await;
    assert_eq!(t.kind, ClaimKind::Takeover);
    assert_eq!(t.recovery_point, None, "no phase committed: start over");
    let mut phase = b.begin_phase(&id, t.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;
    phase.complete(created(), RETENTION).await.unwrap();
    assert_eq!(orders(&b, &id).await, 1);
}

/// An owner whose claim was taken over cannot open a phase: `Fenced`, and none of its business
/// writes commit. The new owner's phase works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_over_owner_is_fenced_and_writes_nothing() {
    let Some((clock, a, b)) = setup(Duration::from_secs(5)).await else {
        return;
    };
    let id = new_id("fenced");
    let old = claimed(&a, &id).await;
    clock.advance(LEASE + Duration::from_millis(1));
    let new = claimed(&b, &id).await;
    assert_eq!(new.kind, ClaimKind::Takeover);

    // The old owner wakes up and tries to run its phase.
    match a.begin_phase(&id, old.token, LEASE).await {
        Err(StoreError::Fenced) => {}
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(orders(&a, &id).await, 0);

    let mut phase = b.begin_phase(&id, new.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;
    phase.complete(created(), RETENTION).await.unwrap();
    // Nor can the old owner write anything after the completion.
    assert!(matches!(
        a.begin_phase(&id, old.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        a.begin_phase(&id, new.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
    assert_eq!(orders(&a, &id).await, 1);
}

/// A transactional handler fails (even leaving its transaction aborted by a bad statement):
/// rollback_and_release leaves no business row, and the key is claimable again as new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_and_release_leaves_no_row_and_key_claimable() {
    let Some((_clock, a, b)) = setup(Duration::from_secs(5)).await else {
        return;
    };
    let id = new_id("rollback");
    let c = claimed(&a, &id).await;
    let mut phase = a.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;
    let failed = sqlx::query("SELECT 1 / 0").execute(&mut **phase.tx()).await;
    assert!(failed.is_err(), "the handler's statement fails");
    phase.rollback_and_release().await.unwrap();

    assert_eq!(orders(&b, &id).await, 0);
    assert_eq!(b.get(&id).await.unwrap().unwrap().state_name(), "released");
    let again = claimed(&b, &id).await;
    assert_eq!(again.kind, ClaimKind::New);
    assert_eq!(again.token.0, c.token.0 + 1);
    // The released owner is fenced from here on.
    assert!(matches!(
        a.begin_phase(&id, c.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
}

/// A multi-step request commits phase 1 with a recovery point and crashes; the takeover gets
/// that recovery point and resumes at phase 2, so phase 1's write (and outside call) happens
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_then_takeover_resumes_at_recovery_point() {
    let Some((clock, a, b)) = setup(Duration::from_secs(5)).await else {
        return;
    };
    let id = new_id("resume");
    let c = claimed(&a, &id).await;
    let mut phase = a.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;
    phase.checkpoint("order_created").await.unwrap();
    crash(a).await;

    let rec = b.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.recovery_point(), Some("order_created"));
    clock.advance(LEASE + Duration::from_millis(1));
    let t = claimed(&b, &id).await;
    assert_eq!(t.kind, ClaimKind::Takeover);
    assert_eq!(t.recovery_point.as_deref(), Some("order_created"));
    // Resume: phase 1 is skipped; phase 2 records the charge and completes.
    let mut phase = b.begin_phase(&id, t.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "charge").await;
    phase.complete(created(), RETENTION).await.unwrap();
    assert_eq!(orders(&b, &id).await, 2, "one row per phase, none repeated");
    match b.claim(claim_req(&id, r#"{"amount":100}"#)).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, created()),
        other => panic!("{other:?}"),
    }
}

/// Case S6 on a slow store: the claim exists before any side effect. While the owner's phase
/// transaction is open (its business row not yet committed), a retry on another instance gets
/// "in flight" at once, without waiting for the phase's row lock. A retry that finds the lease
/// lapsed must wait for the phase (that wait is what keeps the phase atomic), but only up to
/// its `lock_timeout` (here 300 ms): then `Unavailable` (a retryable 503), never a second
/// execution. A later retry gets the original response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_during_open_phase_is_in_flight_s6() {
    let Some((clock, a, b)) = setup(Duration::from_millis(300)).await else {
        return;
    };
    let id = new_id("s6");
    let c = claimed(&a, &id).await;
    let mut phase = a.begin_phase(&id, c.token, LEASE).await.unwrap();
    insert_order(&mut phase, &id, "create").await;

    let started = Instant::now();
    match b.claim(claim_req(&id, r#"{"amount":100}"#)).await.unwrap() {
        ClaimOutcome::InFlight { lease_expires_at } => assert!(lease_expires_at > 0),
        other => panic!("expected in flight, got {other:?}"),
    }
    // Had it waited for the phase's row lock, it would have failed after B's 300 ms lock
    // timeout (the phase stays open throughout); the bound below only guards against hangs.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a claim does not wait for an open phase: {:?}",
        started.elapsed()
    );
    assert_eq!(orders(&b, &id).await, 0, "the phase has not committed");

    // The handler is slower than its lease: a retry decides to take over, and must wait.
    clock.advance(LEASE + Duration::from_millis(1));
    let started = Instant::now();
    match b.claim(claim_req(&id, r#"{"amount":100}"#)).await {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("lock timeout"), "{e}");
        }
        other => panic!("expected Unavailable after the lock timeout, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "bounded wait: {waited:?}"
    );

    // The same retry on an instance with a longer lock timeout waits, and once the phase
    // commits it sees the completion, not a claim.
    let patient = common::instance(&clock, 2, Duration::from_secs(5), &[])
        .await
        .unwrap();
    let retry = tokio::spawn({
        let id = id.clone();
        async move { patient.claim(claim_req(&id, r#"{"amount":100}"#)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!retry.is_finished(), "it waits for the phase's row lock");
    phase.complete(created(), RETENTION).await.unwrap();
    match retry.await.unwrap().unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, created()),
        other => panic!("expected the original response, got {other:?}"),
    }
    assert_eq!(orders(&b, &id).await, 1);
}
