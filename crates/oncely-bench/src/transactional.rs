//! Issue 11's measurement: one single-phase endpoint, `POST /v1/orders` (insert one order
//! row), built three ways as axum [`Router`]s and driven in-process (no TCP: every variant pays
//! the same HTTP overhead, which is thus excluded), on PostgreSQL, MySQL / MariaDB and SQLite:
//!
//! - [`Variant::Baseline`]: `BEGIN`, the business `INSERT`, `COMMIT`, no idempotency at all;
//! - [`Variant::Floor`]: the same plus the minimum claim and completion statements in the same
//!   transaction, hand-written through sqlx (`INSERT ... ON CONFLICT DO NOTHING RETURNING`
//!   into `oncely_idempotency_keys`, the business `INSERT`, the completing `UPDATE` with the
//!   response, `COMMIT`): one commit, what any transactional idempotency layer must at least do
//!   (on MySQL, which has no `RETURNING`, the claim is `INSERT ... ON DUPLICATE KEY UPDATE`
//!   with the `LAST_INSERT_ID(expr)` idiom instead: see [`Bench::mysql`]);
//! - [`Variant::Layer`]: the same business `INSERT` in a handler taking
//!   [`oncely_sqlx::Tx`] behind [`oncely_sqlx::layer`] with [`Policy::default`].
//!
//! Every variant sits behind the same tiny middleware that puts the caller's [`Scope`] into
//! the request extensions (what an authentication layer does), and answers `201 Created` with
//! the same JSON body. `benches/transactional.rs` times them; this module's helpers also
//! check what each variant wrote ([`Bench::verify`]) and count the statements it sent
//! ([`count`]).

use axum::Router;
use axum::body::Body;
use axum::extract::{Json, State};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use oncely_core::{Policy, Scope, StoredResponse};
use oncely_mysql::MySqlStore;
use oncely_postgres::PostgresStore;
use oncely_sqlite::SqliteStore;
use oncely_sqlx::{Tx, TxError};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tower::ServiceExt;

/// The scope every request is made in.
pub const SCOPE: &str = "acct_bench";
/// The request body of every request (JSON, 43 bytes).
pub const BODY: &str = r#"{"items":[{"sku":"sku_1","quantity":2}]}"#;
/// The endpoint.
pub const PATH: &str = "/v1/orders";
/// How many resident records (and orders) [`Bench::populate`] gives PostgreSQL's tables.
pub const RESIDENT: i32 = 100_000;
/// Their scope.
pub const RESIDENT_SCOPE: &str = "acct_bench_resident";

/// The claim's lease and the record's retention the floor writes (the [`Policy`] defaults:
/// 30 seconds and 72 hours), in milliseconds.
const LEASE_MS: i64 = 30_000;
const RETENTION_MS: i64 = 259_200_000;

/// The three ways the endpoint is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// No idempotency: `BEGIN`, the order `INSERT`, `COMMIT`.
    Baseline,
    /// The hand-written minimum: claim `INSERT`, order `INSERT`, completing `UPDATE`, one
    /// `COMMIT`.
    Floor,
    /// `oncely_sqlx::layer` and the `Tx` extractor.
    Layer,
}

impl Variant {
    /// The three, in report order.
    pub const ALL: [Self; 3] = [Self::Baseline, Self::Floor, Self::Layer];

    /// A short lower-case name (`baseline`, `floor`, `layer`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Floor => "floor",
            Self::Layer => "layer",
        }
    }
}

/// The three databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    /// PostgreSQL from `ONCELY_BENCH_POSTGRES_URL` / `ONCELY_TEST_POSTGRES_URL`.
    Postgres,
    /// MySQL 8 or MariaDB 10.6+ from `ONCELY_BENCH_MYSQL_URL` / `ONCELY_TEST_MYSQL_URL`.
    Mysql,
    /// SQLite on a temporary file (WAL, `SqliteStore::connect`'s settings).
    Sqlite,
}

impl Db {
    /// Every database, in report order.
    pub const ALL: [Self; 3] = [Self::Postgres, Self::Mysql, Self::Sqlite];

    /// A short lower-case name (`postgres`, `mysql`, `sqlite`), as `ONCELY_BENCH_DBS` lists it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mysql => "mysql",
            Self::Sqlite => "sqlite",
        }
    }

    /// The variable that names a database of the bench's own (`ONCELY_BENCH_POSTGRES_URL`,
    /// `ONCELY_BENCH_MYSQL_URL`; none for SQLite, always a fresh file), on which the timed bench
    /// may add resident rows and change table settings ([`Bench::populate`],
    /// [`Bench::autovacuum`]); the test database the URL falls back to is left as it is.
    pub const fn own_url_var(self) -> Option<&'static str> {
        match self {
            Self::Postgres => Some("ONCELY_BENCH_POSTGRES_URL"),
            Self::Mysql => Some("ONCELY_BENCH_MYSQL_URL"),
            Self::Sqlite => None,
        }
    }
}

#[derive(Clone)]
enum Pool {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

/// One database with the three routers over it. Keys and orders share the store's pool
/// (PostgreSQL and MySQL: 10 connections; SQLite: the store's pool), so every variant has the
/// same connections to work with.
pub struct Bench {
    /// Which database.
    pub db: Db,
    pool: Pool,
    baseline: Router,
    floor: Router,
    layer: Router,
    /// The latency proxy between the bench and PostgreSQL, when one is used.
    proxy: Option<crate::proxy::LatencyProxy>,
    _dir: Option<tempfile::TempDir>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn order_id() -> String {
    format!("ord_{}", uuid::Uuid::new_v4().simple())
}

fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

fn items_of(order: &Value) -> String {
    order.get("items").map(Value::to_string).unwrap_or_default()
}

/// The response every variant sends: `201`, a JSON body naming the order.
/// The order in a request body: every variant parses it the same way (`serde_json::from_slice`
/// on the bytes, which the floor also hashes), so the handlers differ only in idempotency.
fn order_of(body: &[u8]) -> Option<Value> {
    serde_json::from_slice(body).ok()
}

fn created(id: &str, order: &Value) -> (StatusCode, Json<Value>) {
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "items": order.get("items") })),
    )
}

/// A plain database error as `500` (the baseline and the floor).
struct DbError(sqlx::Error);

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        Self(e)
    }
}

impl IntoResponse for DbError {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0.to_string()).into_response()
    }
}

/// What the floor stores: the response it sends, as `StoredResponse` columns.
fn floor_response(id: &str, order: &Value) -> (Vec<u8>, Vec<u8>) {
    let body =
        serde_json::to_vec(&json!({ "id": id, "items": order.get("items") })).unwrap_or_default();
    let stored = StoredResponse::new(
        201,
        vec![("content-type".to_owned(), b"application/json".to_vec())],
        Vec::new(),
    );
    (stored.encode_headers(), body)
}

fn floor_reply(body: Vec<u8>) -> Response {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

// ---- PostgreSQL ----------------------------------------------------------------------------

const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_orders (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    items TEXT NOT NULL, created_at BIGINT NOT NULL)";
const PG_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS bench_orders_by_key ON bench_orders (idempotency_key)";
const PG_INSERT_ORDER: &str = "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
     VALUES ($1, $2, $3, $4, $5)";
const PG_FLOOR_CLAIM: &str = "INSERT INTO oncely_idempotency_keys \
     (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, created_at, \
      expires_at) VALUES ($1, $2, 1, $3, 1, 'in_flight', $4, $5, $6) \
     ON CONFLICT (scope, key) DO NOTHING RETURNING token";
const PG_FLOOR_COMPLETE: &str = "UPDATE oncely_idempotency_keys SET state = 'complete', \
     lease_expires_at = NULL, completed_at = $4, response_status = 201, response_headers = $5, \
     response_body = $6, response_body_retained = TRUE, expires_at = $7 \
     WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'";

async fn pg_baseline(
    State(pool): State<PgPool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let mut tx = pool.begin().await?;
    sqlx::query(PG_INSERT_ORDER)
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

async fn pg_floor(
    State(pool): State<PgPool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let key = key_of(&headers);
    let digest = Sha256::digest(&body);
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let now = now_ms();
    let mut tx = pool.begin().await?;
    let claimed: Option<(i64,)> = sqlx::query_as(PG_FLOOR_CLAIM)
        .bind(SCOPE)
        .bind(&key)
        .bind(&digest[..])
        .bind(now + LEASE_MS)
        .bind(now)
        .bind(now + RETENTION_MS)
        .fetch_optional(&mut *tx)
        .await?;
    if claimed.is_none() {
        // The floor measures first executions only (every key is fresh).
        return Ok(StatusCode::CONFLICT.into_response());
    }
    let id = order_id();
    sqlx::query(PG_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE)
        .bind(&key)
        .bind(items_of(&order))
        .bind(now)
        .execute(&mut *tx)
        .await?;
    let (stored_headers, body) = floor_response(&id, &order);
    sqlx::query(PG_FLOOR_COMPLETE)
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

async fn pg_layer(mut tx: Tx<PostgresStore>, body: axum::body::Bytes) -> Result<Response, TxError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let key = tx.id().key.as_str().to_owned();
    sqlx::query(PG_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE)
        .bind(key)
        .bind(items_of(&order))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    tx.commit(created(&id, &order)).await
}

// ---- MySQL / MariaDB -----------------------------------------------------------------------

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

async fn my_baseline(
    State(pool): State<MySqlPool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let mut tx = pool.begin().await?;
    sqlx::query(MY_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE.as_bytes())
        .bind(key_of(&headers).into_bytes())
        .bind(items_of(&order))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(created(&id, &order).into_response())
}

/// The floor on MySQL: sqlx's plain `BEGIN` (the store's pool gives every connection the
/// 4-second `innodb_lock_wait_timeout` when it connects, so a hand-written handler needs no
/// statement of its own for the bound; the layer sends it in its `BEGIN` message, with its
/// savepoint, at no extra round trip), the claim ([`MY_FLOOR_CLAIM`]), the order, the
/// completing `UPDATE`, `COMMIT`.
async fn my_floor(
    State(pool): State<MySqlPool>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let key = key_of(&headers);
    let digest = Sha256::digest(&body);
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let now = now_ms();
    let mut tx = pool.begin().await?;
    let claimed = sqlx::query(MY_FLOOR_CLAIM)
        .bind(SCOPE.as_bytes())
        .bind(key.as_bytes())
        .bind(&digest[..])
        .bind(now + LEASE_MS)
        .bind(now)
        .bind(now + RETENTION_MS)
        .execute(&mut *tx)
        .await?;
    if claimed.last_insert_id() != 0 {
        // A duplicate: the floor measures first executions only (every key is fresh).
        return Ok(StatusCode::CONFLICT.into_response());
    }
    let id = order_id();
    sqlx::query(MY_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE.as_bytes())
        .bind(key.as_bytes())
        .bind(items_of(&order))
        .bind(now)
        .execute(&mut *tx)
        .await?;
    let (stored_headers, body) = floor_response(&id, &order);
    sqlx::query(MY_FLOOR_COMPLETE)
        .bind(now_ms())
        .bind(&stored_headers)
        .bind(&body)
        .bind(now + RETENTION_MS)
        .bind(SCOPE.as_bytes())
        .bind(key.as_bytes())
        .bind(1_i64)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(floor_reply(body))
}

async fn my_layer(mut tx: Tx<MySqlStore>, body: axum::body::Bytes) -> Result<Response, TxError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let key = tx.id().key.as_str().as_bytes().to_vec();
    sqlx::query(MY_INSERT_ORDER)
        .bind(&id)
        .bind(SCOPE.as_bytes())
        .bind(key)
        .bind(items_of(&order))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    tx.commit(created(&id, &order)).await
}

// ---- SQLite --------------------------------------------------------------------------------

const LITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_orders (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    items TEXT NOT NULL, created_at INTEGER NOT NULL)";
const LITE_INDEX: &str = PG_INDEX;
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

// ---- Routers and the driver ----------------------------------------------------------------

/// The authentication stand-in every variant sits behind: puts the caller's scope into the
/// request extensions, where `oncely_tower::ExtensionScope` (the layer's default) finds it.
async fn scope(mut req: Request<Body>, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new(SCOPE));
    next.run(req).await
}

/// Every router is finalized with `with_state(())`, as `axum::serve` does (through
/// `into_make_service`): a `Router<()>` driven through `oneshot` as it is would otherwise build
/// its handler's route, with every layer on it, again on every request (axum keeps a
/// stateless handler unbuilt until the state is given), a cost no server pays.
fn with_scope(router: Router) -> Router {
    router.layer(middleware::from_fn(scope)).with_state(())
}

impl Bench {
    /// PostgreSQL from `ONCELY_BENCH_POSTGRES_URL` (or `ONCELY_TEST_POSTGRES_URL`), migrated,
    /// with the `bench_orders` table; the reason it is skipped otherwise.
    ///
    /// # Errors
    ///
    /// A message naming the missing variable, or the database's error.
    pub async fn postgres() -> Result<Self, String> {
        Self::postgres_with_rtt(None).await
    }

    /// [`Bench::postgres`] through a [`LatencyProxy`](crate::proxy::LatencyProxy) that adds
    /// `rtt` to every round trip (half of it each way; zero: no delay, round trips still
    /// counted, see [`Bench::round_trips`]); `None`: direct, as [`Bench::postgres`]. Every
    /// connection of the pool, migrations included, goes through the proxy.
    ///
    /// # Errors
    ///
    /// As [`Bench::postgres`], and the proxy's if it cannot start.
    pub async fn postgres_with_rtt(rtt: Option<Duration>) -> Result<Self, String> {
        let direct = crate::env_url("ONCELY_BENCH_POSTGRES_URL", "ONCELY_TEST_POSTGRES_URL")
            .ok_or("ONCELY_BENCH_POSTGRES_URL is not set")?;
        let proxy = match rtt {
            Some(rtt) => Some(
                crate::proxy::LatencyProxy::start(&crate::proxy::upstream_of(&direct)?, rtt / 2)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let url = match &proxy {
            Some(p) => p.url(&direct)?,
            None => direct,
        };
        // `ONCELY_BENCH_PG_COMPLETION_WITH_COMMIT=1`: the layer sends its completion with the
        // commit in one message (`PostgresStore::with_completion_sent_with_commit`).
        let one_message =
            std::env::var("ONCELY_BENCH_PG_COMPLETION_WITH_COMMIT").is_ok_and(|v| v == "1");
        let store = PostgresStore::connect(&url)
            .await
            .map_err(|e| e.to_string())?
            .with_completion_sent_with_commit(one_message);
        store.migrate().await.map_err(|e| e.to_string())?;
        let pool = store.pool().clone();
        for ddl in [PG_SCHEMA, PG_INDEX] {
            sqlx::query(ddl)
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(Self {
            db: Db::Postgres,
            pool: Pool::Pg(pool.clone()),
            baseline: with_scope(
                Router::new()
                    .route(PATH, post(pg_baseline))
                    .with_state(pool.clone()),
            ),
            floor: with_scope(Router::new().route(PATH, post(pg_floor)).with_state(pool)),
            layer: with_scope(
                Router::new()
                    .route(PATH, post(pg_layer))
                    .layer(oncely_sqlx::layer(store, Policy::default())),
            ),
            proxy,
            _dir: None,
        })
    }

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
                    .route(PATH, post(my_baseline))
                    .with_state(pool.clone()),
            ),
            floor: with_scope(Router::new().route(PATH, post(my_floor)).with_state(pool)),
            layer: with_scope(
                Router::new()
                    .route(PATH, post(my_layer))
                    .layer(oncely_sqlx::layer(store, Policy::default())),
            ),
            _dir: None,
        })
    }

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

    /// The round trips counted by the latency proxy between the bench and its database
    /// ([`Bench::postgres_with_rtt`]); `None` without one (direct, or SQLite, which runs in
    /// process and has no round trips to count).
    pub fn round_trips(&self) -> Option<Arc<crate::proxy::RoundTrips>> {
        self.proxy
            .as_ref()
            .map(crate::proxy::LatencyProxy::round_trips)
    }

    /// The router of `variant`.
    pub fn router(&self, variant: Variant) -> &Router {
        match variant {
            Variant::Baseline => &self.baseline,
            Variant::Floor => &self.floor,
            Variant::Layer => &self.layer,
        }
    }

    /// Sends `n` requests with the keys `{prefix}-0` .. `{prefix}-{n-1}` through `variant`'s
    /// router, `concurrency` at a time (each through `oneshot` on a clone of the router), and
    /// reads every response body. Returns the wall time.
    ///
    /// # Errors
    ///
    /// The first answer that is not `201 Created`, with its body.
    pub async fn drive(
        &self,
        variant: Variant,
        prefix: &str,
        n: usize,
        concurrency: usize,
    ) -> Result<Duration, String> {
        self.drive_timed(variant, prefix, n, concurrency)
            .await
            .map(|(elapsed, _)| elapsed)
    }

    /// [`Bench::drive`], and each request's latency (from sending it to the end of its
    /// response body), sorted, shortest first.
    ///
    /// # Errors
    ///
    /// As [`Bench::drive`].
    pub async fn drive_timed(
        &self,
        variant: Variant,
        prefix: &str,
        n: usize,
        concurrency: usize,
    ) -> Result<(Duration, Vec<Duration>), String> {
        let router = self.router(variant).clone();
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(concurrency);
        for _ in 0..concurrency.max(1) {
            let router = router.clone();
            let next = Arc::clone(&next);
            let prefix = prefix.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, String>(latencies);
                    }
                    let sent = Instant::now();
                    let res = router
                        .clone()
                        .oneshot(request(&format!("{prefix}-{i}")))
                        .await
                        .unwrap_or_else(|e| match e {});
                    let status = res.status();
                    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
                        .await
                        .map_err(|e| e.to_string())?;
                    latencies.push(sent.elapsed());
                    if status != StatusCode::CREATED {
                        return Err(format!(
                            "{prefix}-{i}: {status}: {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                }
            }));
        }
        let mut all = Vec::with_capacity(n);
        for t in tasks {
            all.extend(t.await.map_err(|e| e.to_string())??);
        }
        let elapsed = start.elapsed();
        all.sort();
        Ok((elapsed, all))
    }

    /// Checks what `n` requests with the keys `{prefix}-0 ..` left behind: exactly one order
    /// row per key; for the floor and the layer, a `complete` record per key with status 201
    /// and the stored body naming that very order (the layer's replays thus answer the order
    /// that was written); for the baseline, no record.
    ///
    /// # Errors
    ///
    /// What differs, for the first key that differs.
    pub async fn verify(&self, variant: Variant, prefix: &str, n: usize) -> Result<(), String> {
        for i in 0..n {
            let key = format!("{prefix}-{i}");
            let (orders, record) = self.read(&key).await.map_err(|e| e.to_string())?;
            if orders.len() != 1 {
                return Err(format!("{key}: {} order rows, want 1", orders.len()));
            }
            match (variant, record) {
                (Variant::Baseline, None) => {}
                (Variant::Baseline, Some(_)) => return Err(format!("{key}: a record")),
                (_, None) => return Err(format!("{key}: no record")),
                (_, Some((state, status, body))) => {
                    let stored: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
                    if state != "complete" || status != Some(201) {
                        return Err(format!("{key}: record {state} {status:?}"));
                    }
                    if stored.get("id").and_then(Value::as_str) != Some(orders[0].as_str()) {
                        return Err(format!("{key}: stored {stored} for order {}", orders[0]));
                    }
                }
            }
        }
        Ok(())
    }

    /// Puts the tables back into one state before a variant is timed, so that no variant
    /// inherits another's dead rows or pays for its clean-up: deletes what earlier runs left
    /// (the orders in scope [`SCOPE`] and their records), then on PostgreSQL runs `VACUUM` on
    /// `oncely_idempotency_keys` and `bench_orders`, on SQLite a `TRUNCATE` checkpoint of the
    /// WAL; on MySQL nothing more (InnoDB's purge threads remove the deleted rows in the
    /// background, and there is no statement that waits for them). The timed bench also turns autovacuum off on the two tables for its run
    /// ([`Bench::autovacuum`]): an autovacuum that started in the middle of one variant's run
    /// slowed that variant down.
    ///
    /// Measured at 0ab903e: without it, 2.4 million dead rows had piled up over a session's
    /// runs (about 250,000 a run), and the PostgreSQL layer's throughput moved by 10% between
    /// two runs of the same binary while the floor's did not.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn settle(&self) -> Result<(), String> {
        self.delete_rows(SCOPE).await?;
        let result = match &self.pool {
            Pool::Pg(pool) => sqlx::query("VACUUM oncely_idempotency_keys, bench_orders")
                .execute(pool)
                .await
                .map(drop),
            Pool::My(_) => Ok(()),
            Pool::Lite(pool) => sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(pool)
                .await
                .map(drop),
        };
        result.map_err(|e| e.to_string())
    }

    /// Gives PostgreSQL's and MySQL's two tables the resident rows a real key table has
    /// (records kept for the retention): [`RESIDENT`] complete records in scope
    /// [`RESIDENT_SCOPE`] and an order each, unless they are there, then `ANALYZE`s both, so
    /// that the planner plans for a table of that size whatever the timed runs have just
    /// deleted (and InnoDB's B-trees have a real table's depth); nothing on SQLite.
    /// [`Bench::cleanup`] deletes them. (Without them, [`Bench::settle`]'s `VACUUM` of a table
    /// of only the bench's rows recorded it as empty, and the statements that read by key were
    /// planned as sequential scans: replays ran at a third of their speed.)
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn populate(&self) -> Result<(), String> {
        if let Pool::My(pool) = &self.pool {
            return populate_mysql(pool).await.map_err(|e| e.to_string());
        }
        let Pool::Pg(pool) = &self.pool else {
            return Ok(());
        };
        let now = now_ms();
        let statements = [
            sqlx::query(
                "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, \
                 fingerprint, token, state, completed_at, response_status, response_headers, \
                 response_body, response_body_retained, created_at, expires_at) \
                 SELECT $1, 'resident-' || i, 1, sha256(i::text::bytea), 1, 'complete', $3, 201, \
                 '\\x'::bytea, '\\x7b7d'::bytea, TRUE, $3, $4 FROM generate_series(1, $2) AS i \
                 ON CONFLICT (scope, key) DO NOTHING",
            ),
            sqlx::query(
                "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
                 SELECT 'ord_resident_' || i, $1, 'resident-' || i, '[]', $3 \
                 FROM generate_series(1, $2) AS i ON CONFLICT (id) DO NOTHING",
            ),
        ];
        for q in statements {
            q.bind(RESIDENT_SCOPE)
                .bind(i64::from(RESIDENT))
                .bind(now)
                .bind(now + RETENTION_MS)
                .execute(pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        sqlx::query("ANALYZE oncely_idempotency_keys, bench_orders")
            .execute(pool)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Turns PostgreSQL's autovacuum on (`RESET`, the database's default) or off for the two
    /// tables the bench writes (`ALTER TABLE ... SET (autovacuum_enabled ...)`, which takes a
    /// `SHARE UPDATE EXCLUSIVE` lock: it waits for a running `VACUUM`, `ANALYZE` or schema
    /// change on them, not for inserts or updates); nothing on SQLite. The timed bench calls it
    /// on a database of its own only (`ONCELY_BENCH_POSTGRES_URL`); a run that panics leaves
    /// autovacuum off on the two tables until the next run ends. See [`Bench::settle`].
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn autovacuum(&self, on: bool) -> Result<(), String> {
        let Pool::Pg(pool) = &self.pool else {
            return Ok(());
        };
        let ddl: [&'static str; 2] = if on {
            [
                "ALTER TABLE oncely_idempotency_keys RESET (autovacuum_enabled)",
                "ALTER TABLE bench_orders RESET (autovacuum_enabled)",
            ]
        } else {
            [
                "ALTER TABLE oncely_idempotency_keys SET (autovacuum_enabled = false)",
                "ALTER TABLE bench_orders SET (autovacuum_enabled = false)",
            ]
        };
        for statement in ddl {
            sqlx::query(statement)
                .execute(pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Deletes what the runs left behind, and [`Bench::populate`]'s resident rows.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn cleanup(&self) -> Result<(), String> {
        self.delete_rows(SCOPE).await?;
        self.delete_rows(RESIDENT_SCOPE).await
    }

    /// Deletes the orders in `scope` of `bench_orders` (this module's own table) and their
    /// key records, so that repeated runs do not grow the database ([`Bench::settle`]'s first
    /// step).
    async fn delete_rows(&self, scope: &str) -> Result<(), String> {
        let result = match &self.pool {
            Pool::Pg(pool) => sqlx::query(
                "DELETE FROM oncely_idempotency_keys k USING bench_orders o \
                     WHERE k.scope = $1 AND o.scope = $1 AND k.key = o.idempotency_key",
            )
            .bind(scope)
            .execute(pool)
            .await
            .and(
                sqlx::query("DELETE FROM bench_orders WHERE scope = $1")
                    .bind(scope)
                    .execute(pool)
                    .await,
            )
            .map(drop),
            Pool::My(pool) => sqlx::query(
                "DELETE k FROM oncely_idempotency_keys k JOIN bench_orders o \
                     ON k.scope = o.scope AND k.`key` = o.idempotency_key WHERE o.scope = ?",
            )
            .bind(scope.as_bytes())
            .execute(pool)
            .await
            .and(
                sqlx::query("DELETE FROM bench_orders WHERE scope = ?")
                    .bind(scope.as_bytes())
                    .execute(pool)
                    .await,
            )
            .map(drop),
            Pool::Lite(pool) => sqlx::query(
                "DELETE FROM oncely_idempotency_keys WHERE scope = ?1 AND key IN \
                     (SELECT idempotency_key FROM bench_orders WHERE scope = ?1)",
            )
            .bind(scope)
            .execute(pool)
            .await
            .and(
                sqlx::query("DELETE FROM bench_orders WHERE scope = ?1")
                    .bind(scope)
                    .execute(pool)
                    .await,
            )
            .map(drop),
        };
        result.map_err(|e| e.to_string())
    }

    /// The order ids with idempotency key `key`, and the record's state, status and body.
    async fn read(&self, key: &str) -> Result<(Vec<String>, Option<Record>), sqlx::Error> {
        match &self.pool {
            Pool::Pg(pool) => {
                let orders: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM bench_orders WHERE idempotency_key = $1")
                        .bind(key)
                        .fetch_all(pool)
                        .await?;
                let record: Option<(String, Option<i32>, Option<Vec<u8>>)> = sqlx::query_as(
                    "SELECT state, response_status, response_body FROM oncely_idempotency_keys \
                     WHERE scope = $1 AND key = $2",
                )
                .bind(SCOPE)
                .bind(key)
                .fetch_optional(pool)
                .await?;
                Ok((
                    orders.into_iter().map(|(id,)| id).collect(),
                    record.map(|(s, st, b)| (s, st.map(i64::from), b.unwrap_or_default())),
                ))
            }
            Pool::My(pool) => {
                let orders: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM bench_orders WHERE idempotency_key = ?")
                        .bind(key.as_bytes())
                        .fetch_all(pool)
                        .await?;
                let record: Option<(String, Option<i32>, Option<Vec<u8>>)> = sqlx::query_as(
                    "SELECT state, response_status, response_body FROM oncely_idempotency_keys \
                     WHERE scope = ? AND `key` = ?",
                )
                .bind(SCOPE.as_bytes())
                .bind(key.as_bytes())
                .fetch_optional(pool)
                .await?;
                Ok((
                    orders.into_iter().map(|(id,)| id).collect(),
                    record.map(|(s, st, b)| (s, st.map(i64::from), b.unwrap_or_default())),
                ))
            }
            Pool::Lite(pool) => {
                let orders: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM bench_orders WHERE idempotency_key = ?1")
                        .bind(key)
                        .fetch_all(pool)
                        .await?;
                let record: Option<(String, Option<i64>, Option<Vec<u8>>)> = sqlx::query_as(
                    "SELECT state, response_status, response_body FROM oncely_idempotency_keys \
                     WHERE scope = ?1 AND key = ?2",
                )
                .bind(SCOPE)
                .bind(key)
                .fetch_optional(pool)
                .await?;
                Ok((
                    orders.into_iter().map(|(id,)| id).collect(),
                    record.map(|(s, st, b)| (s, st, b.unwrap_or_default())),
                ))
            }
        }
    }
}

type Record = (String, Option<i64>, Vec<u8>);

/// [`Bench::populate`] on MySQL: the numbers 1 to [`RESIDENT`] from a cross join of five digit
/// tables (portable to MySQL 8 and MariaDB: a recursive CTE would stop at MySQL's
/// `cte_max_recursion_depth`, 1000 by default); an existing row is kept (`ON DUPLICATE KEY
/// UPDATE` of a column to itself).
async fn populate_mysql(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    const NUMBERS: &str = "SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS i \
        FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS a \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS b \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS c \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS e \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS f";
    let now = now_ms();
    let keys = format!(
        "INSERT INTO oncely_idempotency_keys (scope, `key`, fingerprint_version, fingerprint, \
         token, state, completed_at, response_status, response_headers, response_body, \
         response_body_retained, created_at, expires_at) \
         SELECT ?, CONCAT('resident-', n.i), 1, UNHEX(SHA2(n.i, 256)), 1, 'complete', ?, 201, \
         '', '{{}}', TRUE, ?, ? FROM ({NUMBERS}) AS n WHERE n.i <= ? \
         ON DUPLICATE KEY UPDATE token = token"
    );
    sqlx::query(sqlx::AssertSqlSafe(keys))
        .bind(RESIDENT_SCOPE.as_bytes())
        .bind(now)
        .bind(now)
        .bind(now + RETENTION_MS)
        .bind(RESIDENT)
        .execute(pool)
        .await?;
    let orders = format!(
        "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
         SELECT CONCAT('ord_resident_', n.i), ?, CONCAT('resident-', n.i), '[]', ? \
         FROM ({NUMBERS}) AS n WHERE n.i <= ? ON DUPLICATE KEY UPDATE id = id"
    );
    sqlx::query(sqlx::AssertSqlSafe(orders))
        .bind(RESIDENT_SCOPE.as_bytes())
        .bind(now)
        .bind(RESIDENT)
        .execute(pool)
        .await?;
    sqlx::raw_sql("ANALYZE TABLE oncely_idempotency_keys, bench_orders")
        .execute(pool)
        .await?;
    Ok(())
}

/// `POST /v1/orders` with `Idempotency-Key: key`, `content-type: application/json` and
/// [`BODY`].
pub fn request(key: &str) -> Request<Body> {
    Request::post(PATH)
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .expect("a valid request")
}

/// Counts the statements sqlx sends, from its own statement log (the `sqlx::query` tracing
/// events it emits once per executed statement, `BEGIN`, `COMMIT` and `ROLLBACK` included;
/// a transaction dropped without an explicit end is rolled back by sqlx without such an
/// event). A process-wide tracing subscriber that listens only while [`count::start`] is on,
/// so the timed runs go without it.
pub mod count {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};

    static ON: AtomicBool = AtomicBool::new(false);
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    struct Counter;

    struct Summary(Option<String>);

    impl Visit for Summary {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "summary" {
                self.0 = Some(value.to_owned());
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "summary" && self.0.is_none() {
                self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
            }
        }
    }

    impl Subscriber for Counter {
        fn register_callsite(&self, m: &'static Metadata<'static>) -> Interest {
            if m.target() == "sqlx::query" {
                Interest::sometimes()
            } else {
                Interest::never()
            }
        }
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            m.target() == "sqlx::query" && ON.load(Ordering::Relaxed)
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut s = Summary(None);
            event.record(&mut s);
            if let Some(summary) = s.0 {
                SEEN.lock().unwrap_or_else(|p| p.into_inner()).push(summary);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Installs the counting subscriber as the process's global default (once; later calls
    /// do nothing). Returns `false` when another global subscriber was installed first.
    pub fn install() -> bool {
        static DONE: Mutex<Option<bool>> = Mutex::new(None);
        let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
        *done.get_or_insert_with(|| tracing::subscriber::set_global_default(Counter).is_ok())
    }

    /// Starts recording (forgetting what was recorded before).
    pub fn start() {
        SEEN.lock().unwrap_or_else(|p| p.into_inner()).clear();
        ON.store(true, Ordering::SeqCst);
    }

    /// Stops recording and returns the statements seen since [`start`], each as sqlx's
    /// summary (its first four words), in the order they finished.
    pub fn stop() -> Vec<String> {
        ON.store(false, Ordering::SeqCst);
        std::mem::take(&mut *SEEN.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Of `statements`, how many were commits (`COMMIT`).
    pub fn commits(statements: &[String]) -> usize {
        statements
            .iter()
            // A bare COMMIT, or PostgreSQL's completion sent with its commit as one message
            // (docs/DESIGN.md, "The completion goes out with the commit").
            // (sqlx logs a summary of that message: its first statement, the completing
            // `WITH done AS (UPDATE oncely_idempotency_keys ...`).
            .filter(|s| {
                s.eq_ignore_ascii_case("commit")
                    || s.starts_with("WITH done AS (UPDATE oncely_idempotency_keys")
                    || s.starts_with("WITH done AS (UPDATE …")
            })
            .count()
    }
}
