//! Failure mapping on PostgreSQL: an unreachable or closed store is `Unavailable` (the layer
//! fails closed with a 503), a row that cannot be decoded is `Corrupt`. Skipped when
//! `ONCELY_TEST_POSTGRES_URL` is unset.

mod common;

use oncely_conformance::{LEASE, claim_req};
use oncely_core::{
    FencingToken, IdempotencyKey, KeyStore, Maintenance, ManualClock, RecordKey, StoreError,
};
use oncely_postgres::PostgresStore;

#[tokio::test]
async fn unreachable_database_is_unavailable() {
    if common::url().is_none() {
        return;
    }
    // Nothing listens on port 1.
    match PostgresStore::connect("postgres://postgres@127.0.0.1:1/test").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    match PostgresStore::connect("not a url").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn closed_pool_is_unavailable_for_every_operation() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    let id = RecordKey::new(
        common::fresh_scope("closed"),
        IdempotencyKey::new("K").unwrap(),
    );
    store.pool().close().await;
    assert!(matches!(
        store.claim(claim_req(&id, "{}")).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.renew(&id, FencingToken(1), LEASE).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.get(&id).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.reap(10).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.begin_tx().await.map(drop),
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test]
async fn undecodable_rows_are_corrupt() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    let scope = common::fresh_scope("corrupt");
    // A 3-byte digest, then an unreadable stored request; leases and retention end in 2100,
    // so no other test's reaper or abandoned list ever sees these rows.
    sqlx::query(
        "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, fingerprint, \
         token, state, lease_expires_at, created_at, expires_at) \
         VALUES ($1, 'short-digest', 1, '\\x010203', 1, 'in_flight', 4102444800000, 1, 4102444800000)",
    )
    .bind(scope.as_str())
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, fingerprint, \
         token, state, lease_expires_at, request, created_at, expires_at) \
         VALUES ($1, 'bad-request', 1, decode(repeat('ab', 32), 'hex'), 1, 'in_flight', 4102444800000, \
         '\\xffff', 1, 4102444800000)",
    )
    .bind(scope.as_str())
    .execute(store.pool())
    .await
    .unwrap();
    for key in ["short-digest", "bad-request"] {
        let id = RecordKey::new(scope.clone(), IdempotencyKey::new(key).unwrap());
        match store.get(&id).await {
            Err(StoreError::Corrupt(what)) => assert!(!what.is_empty()),
            other => panic!("{key}: expected Corrupt, got {other:?}"),
        }
        // A claim on a corrupt record fails; it never overwrites it.
        assert!(matches!(
            store.claim(claim_req(&id, "{}")).await,
            Err(StoreError::Corrupt(_))
        ));
    }
    sqlx::query("DELETE FROM oncely_idempotency_keys WHERE scope = $1")
        .bind(scope.as_str())
        .execute(store.pool())
        .await
        .unwrap();
}
