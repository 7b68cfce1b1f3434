//! The phase conformance suite: the same scenarios, against a real axum app built on
//! `oncely_sqlx::layer`, on SQLite (always), PostgreSQL (when `ONCELY_TEST_POSTGRES_URL` is
//! set) and MySQL / MariaDB (when `ONCELY_TEST_MYSQL_URL` is set); where a variable is unset,
//! those tests print why and pass without running.
//!
//! A "crash" is modelled as a process dying: the handler panics at the crash point, so its
//! transaction is rolled back by the database and the layer does nothing after it (no release,
//! no suspension, no heartbeat); the test then moves the store's clock past the lease, as time
//! would pass before a retry took the key over.

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http_body_util::BodyExt;
use oncely_core::{ManualClock, Policy, RecordKey, RecordState, Scope};
use oncely_sqlx::{SqlStore, Tx, TxError};
use serde::{Deserialize, Serialize};
use sqlx::Database;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tower::ServiceExt;

const LEASE: Duration = Duration::from_secs(30);

tokio::task_local! {
    /// Set by `suite!`: how a PostgreSQL store of the test sends its statements, as
    /// (the completion with the commit in one message, the claim with the begin in one message).
    static PG_PATHS: (bool, bool);
}

/// One database under test: how to make a store on a [`ManualClock`], and the business table.
#[async_trait]
trait Db: SqlStore + oncely_core::Maintenance + Sized {
    /// Whether a `COMMIT` behind the back is caught at the commit of the claim's own
    /// transaction (the hot path): SQLite checks its savepoint there; PostgreSQL does not (a
    /// round trip), and the response is then stored by itself and answered.
    const GUARDS_HOT_COMMIT: bool;
    /// Whether a failed statement aborts the transaction it ran in (PostgreSQL; SQLite goes
    /// on, and only that statement failed).
    const FAILED_STATEMENT_ABORTS: bool;
    /// Runs `sql` (no binds) on `conn`.
    async fn raw(
        conn: &mut <Self::Database as Database>::Connection,
        sql: &'static str,
    ) -> Result<(), sqlx::Error>;
    async fn fresh(clock: ManualClock) -> Option<Self>;
    async fn insert_row(
        conn: &mut <Self::Database as Database>::Connection,
        id: &str,
        key: &str,
    ) -> Result<(), sqlx::Error>;
    async fn rows(&self, key: &str) -> i64;
    /// A statement that fails (a missing table: neither transient nor a refused value).
    async fn broken(conn: &mut <Self::Database as Database>::Connection)
    -> Result<(), sqlx::Error>;
    /// Whether two transactions that lock rows in opposite orders can deadlock (one is rolled
    /// back as its victim): PostgreSQL and MySQL; SQLite has one writer at a time.
    const DEADLOCKS: bool = true;
    /// Takes the row lock of the business row `id` (an `UPDATE` that changes nothing).
    async fn lock_row(
        conn: &mut <Self::Database as Database>::Connection,
        id: &str,
    ) -> Result<(), sqlx::Error>;
    /// Moves the record of `key` on to another token, inside the caller's transaction.
    async fn bump_token(
        conn: &mut <Self::Database as Database>::Connection,
        key: &str,
    ) -> Result<(), sqlx::Error>;
}

#[async_trait]
impl Db for oncely_sqlite::SqliteStore {
    const GUARDS_HOT_COMMIT: bool = true;
    const FAILED_STATEMENT_ABORTS: bool = false;
    async fn raw(conn: &mut sqlx::SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::query(sql).execute(conn).await.map(drop)
    }
    async fn fresh(clock: ManualClock) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.keep().join("phases.sqlite3");
        let store = oncely_sqlite::SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap()
            .with_clock(Arc::new(clock));
        store.migrate().await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS rows (id TEXT PRIMARY KEY, key TEXT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        Some(store)
    }
    async fn insert_row(
        conn: &mut sqlx::SqliteConnection,
        id: &str,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO rows (id, key) VALUES (?1, ?2)")
            .bind(id)
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }
    async fn rows(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM rows WHERE key = ?1")
            .bind(key)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
    async fn broken(conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT * FROM no_such_table")
            .execute(conn)
            .await
            .map(drop)
    }
    const DEADLOCKS: bool = false;
    async fn lock_row(conn: &mut sqlx::SqliteConnection, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE rows SET key = key WHERE id = ?1")
            .bind(id)
            .execute(conn)
            .await
            .map(drop)
    }
    async fn bump_token(conn: &mut sqlx::SqliteConnection, key: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE oncely_idempotency_keys SET token = token + 1 WHERE key = ?1")
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }
}

#[async_trait]
impl Db for oncely_postgres::PostgresStore {
    const GUARDS_HOT_COMMIT: bool = false;
    const FAILED_STATEMENT_ABORTS: bool = true;
    async fn raw(conn: &mut sqlx::PgConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::query(sql).execute(conn).await.map(drop)
    }
    async fn fresh(clock: ManualClock) -> Option<Self> {
        let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
            eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
            return None;
        };
        // A small pool per test (the tests run in parallel), set up as PostgresStore::connect
        // sets up its own: the 4-second lock_timeout in every session, relied on by the claim
        // and phase transactions (plain BEGIN; tests/lock_timeout.rs in oncely-postgres covers
        // the SET LOCAL path). It bounds a duplicate's wait.
        let bound = oncely_postgres::PostgresStore::TX_LOCK_TIMEOUT;
        let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(12)
            .connect_with(options.options([("lock_timeout", format!("{}ms", bound.as_millis()))]))
            .await
            .unwrap();
        let store = oncely_postgres::PostgresStore::from_pool(pool, Arc::new(clock))
            .with_pool_lock_timeout(bound)
            .with_completion_sent_with_commit(PG_PATHS.try_with(|p| p.0).unwrap_or(false))
            .with_claim_sent_with_begin(PG_PATHS.try_with(|p| p.1).unwrap_or(false));
        store.migrate().await.unwrap();
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock(7461621077)")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS oncely_sqlx_rows (id TEXT PRIMARY KEY, key TEXT NOT NULL)",
        )
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        Some(store)
    }
    async fn insert_row(
        conn: &mut sqlx::PgConnection,
        id: &str,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO oncely_sqlx_rows (id, key) VALUES ($1, $2)")
            .bind(id)
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }
    async fn rows(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM oncely_sqlx_rows WHERE key = $1")
            .bind(key)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
    async fn broken(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT * FROM oncely_sqlx_no_such_table")
            .execute(conn)
            .await
            .map(drop)
    }
    async fn lock_row(conn: &mut sqlx::PgConnection, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE oncely_sqlx_rows SET key = key WHERE id = $1")
            .bind(id)
            .execute(conn)
            .await
            .map(drop)
    }
    async fn bump_token(conn: &mut sqlx::PgConnection, key: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE oncely_idempotency_keys SET token = token + 1 WHERE key = $1")
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }
}

#[async_trait]
impl Db for oncely_mysql::MySqlStore {
    const GUARDS_HOT_COMMIT: bool = false;
    const FAILED_STATEMENT_ABORTS: bool = false;
    async fn raw(conn: &mut sqlx::MySqlConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::query(sql).execute(conn).await.map(drop)
    }
    async fn fresh(clock: ManualClock) -> Option<Self> {
        let Ok(url) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
            eprintln!(
                "skipping: ONCELY_TEST_MYSQL_URL is unset (a MySQL or MariaDB URL is needed)"
            );
            return None;
        };
        // A small pool per test (the tests run in parallel), with the server's session defaults
        // (a 50-second lock wait among them): the claim and phase transactions bound their own
        // waits at 4 seconds.
        let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(12)
            .connect_with(options)
            .await
            .unwrap();
        let store = oncely_mysql::MySqlStore::from_pool(pool, Arc::new(clock));
        store.migrate().await.unwrap();
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS oncely_sqlx_rows \
             (id VARCHAR(64) PRIMARY KEY, `key` VARCHAR(255) NOT NULL) ENGINE = InnoDB",
        )
        .execute(store.pool())
        .await
        .unwrap();
        Some(store)
    }
    async fn insert_row(
        conn: &mut sqlx::MySqlConnection,
        id: &str,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO oncely_sqlx_rows (id, `key`) VALUES (?, ?)")
            .bind(id)
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }
    async fn rows(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM oncely_sqlx_rows WHERE `key` = ?")
            .bind(key)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
    async fn broken(conn: &mut sqlx::MySqlConnection) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT * FROM oncely_sqlx_no_such_table")
            .execute(conn)
            .await
            .map(drop)
    }
    async fn lock_row(conn: &mut sqlx::MySqlConnection, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE oncely_sqlx_rows SET `key` = `key` WHERE id = ?")
            .bind(id)
            .execute(conn)
            .await
            .map(drop)
    }
    async fn bump_token(conn: &mut sqlx::MySqlConnection, key: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE oncely_idempotency_keys SET token = token + 1 WHERE `key` = ?")
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }
}

/// What the test app counts and how it can be told to misbehave.
struct Ctl<S> {
    store: S,
    executions: AtomicUsize,
    /// Outside calls made, by the idempotency key they carried.
    outside: Mutex<HashMap<String, usize>>,
    /// How many of the next executions fail (roll back) instead of committing.
    fail_next: AtomicUsize,
    /// How many of the next multi-step executions fail in their second phase (a row, then a
    /// failing statement), after the first phase committed.
    fail_second: AtomicUsize,
    /// Where the next execution crashes (once).
    crash_at: Mutex<Option<&'static str>>,
    /// Where the next execution waits for `gate` (once).
    pause_at: Mutex<Option<&'static str>>,
    gate: Notify,
    paused: Notify,
    /// Where the two requests of the deadlock scenario meet, each holding its first row lock.
    both_locked: tokio::sync::Barrier,
}

type App<S> = Arc<Ctl<S>>;

impl<S> Ctl<S> {
    fn crash(&self, point: &'static str) {
        let mut at = self.crash_at.lock().unwrap();
        if *at == Some(point) {
            *at = None;
            drop(at);
            panic!("simulated crash at {point}");
        }
    }
    async fn pause(&self, point: &'static str) {
        let hit = {
            let mut at = self.pause_at.lock().unwrap();
            let hit = *at == Some(point);
            if hit {
                *at = None;
            }
            hit
        };
        if hit {
            self.paused.notify_one();
            self.gate.notified().await;
        }
    }
}

async fn delay(headers: &HeaderMap) {
    if let Some(ms) = headers.get("x-delay-ms").and_then(|v| v.to_str().ok()) {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
    }
}

/// Single phase: one row, the response, one commit.
async fn single<S: Db>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    mut tx: Tx<S>,
    body: String,
) -> Result<Response, TxError> {
    app.executions.fetch_add(1, Ordering::SeqCst);
    let id = format!("row_{}", uuid::Uuid::new_v4().simple());
    let k = tx.id().key.as_str().to_owned();
    S::insert_row(&mut tx, &id, &k).await?;
    delay(&headers).await;
    if take(&app.fail_next) {
        // Dropping `tx` rolls the row and the claim back.
        return Ok((StatusCode::SERVICE_UNAVAILABLE, "try again").into_response());
    }
    let res = tx
        .commit((
            StatusCode::CREATED,
            [("x-row", id.clone())],
            Json(serde_json::json!({"id": id, "echo": body})),
        ))
        .await?;
    app.crash("after_commit");
    Ok(res)
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
enum Step {
    Recorded { row: String },
    Charged { row: String, charge: String },
}

/// Multi-step: record the row (intent), call the outside system, record the charge, answer.
async fn multi<S: Db>(State(app): State<App<S>>, mut tx: Tx<S>) -> Result<Response, TxError> {
    app.executions.fetch_add(1, Ordering::SeqCst);
    let key = tx.id().key.as_str().to_owned();
    let step = tx.resume_from::<Step>()?;
    let (row, between) = match step {
        None => {
            let row = format!("row_{}", uuid::Uuid::new_v4().simple());
            S::insert_row(&mut tx, &row, &key).await?;
            let b = tx.checkpoint(&Step::Recorded { row: row.clone() }).await?;
            (row, Some(b))
        }
        Some(Step::Recorded { row }) => {
            // Commit the takeover with the same step before the outside call.
            let b = tx.checkpoint(&Step::Recorded { row: row.clone() }).await?;
            (row, Some(b))
        }
        Some(Step::Charged { row, charge }) => {
            app.pause("resume_charged").await;
            return tx
                .commit((
                    StatusCode::CREATED,
                    Json(serde_json::json!({"row": row, "charge": charge})),
                ))
                .await;
        }
    };
    let between = between.expect("set above");
    app.crash("after_recorded");
    app.pause("after_recorded").await;
    let outside_key = oncely_sqlx::derived_key(between.id(), &row, "charge");
    *app.outside
        .lock()
        .unwrap()
        .entry(outside_key.clone())
        .or_default() += 1;
    let charge = format!("ch_{}", &outside_key[outside_key.len() - 8..]);
    let mut tx = between.begin().await?;
    app.pause("in_charged_phase").await;
    if take(&app.fail_second) {
        S::insert_row(&mut tx, &format!("{row}_lost"), &key).await?;
        S::broken(&mut tx).await?;
    }
    let between = tx
        .checkpoint(&Step::Charged {
            row: row.clone(),
            charge: charge.clone(),
        })
        .await?;
    app.crash("after_charged");
    let tx = between.begin().await?;
    tx.commit((
        StatusCode::CREATED,
        Json(serde_json::json!({"row": row, "charge": charge})),
    ))
    .await
}

/// Takes one from `n` if it is not 0.
fn take(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Inserts a business row for the request's key in `tx`; returns the key.
async fn own_row<S: Db>(tx: &mut Tx<S>) -> Result<String, TxError> {
    let k = tx.id().key.as_str().to_owned();
    let id = format!("row_{}", uuid::Uuid::new_v4().simple());
    S::insert_row(tx, &id, &k).await?;
    Ok(k)
}

/// A row, then a statement that fails, with `?` (the handler's own error).
async fn failing<S: Db>(mut tx: Tx<S>) -> Result<Response, TxError> {
    own_row(&mut tx).await?;
    S::broken(&mut tx).await?;
    tx.commit("unreachable").await
}

/// A row, then a statement that fails, its error ignored, then the commit (or, with
/// `x-then: checkpoint`, a checkpoint and a second phase).
async fn ignores_failure<S: Db>(headers: HeaderMap, mut tx: Tx<S>) -> Result<Response, TxError> {
    let k = own_row(&mut tx).await?;
    let _ignored = S::broken(&mut tx).await;
    if headers.get("x-then").is_some_and(|v| v == "checkpoint") {
        let next = tx.checkpoint(&Step::Recorded { row: k.clone() }).await?;
        let mut tx = next.begin().await?;
        S::insert_row(&mut tx, &format!("later_{k}"), &k).await?;
        return tx.commit("committed anyway").await;
    }
    tx.commit("committed anyway").await
}

/// A row, then the record moves on to another token in the same transaction: the completing
/// write is fenced, and the row goes with the rollback.
async fn fenced<S: Db>(mut tx: Tx<S>) -> Result<Response, TxError> {
    let k = own_row(&mut tx).await?;
    S::bump_token(&mut tx, &k).await?;
    tx.commit((StatusCode::CREATED, "created")).await
}

/// A handler bug: ends its transaction itself (`x-end`: `COMMIT` or `ROLLBACK`) after a row:
/// `x-where: first` in the claim's transaction, then checkpoints; `later` in its second phase,
/// then commits through the `Tx`.
async fn ends_itself<S: Db>(headers: HeaderMap, mut tx: Tx<S>) -> Result<Response, TxError> {
    let k = tx.id().key.as_str().to_owned();
    let end = match headers["x-end"].to_str().unwrap() {
        "COMMIT" => "COMMIT",
        _ => "ROLLBACK",
    };
    if headers.get("x-where").is_some_and(|w| w == "later") {
        let row = format!("row_{}", uuid::Uuid::new_v4().simple());
        S::insert_row(&mut tx, &row, &k).await?;
        tx = tx
            .checkpoint(&Step::Recorded { row })
            .await?
            .begin()
            .await?;
    }
    S::insert_row(
        &mut tx,
        &format!("end_{}", uuid::Uuid::new_v4().simple()),
        &k,
    )
    .await?;
    S::raw(&mut tx, end).await?;
    if headers.get("x-then").is_some_and(|t| t == "fail") {
        // ... and then fails, without reaching the Tx's commit.
        S::raw(&mut tx, "SELECT * FROM no_such_table_oncely").await?;
    }
    if headers.get("x-where").is_some_and(|w| w == "first") {
        // The end of the claim's own transaction, seen at its checkpoint (its commit is the
        // hot path, which neither database checks: see `SqlStore::complete_in`).
        let between = tx
            .checkpoint(&Step::Recorded {
                row: "unrecorded".into(),
            })
            .await?;
        return between
            .begin()
            .await?
            .commit((StatusCode::CREATED, "created"))
            .await;
    }
    tx.commit((StatusCode::CREATED, "created")).await
}

/// Writes a row and commits an answer with the status of `x-status` (a `503` says "come back
/// later"), then, with `x-return-other`, returns another response than the one it committed.
async fn commits_status<S: Db>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    mut tx: Tx<S>,
) -> Result<Response, TxError> {
    app.executions.fetch_add(1, Ordering::SeqCst);
    own_row(&mut tx).await?;
    let status: u16 = headers
        .get("x-status")
        .and_then(|v| v.to_str().ok())
        .map_or(201, |v| v.parse().unwrap());
    let committed = tx
        .commit((StatusCode::from_u16(status).unwrap(), "committed"))
        .await?;
    if headers.contains_key("x-return-other") {
        drop(committed);
        return Ok((StatusCode::OK, "something else").into_response());
    }
    Ok(committed)
}

/// Locks the business rows named by `x-first` and `x-then`, in that order, meeting the other
/// request of the deadlock scenario in between; then commits `201`.
async fn locks<S: Db>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    mut tx: Tx<S>,
) -> Result<Response, TxError> {
    app.executions.fetch_add(1, Ordering::SeqCst);
    let row = |name: &str| headers[name].to_str().unwrap().to_owned();
    S::lock_row(&mut tx, &row("x-first")).await?;
    if headers.contains_key("x-meet") {
        app.both_locked.wait().await;
    }
    S::lock_row(&mut tx, &row("x-then")).await?;
    tx.commit((StatusCode::CREATED, "locked")).await
}

/// A handler bug: writes, then answers success without committing.
async fn forget<S: Db>(mut tx: Tx<S>) -> Result<Response, TxError> {
    own_row(&mut tx).await?;
    Ok((StatusCode::CREATED, "created (not really)").into_response())
}

/// A response body that breaks while it is produced.
async fn broken_stream<S: Db>(mut tx: Tx<S>) -> Result<Response, TxError> {
    own_row(&mut tx).await?;
    let chunks: Vec<Result<&'static str, std::io::Error>> =
        vec![Ok("part;"), Err(std::io::Error::other("the stream broke"))];
    let body = Body::from_stream(futures::stream::iter(chunks));
    tx.commit((StatusCode::CREATED, body)).await
}

async fn authenticate(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new("acct_1"));
    next.run(req).await
}

struct Harness<S> {
    app: App<S>,
    router: Router,
    clock: ManualClock,
}

async fn harness<S: Db>() -> Option<Harness<S>> {
    harness_with(Policy::default().with_lease(LEASE)).await
}

async fn harness_with<S: Db>(policy: Policy) -> Option<Harness<S>> {
    let clock = ManualClock::starting_now();
    let store = S::fresh(clock.clone()).await?;
    let app = Arc::new(Ctl {
        store: store.clone(),
        executions: AtomicUsize::new(0),
        outside: Mutex::new(HashMap::new()),
        fail_next: AtomicUsize::new(0),
        fail_second: AtomicUsize::new(0),
        crash_at: Mutex::new(None),
        pause_at: Mutex::new(None),
        gate: Notify::new(),
        paused: Notify::new(),
        both_locked: tokio::sync::Barrier::new(2),
    });
    let router = Router::new()
        .route("/single", post(single::<S>))
        .route("/multi", post(multi::<S>))
        .route("/forget", post(forget::<S>))
        .route("/broken", post(broken_stream::<S>))
        .route("/failing", post(failing::<S>))
        .route("/ignores_failure", post(ignores_failure::<S>))
        .route("/fenced", post(fenced::<S>))
        .route("/ends_itself", post(ends_itself::<S>))
        .route("/commits_status", post(commits_status::<S>))
        .route("/locks", post(locks::<S>))
        .with_state(Arc::clone(&app))
        .layer(oncely_sqlx::layer(store, policy))
        .layer(middleware::from_fn(authenticate));
    Some(Harness { app, router, clock })
}

fn key() -> String {
    format!("k-{}", uuid::Uuid::new_v4().simple())
}

fn request(path: &str, key: &str, extra: &[(&str, &str)]) -> Request {
    let mut b = axum::http::Request::post(path)
        .header("idempotency-key", key)
        .header("content-type", "text/plain");
    for (n, v) in extra {
        b = b.header(*n, *v);
    }
    b.body(Body::from("order 1")).unwrap()
}

struct Answer {
    status: u16,
    replayed: bool,
    headers: HeaderMap,
    /// The body's exact length as announced before it was read (what becomes
    /// `Content-Length` on the wire), if known.
    exact_len: Option<u64>,
    body: Vec<u8>,
}

async fn send(router: &Router, req: Request) -> Answer {
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let exact_len = http_body::Body::size_hint(res.body()).exact();
    let headers = res.headers().clone();
    let replayed = headers.get("idempotent-replayed").is_some();
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    Answer {
        status,
        replayed,
        headers,
        exact_len,
        body,
    }
}

/// Sends a request whose handler crashes; the caller sees the panic, as a dead process's
/// client sees a dropped connection.
async fn send_crashing(router: &Router, req: Request) {
    let r = tokio::spawn(router.clone().oneshot(req)).await;
    assert!(r.unwrap_err().is_panic(), "the handler was meant to crash");
}

fn rid(k: &str) -> RecordKey {
    RecordKey::new(
        Scope::new("acct_1"),
        oncely_core::IdempotencyKey::new(k).unwrap(),
    )
}

// ---- the scenarios ---------------------------------------------------------------------

/// One execution, one commit: the row and the stored response commit together, the stored
/// response is exactly what was sent (status, content type, custom header, body), and a retry
/// replays it without entering the handler.
async fn single_phase_commits_and_replays<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    let first = send(&h.router, request("/single", &k, &[])).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed);
    assert_eq!(first.headers["content-type"], "application/json");
    assert_eq!(h.app.store.rows(&k).await, 1);
    let rec = h.app.store.get(&rid(&k)).await.unwrap().expect("record");
    let RecordState::Complete { response, .. } = &rec.state else {
        panic!("expected complete, got {:?}", rec.state)
    };
    assert_eq!(response.status, 201);
    assert_eq!(response.body, first.body);
    assert!(
        response
            .headers
            .iter()
            .any(|(n, v)| n == "content-type" && v == b"application/json"),
        "the stored headers are those sent: {:?}",
        response.headers
    );
    let retry = send(&h.router, request("/single", &k, &[])).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers["x-row"], first.headers["x-row"]);
    // The same framing on the wire: both announce their length (Content-Length, not chunked).
    assert_eq!(first.exact_len, Some(first.body.len() as u64));
    assert_eq!(retry.exact_len, first.exact_len);
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 1);
    assert_eq!(h.app.store.rows(&k).await, 1);
    // A different request with the same key is a mismatch, never a replay (docs/DESIGN.md,
    // "Validation skipped on one path").
    let mut other = request("/single", &k, &[]);
    *other.body_mut() = Body::from("order 2");
    assert_eq!(send(&h.router, other).await.status, 422);
}

/// docs/DESIGN.md, "Near-simultaneous duplicates" for this kind of handler: duplicates sent while the first is still in its
/// transaction wait on the key it holds and replay once it commits; none runs the handler.
async fn concurrent_duplicates_wait_then_replay<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    let first = {
        let r = h.router.clone();
        let k = k.clone();
        tokio::spawn(
            async move { send(&r, request("/single", &k, &[("x-delay-ms", "400")])).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dups: Vec<_> = (0..8)
        .map(|_| {
            let r = h.router.clone();
            let k = k.clone();
            tokio::spawn(async move { send(&r, request("/single", &k, &[])).await })
        })
        .collect();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    for d in dups {
        let d = d.await.unwrap();
        assert_eq!(
            d.status,
            201,
            "a duplicate waits and replays: {}",
            String::from_utf8_lossy(&d.body)
        );
        assert!(d.replayed);
        assert_eq!(d.body, first.body);
    }
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 1);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// A handler that rolls back leaves no claim: the key is free, a retry executes afresh.
async fn rollback_releases_the_key<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    h.app.fail_next.store(1, Ordering::SeqCst);
    let failed = send(&h.router, request("/single", &k, &[])).await;
    assert_eq!(failed.status, 503);
    assert_eq!(h.app.store.rows(&k).await, 0);
    assert_eq!(
        h.app.store.get(&rid(&k)).await.unwrap(),
        None,
        "the claim rolled back with the writes"
    );
    let retry = send(&h.router, request("/single", &k, &[])).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed);
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 2);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// A duplicate that waited on a first attempt which then rolled back executes itself.
async fn duplicate_of_a_rolled_back_first_executes<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    h.app.fail_next.store(1, Ordering::SeqCst);
    let first = {
        let r = h.router.clone();
        let k = k.clone();
        tokio::spawn(
            async move { send(&r, request("/single", &k, &[("x-delay-ms", "400")])).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dup = send(&h.router, request("/single", &k, &[])).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, 503);
    assert_eq!(dup.status, 201);
    assert!(!dup.replayed, "it executed, after the first rolled back");
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 2);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// docs/DESIGN.md, "Committed, then crashed": the process dies after the commit, before the response reached the client: the
/// retry replays the committed response; nothing runs twice.
async fn commit_then_crash_replays<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    *h.app.crash_at.lock().unwrap() = Some("after_commit");
    send_crashing(&h.router, request("/single", &k, &[])).await;
    let retry = send(&h.router, request("/single", &k, &[])).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed);
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 1);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// A multi-step request killed after each committed phase resumes at its recovery point on the
/// retry: one row, one outside call per derived key, zero repeated outside calls when the crash
/// came after the call's phase committed.
async fn multi_phase_resumes_after_a_crash<S: Db>() {
    for point in ["after_recorded", "after_charged"] {
        let Some(h) = harness::<S>().await else {
            return;
        };
        let k = key();
        *h.app.crash_at.lock().unwrap() = Some(point);
        send_crashing(&h.router, request("/multi", &k, &[])).await;
        // The claim committed with the first phase: a retry within the lease is in flight.
        let early = send(&h.router, request("/multi", &k, &[])).await;
        assert_eq!(
            early.status, 409,
            "{point}: the dead owner's lease is still alive"
        );
        h.clock.advance(LEASE + Duration::from_secs(1));
        let retry = send(&h.router, request("/multi", &k, &[])).await;
        assert_eq!(
            retry.status,
            201,
            "{point}: {}",
            String::from_utf8_lossy(&retry.body)
        );
        assert!(!retry.replayed);
        assert_eq!(h.app.store.rows(&k).await, 1, "{point}: one row");
        let outside = h.app.outside.lock().unwrap().clone();
        assert_eq!(outside.len(), 1, "{point}: one derived key");
        assert_eq!(
            outside.values().sum::<usize>(),
            1,
            "{point}: no repeated outside call"
        );
        let again = send(&h.router, request("/multi", &k, &[])).await;
        assert!(again.replayed);
        assert_eq!(again.body, retry.body);
    }
}

/// Fencing during a phase: the owner pauses between phases past its lease, a retry takes the
/// key over and finishes; when the old owner wakes, its next phase is refused (409) and writes
/// nothing.
async fn a_stale_owner_is_fenced<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    *h.app.pause_at.lock().unwrap() = Some("after_recorded");
    let paused = h.app.paused.notified();
    let old = {
        let r = h.router.clone();
        let k = k.clone();
        tokio::spawn(async move { send(&r, request("/multi", &k, &[])).await })
    };
    paused.await;
    h.clock.advance(LEASE + Duration::from_secs(1));
    let new = send(&h.router, request("/multi", &k, &[])).await;
    assert_eq!(new.status, 201);
    h.app.gate.notify_one();
    let old = old.await.unwrap();
    assert_eq!(old.status, 409, "{}", String::from_utf8_lossy(&old.body));
    let rec = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
    assert!(matches!(rec.state, RecordState::Complete { .. }));
    assert_eq!(rec.token.0, 2);
    let replay = send(&h.router, request("/multi", &k, &[])).await;
    assert_eq!(replay.body, new.body);
    assert_eq!(h.app.store.rows(&k).await, 1);
    // Both owners made the outside call with the same derived key: the outside system collapses
    // it (the stale owner had committed only its intent when it paused).
    let outside = h.app.outside.lock().unwrap().clone();
    assert_eq!(outside.len(), 1);
}

/// A takeover is reported as such to the handler.
async fn a_takeover_resumes_with_its_step<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    *h.app.crash_at.lock().unwrap() = Some("after_recorded");
    send_crashing(&h.router, request("/multi", &k, &[])).await;
    // The checkpoint set the lease: alive up to its last millisecond, lapsed one after.
    h.clock.advance(LEASE - Duration::from_millis(1));
    assert_eq!(
        send(&h.router, request("/multi", &k, &[])).await.status,
        409
    );
    h.clock.advance(Duration::from_millis(2));
    let rec = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
    let rp: Step = serde_json::from_str(rec.recovery_point().unwrap()).unwrap();
    assert!(matches!(rp, Step::Recorded { .. }));
    // The abandoned record carries its request for the completer: the claim left it out (an
    // atomic store), the first checkpoint stored it. The listing is oldest first, and the
    // database is shared with other tests whose abandoned records are older: list them all.
    let abandoned = h
        .app
        .store
        .list_abandoned(Duration::ZERO, 100_000)
        .await
        .unwrap();
    let listed = abandoned
        .iter()
        .find(|r| r.key.as_str() == k)
        .expect("the crashed request is listed as abandoned");
    let stored = listed.request.as_ref().expect("the stored request");
    assert_eq!(stored.method, "POST");
    assert_eq!(stored.uri, "/multi");
    assert_eq!(stored.body, b"order 1");
    assert!(
        stored
            .headers
            .iter()
            .any(|(n, v)| n == "content-type" && v == b"text/plain"),
        "{:?}",
        stored.headers
    );
    let retry = send(&h.router, request("/multi", &k, &[])).await;
    assert_eq!(retry.status, 201);
    let rec = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
    assert_eq!(
        rec.token.0, 2,
        "the retry took over with a new fencing token"
    );
    assert!(
        rec.request.is_none(),
        "a completion drops the stored request"
    );
}

/// Between two phases (an outside call in progress) the layer's heartbeat renews the lease, so
/// a slow but live request is not taken over; it starts only once the claim committed.
async fn a_live_owner_between_phases_keeps_its_lease<S: Db>() {
    let Some(h) = harness_with::<S>(
        Policy::default()
            .with_lease(LEASE)
            .with_heartbeat(Duration::from_millis(50)),
    )
    .await
    else {
        return;
    };
    let k = key();
    *h.app.pause_at.lock().unwrap() = Some("after_recorded");
    let paused = h.app.paused.notified();
    let owner = {
        let r = h.router.clone();
        let k = k.clone();
        tokio::spawn(async move { send(&r, request("/multi", &k, &[])).await })
    };
    paused.await;
    // Time passes past the lease; the owner is alive and its heartbeat renews from "now".
    h.clock.advance(LEASE + Duration::from_secs(1));
    let before = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
    let mut renewed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let rec = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
        if let (
            RecordState::InFlight {
                lease_expires_at: now_l,
                ..
            },
            RecordState::InFlight {
                lease_expires_at: was,
                ..
            },
        ) = (&rec.state, &before.state)
            && now_l > was
        {
            renewed = true;
            break;
        }
    }
    assert!(renewed, "the heartbeat renewed the lease between phases");
    let dup = send(&h.router, request("/multi", &k, &[])).await;
    assert_eq!(dup.status, 409, "a live owner is not taken over");
    h.app.gate.notify_one();
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, 201);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// A handler that answers success without committing gets a 500 instead (its writes were rolled
/// back), and one whose response body breaks commits nothing: never a success the database does
/// not hold, never a truncated body stored as the result.
async fn no_success_without_a_commit<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    for (path, code) in [
        ("/forget", "handler_did_not_commit"),
        ("/broken", "response_failed"),
    ] {
        let k = key();
        let a = send(&h.router, request(path, &k, &[])).await;
        assert_eq!(
            a.status,
            500,
            "{path}: {}",
            String::from_utf8_lossy(&a.body)
        );
        let problem: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(problem["code"], code);
        assert_eq!(
            h.app.store.rows(&k).await,
            0,
            "{path}: the writes rolled back"
        );
        assert_eq!(
            h.app.store.get(&rid(&k)).await.unwrap(),
            None,
            "{path}: the key is free"
        );
    }
}

/// A later phase fails (a row, then a statement that fails) after the first phase committed:
/// the answer says so (retryable, where it stopped), not "nothing was committed"; the failed
/// phase's row is rolled back, the first phase's row stays, and the retry resumes at the
/// recovery point and finishes with the first phase's row there once.
async fn a_later_phase_failure_is_retryable_and_resumes<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    h.app.fail_second.store(1, Ordering::SeqCst);
    let failed = send(&h.router, request("/multi", &k, &[])).await;
    let text = String::from_utf8_lossy(&failed.body).into_owned();
    assert_eq!(failed.status, 503, "{text}");
    assert_eq!(failed.headers["retry-after"], "1");
    let problem: serde_json::Value = serde_json::from_slice(&failed.body).unwrap();
    assert_eq!(problem["code"], "request_suspended", "{text}");
    assert_eq!(problem["retryable"], true);
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("the database failed in a step"),
        "{detail}"
    );
    assert!(
        detail.contains("stopped after its step `Recorded`"),
        "{detail}"
    );
    assert_eq!(h.app.store.rows(&k).await, 1, "phase 1's row only");
    let rec = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
    let rp: Step = serde_json::from_str(rec.recovery_point().expect("in flight")).unwrap();
    assert!(matches!(rp, Step::Recorded { .. }), "{rp:?}");
    // The layer cut the lease short (to 1 ms): the retry takes over at once.
    h.clock.advance(Duration::from_millis(2));
    let retry = send(&h.router, request("/multi", &k, &[])).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(!retry.replayed);
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 2);
    assert_eq!(h.app.store.rows(&k).await, 1, "phase 1's row, once");
    assert_eq!(h.app.store.get(&rid(&k)).await.unwrap().unwrap().token.0, 2);
    // The resumed attempt repeated the outside call with the same derived key (the failed
    // phase had not recorded the charge), which the outside system collapses.
    let outside = h.app.outside.lock().unwrap().clone();
    assert_eq!(outside.len(), 1);
    assert_eq!(outside.values().sum::<usize>(), 2);
    let again = send(&h.router, request("/multi", &k, &[])).await;
    assert!(again.replayed);
    assert_eq!(again.body, retry.body);
}

/// A first phase whose own statement fails (with `?`; on PostgreSQL this also leaves the
/// transaction aborted) rolls back everything: no row, no claim, and the answer says nothing
/// was committed (not retryable: the same request fails the same way).
async fn a_failed_first_phase_leaves_nothing<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    let failed = send(&h.router, request("/failing", &k, &[])).await;
    assert_eq!(failed.status, 500);
    let problem: serde_json::Value = serde_json::from_slice(&failed.body).unwrap();
    assert_eq!(problem["code"], "database_error");
    assert_eq!(problem["retryable"], false);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("nothing was committed")
    );
    assert_eq!(h.app.store.rows(&k).await, 0);
    assert_eq!(
        h.app.store.get(&rid(&k)).await.unwrap(),
        None,
        "the key is free"
    );
}

/// A handler that ignores a failed statement and commits: where the failure aborted the
/// transaction (PostgreSQL), the commit is the handler's failure, answered as its own `?`
/// would have been (`500 database_error`, not retryable, nothing committed, the key free, and
/// a retry runs again), never as a key store outage (`503`, retryable); where it did not
/// (SQLite), the rest of the transaction commits and replays. The same at a checkpoint.
async fn an_ignored_failed_statement_is_the_handlers_failure<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    for (then, rows) in [("commit", 1), ("checkpoint", 2)] {
        let k = key();
        let extra = [("x-then", then)];
        if !S::FAILED_STATEMENT_ABORTS {
            let first = send(&h.router, request("/ignores_failure", &k, &extra)).await;
            assert_eq!(first.status, 200, "{then}");
            assert_eq!(first.body, b"committed anyway");
            assert_eq!(h.app.store.rows(&k).await, rows, "{then}");
            let again = send(&h.router, request("/ignores_failure", &k, &extra)).await;
            assert!(again.replayed, "{then}");
            assert_eq!(again.body, b"committed anyway");
            assert_eq!(h.app.store.rows(&k).await, rows, "{then}");
            continue;
        }
        for attempt in 0..2 {
            let got = send(&h.router, request("/ignores_failure", &k, &extra)).await;
            assert_eq!(got.status, 500, "{then}, attempt {attempt}");
            assert!(!got.replayed);
            let problem: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
            assert_eq!(
                problem["code"], "database_error",
                "{then}, attempt {attempt}"
            );
            assert_eq!(problem["retryable"], false);
            assert_eq!(h.app.store.rows(&k).await, 0, "{then}");
            assert_eq!(
                h.app.store.get(&rid(&k)).await.unwrap(),
                None,
                "{then}: the key is free after attempt {attempt}"
            );
        }
    }
}

/// The completing write is conditional on the token even inside the phase's own transaction:
/// when the record moved on to another token, `Tx::commit` is fenced (`409`) and the
/// business row rolls back with it.
async fn a_fenced_completion_commits_nothing<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    let fenced = send(&h.router, request("/fenced", &k, &[])).await;
    assert_eq!(
        fenced.status,
        409,
        "{}",
        String::from_utf8_lossy(&fenced.body)
    );
    let problem: serde_json::Value = serde_json::from_slice(&fenced.body).unwrap();
    assert_eq!(problem["code"], "idempotency_request_in_flight");
    assert_eq!(h.app.store.rows(&k).await, 0);
    assert_eq!(h.app.store.get(&rid(&k)).await.unwrap(), None);
}

/// A duplicate that finds the lease lapsed while the first request's phase is still open
/// cannot take over in the middle of it: it waits for the phase and replays its response.
async fn a_takeover_waits_for_an_open_phase<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    let first = {
        let r = h.router.clone();
        let k = k.clone();
        tokio::spawn(
            async move { send(&r, request("/single", &k, &[("x-delay-ms", "400")])).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.clock.advance(LEASE + Duration::from_secs(1));
    let dup = send(&h.router, request("/single", &k, &[])).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(dup.status, 201, "{}", String::from_utf8_lossy(&dup.body));
    assert!(dup.replayed);
    assert_eq!(dup.body, first.body);
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 1);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// A duplicate of a request whose later phase is open is answered in flight, never run, at
/// once on both databases: a later phase takes no lock on the record that a claim would wait for
/// (SQLite answers from a read that takes no lock; on PostgreSQL the phase writes the record
/// only in its closing statement).
async fn a_duplicate_during_a_later_phase_is_in_flight_at_once<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    *h.app.pause_at.lock().unwrap() = Some("in_charged_phase");
    let paused = h.app.paused.notified();
    let owner = {
        let r = h.router.clone();
        let k = k.clone();
        tokio::spawn(async move { send(&r, request("/multi", &k, &[])).await })
    };
    paused.await;
    let started = std::time::Instant::now();
    let dup = send(&h.router, request("/multi", &k, &[])).await;
    assert_eq!(dup.status, 409, "{}", String::from_utf8_lossy(&dup.body));
    // The phase stays open until the gate opens: only a bounded wait ends before it.
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    h.app.gate.notify_one();
    assert_eq!(owner.await.unwrap().status, 201);
    assert_eq!(h.app.store.rows(&k).await, 1);
}

/// A `COMMIT` or `ROLLBACK` run behind the `Tx`'s back is refused at `Tx::commit`: a `500`,
/// nothing stored, the key not released (the record is as the database holds it), and the
/// pool's connections keep working.
async fn a_transaction_ended_behind_the_tx_is_refused<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    for (place, end) in [
        ("claim", "COMMIT"),
        ("claim", "ROLLBACK"),
        ("first", "COMMIT"),
        ("first", "ROLLBACK"),
        ("later", "COMMIT"),
        ("later", "ROLLBACK"),
    ] {
        let k = key();
        let a = send(
            &h.router,
            request("/ends_itself", &k, &[("x-end", end), ("x-where", place)]),
        )
        .await;
        let text = String::from_utf8_lossy(&a.body).into_owned();
        if (place, end) == ("claim", "COMMIT") && !S::GUARDS_HOT_COMMIT {
            // Stored by itself after the handler's COMMIT: answered as it replays.
            assert_eq!(a.status, 201, "{text}");
            let rec = h.app.store.get(&rid(&k)).await.unwrap().unwrap();
            assert_eq!(rec.state_name(), "complete");
            let again = send(
                &h.router,
                request("/ends_itself", &k, &[("x-end", end), ("x-where", place)]),
            )
            .await;
            assert_eq!((again.status, again.body), (201, a.body));
            assert_eq!(h.app.store.rows(&k).await, 1);
            continue;
        }
        assert_eq!(a.status, 500, "{place} {end}: {text}");
        let problem: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(
            problem["code"], "idempotency_handler_misuse",
            "{place} {end}"
        );
        assert_eq!(problem["retryable"], false);
        assert!(text.contains("the key was not released"), "{text}");
        let rec = h.app.store.get(&rid(&k)).await.unwrap();
        // What the handler's own statement committed stays; nothing after it is recorded.
        let (rows, state, rp) = match (place, end) {
            ("first" | "claim", "COMMIT") => (1, Some("in_flight"), false),
            ("first" | "claim", _) => (0, None, false),
            ("later", "COMMIT") => (2, Some("in_flight"), true),
            _ => (1, Some("in_flight"), true),
        };
        assert_eq!(h.app.store.rows(&k).await, rows, "{place} {end}");
        assert_eq!(rec.as_ref().map(|r| r.state_name()), state, "{place} {end}");
        if let Some(rec) = rec {
            let step: Option<Step> = rec
                .recovery_point()
                .map(|p| serde_json::from_str(p).unwrap());
            assert_eq!(step.is_some(), rp, "{place} {end}: {step:?}");
        }
        // Every pooled connection still works.
        for _ in 0..12 {
            let k = key();
            assert_eq!(
                send(&h.router, request("/single", &k, &[])).await.status,
                201
            );
            assert_eq!(h.app.store.rows(&k).await, 1);
        }
    }
}

/// A handler that ends the claim's transaction itself and then fails (its `Tx` dropped, never
/// committed): answered `500 idempotency_handler_misuse`, not "nothing was committed" (after
/// its `COMMIT` the claim and its row did commit); the record is as the database holds it;
/// and the pool's connections keep working for the requests after it.
async fn a_transaction_ended_behind_the_tx_then_an_error_breaks_no_connection<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    for end in ["COMMIT", "ROLLBACK"] {
        let k = key();
        let a = send(
            &h.router,
            request("/ends_itself", &k, &[("x-end", end), ("x-then", "fail")]),
        )
        .await;
        let text = String::from_utf8_lossy(&a.body).into_owned();
        assert_eq!(a.status, 500, "{end}: {text}");
        let problem: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(
            problem["code"], "idempotency_handler_misuse",
            "{end}: {text}"
        );
        assert_eq!(problem["retryable"], false);
        let (rows, state) = if end == "COMMIT" {
            (1, Some("in_flight"))
        } else {
            (0, None)
        };
        assert_eq!(h.app.store.rows(&k).await, rows, "{end}");
        let rec = h.app.store.get(&rid(&k)).await.unwrap();
        assert_eq!(rec.as_ref().map(|r| r.state_name()), state, "{end}");
        for _ in 0..12 {
            let k = key();
            let r = send(&h.router, request("/single", &k, &[])).await;
            assert_eq!(r.status, 201, "{end}: {}", String::from_utf8_lossy(&r.body));
            assert_eq!(h.app.store.rows(&k).await, 1);
        }
    }
}

/// What a handler commits is judged like what it returns: a committed `503` (or `429`) is not
/// kept. Its phase rolls back (no row), nothing is stored (no replay), and the key is free, so
/// the retry runs again and its `201` is what replays from then on.
async fn a_committed_retry_later_answer_is_not_kept<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    for status in ["503", "429"] {
        let k = key();
        let first = send(
            &h.router,
            request("/commits_status", &k, &[("x-status", status)]),
        )
        .await;
        assert_eq!(first.status.to_string(), status);
        assert!(!first.replayed);
        assert_eq!(
            h.app.store.rows(&k).await,
            0,
            "{status}: its writes rolled back"
        );
        let rec = h.app.store.get(&rid(&k)).await.unwrap();
        assert!(
            rec.as_ref().is_none_or(|r| r.state_name() != "complete"),
            "{status}: nothing stored: {rec:?}"
        );
        let retry = send(&h.router, request("/commits_status", &k, &[])).await;
        assert_eq!(retry.status, 201, "{status}: the retry ran again");
        assert!(!retry.replayed);
        assert_eq!(h.app.store.rows(&k).await, 1);
        let again = send(&h.router, request("/commits_status", &k, &[])).await;
        assert!(again.replayed);
        assert_eq!((again.status, &again.body[..]), (201, &b"committed"[..]));
    }
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 4);
}

/// A handler that commits one response and returns another: its caller gets the committed one
/// (never a response that no retry will see), and every replay the same.
async fn the_committed_response_is_the_one_sent<S: Db>() {
    let Some(h) = harness::<S>().await else {
        return;
    };
    let k = key();
    let first = send(
        &h.router,
        request("/commits_status", &k, &[("x-return-other", "1")]),
    )
    .await;
    assert_eq!((first.status, &first.body[..]), (201, &b"committed"[..]));
    assert!(!first.replayed);
    let replay = send(&h.router, request("/commits_status", &k, &[])).await;
    assert!(replay.replayed);
    assert_eq!((replay.status, replay.body), (first.status, first.body));
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 1);
}

/// Two requests lock two business rows in opposite orders: the database rolls one back as the
/// deadlock's victim. Its handler returns the statement's error: a transient failure (`503
/// database_unavailable`, retryable), nothing of it committed (the key is free), and its retry
/// executes; never `500 idempotency_handler_misuse`, although the database, not the phase,
/// ended the victim's transaction (on MySQL the connection goes on in autocommit, as after a
/// handler's own `ROLLBACK`). The other request commits.
async fn a_deadlock_victim_is_retryable_and_its_retry_executes<S: Db>() {
    if !S::DEADLOCKS {
        return;
    }
    let Some(h) = harness::<S>().await else {
        return;
    };
    let (a, b) = (key(), key());
    // The two rows, written in a transaction of the store's own (a claim of a key of its own).
    let setup = oncely_conformance::claim_req(&rid(&key()), "{}");
    let (_, setup) = h.app.store.claim_tx(&setup).await.unwrap();
    let mut setup = setup.expect("the setup claim's transaction");
    for row in [&a, &b] {
        S::insert_row(&mut setup, row, "locks").await.unwrap();
    }
    setup.commit().await.unwrap();
    let send_locks = |k: String, first: String, then: String, meet: bool| {
        let r = h.router.clone();
        async move {
            let mut extra = vec![("x-first", first.as_str()), ("x-then", then.as_str())];
            if meet {
                extra.push(("x-meet", "1"));
            }
            send(&r, request("/locks", &k, &extra)).await
        }
    };
    let ka = key();
    let kb = key();
    let (ra, rb) = tokio::join!(
        tokio::spawn(send_locks(ka.clone(), a.clone(), b.clone(), true)),
        tokio::spawn(send_locks(kb.clone(), b.clone(), a.clone(), true)),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let (victim, victim_key) = match (ra.status, rb.status) {
        (201, 503) => (rb, kb),
        (503, 201) => (ra, ka),
        other => panic!(
            "one commits, one is the victim: {other:?} {} {}",
            String::from_utf8_lossy(&ra.body),
            String::from_utf8_lossy(&rb.body)
        ),
    };
    let problem: serde_json::Value = serde_json::from_slice(&victim.body).unwrap();
    assert_eq!(problem["code"], "database_unavailable", "{problem}");
    assert_eq!(problem["retryable"], true);
    assert_eq!(
        h.app.store.get(&rid(&victim_key)).await.unwrap(),
        None,
        "the victim's claim rolled back: the key is free"
    );
    let retry = send_locks(victim_key, a, b, false).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(!retry.replayed);
    assert_eq!(h.app.executions.load(Ordering::SeqCst), 3);
}

macro_rules! suite {
    ($module:ident, $store:ty) => {
        suite!($module, $store, (false, false));
    };
    ($module:ident, $store:ty, $one:expr) => {
        mod $module {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_transaction_ended_behind_the_tx_then_an_error_breaks_no_connection() {
                super::PG_PATHS.scope($one, super::a_transaction_ended_behind_the_tx_then_an_error_breaks_no_connection::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_committed_retry_later_answer_is_not_kept() {
                super::PG_PATHS.scope($one, super::a_committed_retry_later_answer_is_not_kept::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn the_committed_response_is_the_one_sent() {
                super::PG_PATHS.scope($one, super::the_committed_response_is_the_one_sent::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn single_phase_commits_and_replays() {
                super::PG_PATHS.scope($one, super::single_phase_commits_and_replays::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_duplicates_wait_then_replay() {
                super::PG_PATHS.scope($one, super::concurrent_duplicates_wait_then_replay::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn rollback_releases_the_key() {
                super::PG_PATHS.scope($one, super::rollback_releases_the_key::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn duplicate_of_a_rolled_back_first_executes() {
                super::PG_PATHS.scope($one, super::duplicate_of_a_rolled_back_first_executes::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn commit_then_crash_replays() {
                super::PG_PATHS.scope($one, super::commit_then_crash_replays::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn multi_phase_resumes_after_a_crash() {
                super::PG_PATHS.scope($one, super::multi_phase_resumes_after_a_crash::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_stale_owner_is_fenced() {
                super::PG_PATHS.scope($one, super::a_stale_owner_is_fenced::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_live_owner_between_phases_keeps_its_lease() {
                super::PG_PATHS.scope($one, super::a_live_owner_between_phases_keeps_its_lease::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn no_success_without_a_commit() {
                super::PG_PATHS.scope($one, super::no_success_without_a_commit::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_takeover_resumes_with_its_step() {
                super::PG_PATHS.scope($one, super::a_takeover_resumes_with_its_step::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_later_phase_failure_is_retryable_and_resumes() {
                super::PG_PATHS.scope($one, super::a_later_phase_failure_is_retryable_and_resumes::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_transaction_ended_behind_the_tx_is_refused() {
                super::PG_PATHS.scope($one, super::a_transaction_ended_behind_the_tx_is_refused::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_failed_first_phase_leaves_nothing() {
                super::PG_PATHS.scope($one, super::a_failed_first_phase_leaves_nothing::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_ignored_failed_statement_is_the_handlers_failure() {
                super::PG_PATHS.scope($one, super::an_ignored_failed_statement_is_the_handlers_failure::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_fenced_completion_commits_nothing() {
                super::PG_PATHS.scope($one, super::a_fenced_completion_commits_nothing::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_takeover_waits_for_an_open_phase() {
                super::PG_PATHS.scope($one, super::a_takeover_waits_for_an_open_phase::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_deadlock_victim_is_retryable_and_its_retry_executes() {
                super::PG_PATHS.scope($one, super::a_deadlock_victim_is_retryable_and_its_retry_executes::<$store>()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_duplicate_during_a_later_phase_is_in_flight_at_once() {
                super::PG_PATHS.scope($one, super::a_duplicate_during_a_later_phase_is_in_flight_at_once::<$store>()).await;
            }
        }
    };
}

suite!(sqlite, oncely_sqlite::SqliteStore);
suite!(postgres, oncely_postgres::PostgresStore);
// The same suite with the completion sent with the commit in one message
// (`PostgresStore::with_completion_sent_with_commit`), then with the claim sent with the
// begin as well (`PostgresStore::with_claim_sent_with_begin`: a first execution in the
// baseline's round trips), and with the claim sent with the begin alone.
suite!(
    postgres_one_message,
    oncely_postgres::PostgresStore,
    (true, false)
);
suite!(
    postgres_fewest_round_trips,
    oncely_postgres::PostgresStore,
    (true, true)
);
suite!(
    postgres_claim_with_begin,
    oncely_postgres::PostgresStore,
    (false, true)
);
suite!(mysql, oncely_mysql::MySqlStore);
