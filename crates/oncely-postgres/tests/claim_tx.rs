//! `PostgresStore::claim_tx`, the claim of a transactional handler: each try waits at most
//! `CLAIM_TRY_LOCK_TIMEOUT` (10 milliseconds) for a key that another open transaction holds
//! (docs/DESIGN.md, "Duplicates while the first transaction is open"), and a claim that holds
//! the key gives the rest of its transaction, the handler's statements, the phase's
//! `lock_timeout` back: `TX_LOCK_TIMEOUT` (4 seconds), or the pool's shorter declared one.
//! Checked for a new key (restored by the insert itself) and for a takeover of an existing
//! record (restored by one more statement), on the three ways a store is made, with the
//! claim after its `BEGIN` and sent with it (`PostgresStore::with_claim_sent_with_begin`).
//!
//! Skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset (`.ci/run` sets it).

mod common;

use oncely_conformance::{LEASE, claim_req};
use oncely_core::{ClaimKind, ClaimOutcome, IdempotencyKey, KeyStore, ManualClock, RecordKey};
use oncely_postgres::PostgresStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;

/// A migrated store over a pool of its own whose sessions run with `lock_timeout`, declared to
/// the store when `declare` is set.
async fn store_with(
    clock: &ManualClock,
    lock_timeout: &str,
    declare: Option<Duration>,
) -> Option<PostgresStore> {
    let url = common::url()?;
    let options: PgConnectOptions = url.parse().expect("url");
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options.options([("lock_timeout", lock_timeout)]))
        .await
        .expect("connect");
    let mut store = PostgresStore::from_pool(pool, Arc::new(clock.clone()));
    if let Some(bound) = declare {
        store = store.with_pool_lock_timeout(bound);
    }
    store.migrate().await.expect("migrate");
    Some(store)
}

/// The `lock_timeout` the claim's open transaction runs its next statements with.
async fn lock_timeout_in(tx: &mut sqlx::Transaction<'static, sqlx::Postgres>) -> String {
    sqlx::query_scalar("SELECT current_setting('lock_timeout')")
        .fetch_one(&mut **tx)
        .await
        .expect("read lock_timeout")
}

/// A new key's claim, then a takeover of a record whose lease lapsed: both transactions go on
/// with `expected` (PostgreSQL's spelling of the phase's bound), and both claims commit.
async fn both_claims_restore(store: &PostgresStore, clock: &ManualClock, expected: &str) {
    let id = RecordKey::new(
        common::fresh_scope("claim-tx"),
        IdempotencyKey::new("k-1").unwrap(),
    );
    let (first, tx) = store.claim_tx(&claim_req(&id, "{}")).await.expect("claim");
    let mut tx = tx.expect("a claim comes with its transaction");
    assert!(
        matches!(&first, ClaimOutcome::Claimed(c) if c.kind == ClaimKind::New),
        "{first:?}"
    );
    assert_eq!(
        lock_timeout_in(&mut tx).await,
        expected,
        "after a new key's claim"
    );
    tx.commit().await.expect("commit the first claim");

    clock.advance(LEASE + Duration::from_secs(1));
    let (second, tx) = store.claim_tx(&claim_req(&id, "{}")).await.expect("claim");
    let mut tx = tx.expect("a takeover comes with its transaction");
    assert!(
        matches!(&second, ClaimOutcome::Claimed(c) if c.kind == ClaimKind::Takeover),
        "{second:?}"
    );
    assert_eq!(lock_timeout_in(&mut tx).await, expected, "after a takeover");
    tx.commit().await.expect("commit the takeover");
    let record = store.get(&id).await.expect("get").expect("the record");
    assert_eq!(record.token.0, 2, "the takeover's claim committed");
}

#[tokio::test]
async fn a_claim_on_connects_pool_gives_the_handler_the_4_second_bound() {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    assert!(store.relies_on_session_lock_timeout());
    for with_begin in [false, true] {
        let store = store.clone().with_claim_sent_with_begin(with_begin);
        both_claims_restore(&store, &clock, "4s").await;
    }
}

#[tokio::test]
async fn a_claim_on_an_undeclared_pool_gives_the_handler_the_4_second_bound() {
    let clock = ManualClock::starting_now();
    let Some(store) = store_with(&clock, "30000ms", None).await else {
        return;
    };
    assert!(!store.relies_on_session_lock_timeout());
    for with_begin in [false, true] {
        let store = store.clone().with_claim_sent_with_begin(with_begin);
        both_claims_restore(&store, &clock, "4s").await;
    }
}

#[tokio::test]
async fn a_claim_on_a_pool_declared_shorter_gives_the_handler_its_bound() {
    let clock = ManualClock::starting_now();
    let bound = Duration::from_millis(2_000);
    let Some(store) = store_with(&clock, "2000ms", Some(bound)).await else {
        return;
    };
    assert!(store.relies_on_session_lock_timeout());
    for with_begin in [false, true] {
        let store = store.clone().with_claim_sent_with_begin(with_begin);
        both_claims_restore(&store, &clock, "2s").await;
    }
}

/// A claim of a key that another open transaction holds is answered in flight once its tries
/// run out, with no transaction and nothing written; the holder's claim stands.
#[tokio::test]
async fn a_duplicate_of_an_open_claim_is_answered_in_flight() {
    for with_begin in [false, true] {
        a_duplicate_of_an_open_claim_is_answered_in_flight_with(with_begin).await;
    }
}

async fn a_duplicate_of_an_open_claim_is_answered_in_flight_with(with_begin: bool) {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    let store = store.with_claim_sent_with_begin(with_begin);
    let id = RecordKey::new(
        common::fresh_scope("claim-tx-held"),
        IdempotencyKey::new("k-1").unwrap(),
    );
    let (first, a) = store
        .claim_tx(&claim_req(&id, "{}"))
        .await
        .expect("claim A");
    assert!(matches!(first, ClaimOutcome::Claimed(_)), "{first:?}");
    let a = a.expect("A's transaction");
    // A safety net far past every bound, so that an unbounded wait fails rather than hangs.
    let (second, b) = tokio::time::timeout(
        Duration::from_secs(20),
        store.claim_tx(&claim_req(&id, "{}")),
    )
    .await
    .expect("B's wait is bounded")
    .expect("B is answered, not failed");
    assert!(
        matches!(second, ClaimOutcome::InFlight { .. }),
        "{second:?}"
    );
    assert!(b.is_none(), "an in-flight answer holds no transaction");
    a.commit().await.expect("commit A");
    let record = store.get(&id).await.expect("get").expect("A's record");
    assert_eq!(record.token.0, 1, "A's claim, not one of B's");
}
