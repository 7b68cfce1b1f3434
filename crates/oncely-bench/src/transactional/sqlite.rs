//! SQLite: the `bench_orders` table, the baseline's, floor's and layer's handlers (each in a
//! `BEGIN IMMEDIATE` transaction, as the layer's), and [`Bench::sqlite`].

use super::endpoint::{
    DbError, created, floor_reply, floor_response, items_of, key_of, now_ms, order_id, order_of,
    with_scope,
};
use super::{Bench, Db, LEASE_MS, PATH, Pool, RETENTION_MS, SCOPE};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use oncely_core::Policy;
use oncely_sqlite::SqliteStore;
use oncely_sqlx::{Tx, TxError};
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;

const LITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_orders (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    items TEXT NOT NULL, created_at INTEGER NOT NULL)";
const LITE_INDEX: &str = super::postgres::PG_INDEX;
const LITE_INSERT_ORDER: &str = "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
     VALUES (?1, ?2, ?3, ?4, ?5)";
const LITE_FLOOR_CLAIM: &str = "INSERT INTO oncely_idempotency_keys \
     (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, created_at, \
      expires_at) VALUES (?1, ?2, 1, ?3, 1, 'in_flight', ?4, ?5, ?6) \
     ON CONFLICT (scope, key) DO NOTHING RETURNING token";
const LITE_FLOOR_COMPLETE: &str = "UPDATE oncely_idempotency_keys SET state = 'complete', \
     lease_expires_at = NULL, completed_at = ?4, response_status = 201, response_headers = ?5, \
     response_body = ?6, response_body_retained = 1, expires_at = ?7 \
     WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_flight'";
/// The write transaction of the baseline and the floor: `BEGIN IMMEDIATE`, as the layer's
/// (`SqliteStore::begin_tx`), so that all three queue for SQLite's write lock the same way.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

async fn lite_baseline(
    State(pool): State<SqlitePool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    sqlx::query(LITE_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE)
        .bind(key_of(&headers))
        .bind(items_of(&order))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(created(&id, &order).into_response())
}

async fn lite_floor(
    State(pool): State<SqlitePool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let key = key_of(&headers);
    let digest = Sha256::digest(&body);
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let now = now_ms();
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    let claimed: Option<(i64,)> = sqlx::query_as(LITE_FLOOR_CLAIM)
        .bind(SCOPE)
        .bind(&key)
        .bind(&digest[..])
        .bind(now + LEASE_MS)
        .bind(now)
        .bind(now + RETENTION_MS)
        .fetch_optional(&mut *tx)
        .await?;
    if claimed.is_none() {
        return Ok(StatusCode::CONFLICT.into_response());
    }
    let id = order_id();
    sqlx::query(LITE_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE)
        .bind(&key)
        .bind(items_of(&order))
        .bind(now)
        .execute(&mut *tx)
        .await?;
    let (stored_headers, body) = floor_response(&id, &order);
    sqlx::query(LITE_FLOOR_COMPLETE)
        .bind(SCOPE)
        .bind(&key)
        .bind(1_i64)
        .bind(now_ms())
        .bind(&stored_headers)
        .bind(&body)
        .bind(now + RETENTION_MS)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(floor_reply(body))
}

async fn lite_layer(mut tx: Tx<SqliteStore>, body: axum::body::Bytes) -> Result<Response, TxError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let key = tx.id().key.as_str().to_owned();
    sqlx::query(LITE_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE)
        .bind(key)
        .bind(items_of(&order))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    tx.commit(created(&id, &order)).await
}

impl Bench {
    /// SQLite on a fresh temporary file (`SqliteStore::connect`: WAL, its pool, migrated),
    /// with the `bench_orders` table.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn sqlite() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("bench.sqlite3").display()
        );
        let store = SqliteStore::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let pool = store.pool().clone();
        for ddl in [LITE_SCHEMA, LITE_INDEX] {
            sqlx::query(ddl)
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(Self {
            db: Db::Sqlite,
            pool: Pool::Lite(pool.clone()),
            baseline: with_scope(
                Router::new()
                    .route(PATH, post(lite_baseline))
                    .with_state(pool.clone()),
            ),
            floor: with_scope(Router::new().route(PATH, post(lite_floor)).with_state(pool)),
            layer: with_scope(
                Router::new()
                    .route(PATH, post(lite_layer))
                    .layer(oncely_sqlx::layer(store, Policy::default())),
            ),
            proxy: None,
            _dir: Some(dir),
        })
    }
}
