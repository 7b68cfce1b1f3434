//! MySQL / MariaDB: the `bench_orders` table, the statements of the handlers (`handlers.rs`),
//! and [`Bench::mysql`].

use super::endpoint::with_scope;
use super::handlers::{FloorClaim, FloorCompletion, Orders, baseline, floor, layer};
use super::{Bench, Db, PATH, Pool, SCOPE};
use axum::Router;
use axum::routing::post;
use oncely_core::Policy;
use oncely_mysql::MySqlStore;
use sqlx::mysql::MySqlConnection;
use sqlx::{MySql, MySqlPool, Transaction};

/// The orders table on MySQL: the scope and key as bytes, as the store keeps them
/// (`VARBINARY`, so that the clean-up's join compares like with like), the index inside the
/// `CREATE TABLE` (MySQL has no `CREATE INDEX IF NOT EXISTS`).
const MY_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_orders (
    id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
    scope VARBINARY(1024) NOT NULL, idempotency_key VARBINARY(255) NOT NULL,
    items TEXT NOT NULL, created_at BIGINT NOT NULL,
    INDEX bench_orders_by_key (idempotency_key)) ENGINE = InnoDB";
const MY_INSERT_ORDER: &str = "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
     VALUES (?, ?, ?, ?, ?)";
/// The floor's claim on MySQL: what the store's own claim is (`oncely_mysql`'s
/// `INSERT_CLAIM`), because nothing shorter tells an insert from a duplicate in one statement.
/// MySQL has no `RETURNING` (MariaDB's is its own) and no `ON CONFLICT DO NOTHING`; sqlx
/// connects with `CLIENT_FOUND_ROWS`, so the row count of `ON DUPLICATE KEY UPDATE` is 1 for
/// both; `INSERT IGNORE` would tell them apart by its row count but turns every other error of
/// the statement (a `CHECK`, a value too long) into a warning, which no idempotency layer may
/// do. `ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token)` changes nothing and reports
/// the existing token as the last insert id, 0 for an insert (the table has no
/// `AUTO_INCREMENT` column).
const MY_FLOOR_CLAIM: &str = "INSERT INTO oncely_idempotency_keys \
     (scope, `key`, fingerprint_version, fingerprint, token, state, lease_expires_at, created_at, \
      expires_at) VALUES (?, ?, 1, ?, 1, 'in_flight', ?, ?, ?) \
     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token)";
const MY_FLOOR_COMPLETE: &str = "UPDATE oncely_idempotency_keys SET state = 'complete', \
     lease_expires_at = NULL, completed_at = ?, response_status = 201, response_headers = ?, \
     response_body = ?, response_body_retained = TRUE, expires_at = ? \
     WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_flight'";

impl Orders for MySqlStore {
    /// The baseline's and the floor's (`handlers::floor`) `BEGIN`: sqlx's plain one (the
    /// store's pool gives every connection the 4-second `innodb_lock_wait_timeout` when it
    /// connects, so a hand-written handler needs no statement of its own for the bound; the
    /// layer sends it in its `BEGIN` message, with its savepoint, at no extra round trip); then
    /// the claim ([`MY_FLOOR_CLAIM`]), the order, the completing `UPDATE`, `COMMIT`.
    async fn begin(pool: &MySqlPool) -> Result<Transaction<'static, MySql>, sqlx::Error> {
        pool.begin().await
    }

    async fn insert_order(
        conn: &mut MySqlConnection,
        id: &str,
        key: &str,
        items: String,
        created_at: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(MY_INSERT_ORDER)
            .bind(id)
            .bind(SCOPE.as_bytes())
            .bind(key.as_bytes())
            .bind(items)
            .bind(created_at)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn floor_claim(
        conn: &mut MySqlConnection,
        c: FloorClaim<'_>,
    ) -> Result<bool, sqlx::Error> {
        let claimed = sqlx::query(MY_FLOOR_CLAIM)
            .bind(SCOPE.as_bytes())
            .bind(c.key.as_bytes())
            .bind(c.digest)
            .bind(c.lease_expires_at)
            .bind(c.now)
            .bind(c.expires_at)
            .execute(conn)
            .await?;
        // 0 for an insert; a duplicate reports its token.
        Ok(claimed.last_insert_id() == 0)
    }

    async fn floor_complete(
        conn: &mut MySqlConnection,
        c: FloorCompletion<'_>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(MY_FLOOR_COMPLETE)
            .bind(c.completed_at)
            .bind(c.headers)
            .bind(c.body)
            .bind(c.expires_at)
            .bind(SCOPE.as_bytes())
            .bind(c.key.as_bytes())
            .bind(1_i64)
            .execute(conn)
            .await
            .map(drop)
    }
}

impl Bench {
    /// MySQL or MariaDB from `ONCELY_BENCH_MYSQL_URL` (or `ONCELY_TEST_MYSQL_URL`), through
    /// `MySqlStore::connect` (10 connections, each with the store's session settings),
    /// migrated, with the `bench_orders` table; the reason it is skipped otherwise.
    ///
    /// The floor is what a hand-written one-commit idempotent handler must send on MySQL, as
    /// on PostgreSQL: `BEGIN`, the claim, the business insert, the completing `UPDATE`,
    /// `COMMIT`. Its claim is the store's own `INSERT ... ON DUPLICATE KEY UPDATE token =
    /// LAST_INSERT_ID(token)` (see `MY_FLOOR_CLAIM` for why nothing shorter will do).
    ///
    /// # Errors
    ///
    /// A message naming the missing variable, or the database's error.
    pub async fn mysql() -> Result<Self, String> {
        let url = crate::env_url("ONCELY_BENCH_MYSQL_URL", "ONCELY_TEST_MYSQL_URL")
            .ok_or("ONCELY_BENCH_MYSQL_URL is not set")?;
        let store = MySqlStore::connect(&url).await.map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let pool = store.pool().clone();
        sqlx::query(MY_SCHEMA)
            .execute(&pool)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            db: Db::Mysql,
            proxy: None,
            pool: Pool::My(pool.clone()),
            baseline: with_scope(
                Router::new()
                    .route(PATH, post(baseline::<MySqlStore>))
                    .with_state(pool.clone()),
            ),
            floor: with_scope(
                Router::new()
                    .route(PATH, post(floor::<MySqlStore>))
                    .with_state(pool),
            ),
            layer: with_scope(
                Router::new()
                    .route(PATH, post(layer::<MySqlStore>))
                    .layer(oncely_sqlx::layer(store, Policy::default())),
            ),
            _dir: None,
        })
    }
}
