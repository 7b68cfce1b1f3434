//! Upgrading a database made by an earlier version of the schema: its rows keep every value
//! through the later migrations. Skipped when `ONCELY_TEST_POSTGRES_URL` is unset.

mod common;

use oncely_conformance::{claim_req, fresh_id, tricky_response};
use oncely_core::{
    ClaimOutcome, Clock, FencingToken, KeyStore, Maintenance, RedriveNote, Redrives, SystemClock,
};
use oncely_postgres::PostgresStore;
use std::time::Duration;

/// A fresh database with only the first migration (before the completer's columns), two rows
/// written in that schema, then `migrate`: the complete row replays byte for byte, the in-flight
/// row reads as never re-driven and not marked, is listed for the completer, and takes its notes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_from_before_the_redrive_columns_survive_the_migration() {
    let Some(url) = common::url() else {
        return;
    };
    let admin = PostgresStore::connect(&url).await.unwrap();
    let db = format!("oncely_upgrade_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(admin.pool())
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').expect("url with a database name");
    let old_url = format!("{base}/{db}");

    // The first migration alone, recorded exactly as the store records it.
    let dir = std::env::temp_dir().join(format!("oncely-first-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("20261130000001_oncely_idempotency_keys.sql"),
        include_str!("../migrations/20261130000001_oncely_idempotency_keys.sql"),
    )
    .unwrap();
    let mut first = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    first.dangerous_set_table_name("_oncely_migrations");
    let pool = sqlx::PgPool::connect(&old_url).await.unwrap();
    first.run(&pool).await.unwrap();
    std::fs::remove_dir_all(&dir).ok();

    let (done, flying) = (fresh_id(), fresh_id());
    let now = SystemClock.now_millis();
    let resp = tricky_response();
    sqlx::query(
        "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, fingerprint, \
         token, state, completed_at, response_status, response_headers, response_body, \
         response_body_retained, created_at, expires_at) \
         VALUES ($1, 'key-1', 1, $2, 3, 'complete', $3, $4, $5, $6, TRUE, $3, $7)",
    )
    .bind(done.scope.as_str())
    .bind(&claim_req(&done, "{}").fingerprint.digest()[..])
    .bind(now)
    .bind(i32::from(resp.status))
    .bind(resp.encode_headers())
    .bind(resp.body.clone())
    .bind(now + 3_600_000)
    .execute(&pool)
    .await
    .unwrap();
    let req = claim_req(&flying, r#"{"a":1}"#);
    sqlx::query(
        "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, fingerprint, \
         token, state, lease_expires_at, recovery_point, request, created_at, expires_at) \
         VALUES ($1, 'key-1', 1, $2, 2, 'in_flight', $3, 'payment_recorded', $4, $3, $5)",
    )
    .bind(flying.scope.as_str())
    .bind(&req.fingerprint.digest()[..])
    .bind(now - 120_000)
    .bind(req.request.as_ref().map(|r| r.encode()))
    .bind(now + 3_600_000)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let store = PostgresStore::connect(&old_url).await.unwrap();
    store.migrate().await.unwrap();
    match store.claim(claim_req(&done, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, resp),
        other => panic!("{other:?}"),
    }
    let rec = store.get(&flying).await.unwrap().unwrap();
    assert_eq!(rec.redrives, Redrives::default());
    assert_eq!(rec.recovery_point(), Some("payment_recorded"));
    assert_eq!(rec.request, req.request);
    let listed = store
        .list_abandoned(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    let noted = store
        .note_redrive(&flying, FencingToken(2), 0, RedriveNote::Mark)
        .await
        .unwrap();
    assert!(noted.is_marked());
    assert_eq!(store.list_marked(10).await.unwrap().len(), 1);
    store.pool().close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {db} WITH (FORCE)"
    )))
    .execute(admin.pool())
    .await
    .unwrap();
}
