//! SQLite: the `bench_orders` table, the statements of the handlers (`handlers.rs`; the
//! baseline's and floor's in a `BEGIN IMMEDIATE` transaction, as the layer's), and
//! [`Bench::sqlite`].

use super::endpoint::with_scope;
use super::handlers::{TextOrders, baseline, floor, layer};
use super::{Bench, Db, PATH, Pool};
use axum::Router;
use axum::routing::post;
use oncely_core::Policy;
use oncely_sqlite::SqliteStore;

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

impl TextOrders for SqliteStore {
    const BEGIN: Option<&'static str> = Some(BEGIN_IMMEDIATE);
    const INSERT_ORDER: &'static str = LITE_INSERT_ORDER;
    const FLOOR_CLAIM: &'static str = LITE_FLOOR_CLAIM;
    const FLOOR_COMPLETE: &'static str = LITE_FLOOR_COMPLETE;
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
                    .route(PATH, post(baseline::<SqliteStore>))
                    .with_state(pool.clone()),
            ),
            floor: with_scope(
                Router::new()
                    .route(PATH, post(floor::<SqliteStore>))
                    .with_state(pool),
            ),
            layer: with_scope(
                Router::new()
                    .route(PATH, post(layer::<SqliteStore>))
                    .layer(oncely_sqlx::layer(store, Policy::default())),
            ),
            proxy: None,
            _dir: Some(dir),
        })
    }
}
