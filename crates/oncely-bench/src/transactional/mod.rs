//! The transactional bench (docs/PERFORMANCE.md, "The transactional layer against its
//! floor"): one single-phase endpoint, `POST /v1/orders` (insert one order row), built three
//! ways as axum [`Router`]s and driven in-process (no TCP: every variant pays the same HTTP
//! overhead, which is thus excluded), on PostgreSQL, MySQL / MariaDB and SQLite:
//!
//! - [`Variant::Baseline`]: `BEGIN`, the business `INSERT`, `COMMIT`, no idempotency at all;
//! - [`Variant::Floor`]: the same plus the minimum claim and completion statements in the same
//!   transaction, hand-written through sqlx (`INSERT ... ON CONFLICT DO NOTHING RETURNING`
//!   into `oncely_idempotency_keys`, the business `INSERT`, the completing `UPDATE` with the
//!   response, `COMMIT`): one commit, what any transactional idempotency layer must at least do
//!   (on MySQL, which has no `RETURNING`, the claim is `INSERT ... ON DUPLICATE KEY UPDATE`
//!   with the `LAST_INSERT_ID(expr)` idiom instead: see [`Bench::mysql`]);
//! - [`Variant::Layer`]: the same business `INSERT` in a handler taking
//!   [`oncely_sqlx::Tx`] behind [`oncely_sqlx::layer`] with
//!   [`Policy::default`](oncely_core::Policy::default).
//!
//! Every variant sits behind the same tiny middleware that puts the caller's
//! [`Scope`](oncely_core::Scope) into the request extensions (what an authentication layer does),
//! and answers `201 Created` with the same JSON body. `benches/transactional.rs` times them; this module's helpers also
//! check what each variant wrote ([`Bench::verify`]) and count the statements it sent
//! ([`count`]).
//!
//! The module by concept: this file has the two enums, [`Bench`] and its driver
//! ([`Bench::drive`], [`Bench::verify`]); `endpoint.rs` what every variant's handler shares (the
//! order, the answer, the scope middleware); `handlers.rs` the baseline's, floor's and layer's
//! handlers, written once over each database's statements; `postgres.rs`, `mysql.rs` and
//! `sqlite.rs` each database's tables, those statements and its [`Bench`] constructor;
//! `tables.rs` the tables between runs ([`Bench::settle`], [`Bench::populate`],
//! [`Bench::cleanup`]); `count.rs` the statement counter.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::Value;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tower::ServiceExt;

pub mod count;
mod endpoint;
mod handlers;
mod mysql;
mod postgres;
mod sqlite;
mod tables;

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

/// The claim's lease and the record's retention the floor writes (the
/// [`Policy`](oncely_core::Policy) defaults: 30 seconds and 72 hours), in milliseconds.
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

/// `POST /v1/orders` with `Idempotency-Key: key`, `content-type: application/json` and
/// [`BODY`].
pub fn request(key: &str) -> Request<Body> {
    Request::post(PATH)
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .expect("a valid request")
}

impl Bench {
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
}
