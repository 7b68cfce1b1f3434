//! The bound on how long a claim's transaction waits for the key that another open transaction
//! holds: `PostgresStore::TX_LOCK_TIMEOUT` (4 seconds) however the store was made.
//!
//! - `connect`: the session's `lock_timeout` (the transaction begins with a plain `BEGIN`),
//!   and `connect` with a URL that sets a longer one (then the `SET LOCAL` again);
//! - `from_pool` over a pool whose `lock_timeout` was not declared (here 30 seconds): the
//!   `SET LOCAL lock_timeout` sent with `BEGIN`;
//! - `from_pool` declaring a `lock_timeout` of 0 (PostgreSQL's "no limit"): not trusted, so
//!   the `SET LOCAL` again.
//!
//! Each one: transaction A claims a key and stays open; transaction B claims the same key,
//! waits, and is answered in flight once the bound runs out (never an error, never a claim);
//! then A commits, and the record is A's claim (token 1).
//!
//! Skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset (`.ci/run` sets it).

mod common;

use oncely_conformance::claim_req;
use oncely_core::{ClaimOutcome, IdempotencyKey, KeyStore, RecordKey, SystemClock};
use oncely_postgres::PostgresStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn pool_with(lock_timeout: &str) -> Option<sqlx::PgPool> {
    let url = common::url()?;
    let options: PgConnectOptions = url.parse().expect("url");
    Some(
        PgPoolOptions::new()
            .max_connections(3)
            .connect_with(options.options([("lock_timeout", lock_timeout)]))
            .await
            .expect("connect"),
    )
}

/// Runs the scenario and returns how long B waited.
async fn second_claim_waits_for_the_bound(store: &PostgresStore) -> Duration {
    store.migrate().await.expect("migrate");
    let id = RecordKey::new(
        common::fresh_scope("lock-timeout"),
        IdempotencyKey::new("k-1").unwrap(),
    );
    let mut a = store.begin_tx().await.expect("begin A");
    let first = store
        .claim_in(&mut a, &claim_req(&id, "{}"))
        .await
        .expect("claim A");
    assert!(matches!(first, ClaimOutcome::Claimed(_)), "{first:?}");

    let mut b = store.begin_tx().await.expect("begin B");
    let started = Instant::now();
    // A safety net far past the bound, so an unbounded wait fails rather than hangs.
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        store.claim_in(&mut b, &claim_req(&id, "{}")),
    )
    .await
    .expect("B's wait is bounded")
    .expect("claim B is answered, not failed");
    let waited = started.elapsed();
    assert!(
        matches!(second, ClaimOutcome::InFlight { .. }),
        "a claim of a key held by an open transaction is in flight: {second:?}"
    );
    drop(b);
    a.commit().await.expect("commit A");
    // A's claim committed: the record is A's in-flight claim, not one of B's.
    let record = store.get(&id).await.expect("get").expect("A's record");
    assert_eq!(record.token.0, 1);
    waited
}

fn assert_bounded(waited: Duration) {
    let bound = PostgresStore::TX_LOCK_TIMEOUT;
    assert!(waited >= bound, "answered before the bound: {waited:?}");
    // The layer's store timeout is 5 seconds: past it the duplicate would get a 503.
    assert!(
        waited < Duration::from_secs(5),
        "waited past the 4-second bound: {waited:?}"
    );
}

#[tokio::test]
async fn connect_bounds_the_wait_with_the_session_lock_timeout() {
    let Some(url) = common::url() else { return };
    let store = PostgresStore::connect(&url).await.expect("connect");
    assert_eq!(
        PostgresStore::DEFAULT_LOCK_TIMEOUT,
        PostgresStore::TX_LOCK_TIMEOUT
    );
    assert!(
        store.relies_on_session_lock_timeout(),
        "connect's own pool has the 4-second bound in its sessions: no SET LOCAL"
    );
    assert_bounded(second_claim_waits_for_the_bound(&store).await);
}

/// The URL's own `lock_timeout` wins; a longer one than 4 seconds is not relied on, so the
/// transactions still carry the 4-second `SET LOCAL`.
#[tokio::test]
async fn connect_with_a_longer_lock_timeout_in_the_url_keeps_set_local() {
    let Some(url) = common::url() else { return };
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-c%20lock_timeout%3D30000");
    let store = PostgresStore::connect(&url).await.expect("connect");
    assert!(!store.relies_on_session_lock_timeout());
    assert_bounded(second_claim_waits_for_the_bound(&store).await);
}

#[tokio::test]
async fn an_undeclared_pool_gets_the_bound_from_set_local() {
    let Some(pool) = pool_with("30000ms").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool, Arc::new(SystemClock));
    assert_bounded(second_claim_waits_for_the_bound(&store).await);
}

#[tokio::test]
async fn a_declared_zero_lock_timeout_is_not_trusted() {
    // 0 is PostgreSQL's "wait for ever": a plain BEGIN would let B wait until A ends.
    let Some(pool) = pool_with("0").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool, Arc::new(SystemClock))
        .with_pool_lock_timeout(Duration::ZERO);
    assert_bounded(second_claim_waits_for_the_bound(&store).await);
}

#[tokio::test]
async fn a_declared_longer_lock_timeout_is_not_trusted() {
    let Some(pool) = pool_with("30000ms").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool, Arc::new(SystemClock))
        .with_pool_lock_timeout(Duration::from_secs(30));
    assert_bounded(second_claim_waits_for_the_bound(&store).await);
}
