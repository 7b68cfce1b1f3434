//! Duplicates that reach another process than the one running the first request wait for its
//! transaction in the database, and a burst of them must not use up that process's pool
//! (docs/DESIGN.md, "Duplicates while the first transaction is open"). Three servers, each
//! with its own store over its own pool of 3 connections to one PostgreSQL database, or one
//! MySQL / MariaDB database (three processes, as the database sees them: separate
//! connections, and no server knows what the others run). Each server runs two slow first requests, which hold two of its three
//! connections in their transactions; meanwhile retrying clients send duplicates of every slow
//! request to the two other servers, and fresh requests of other keys go to every server.
//!
//! Every request is answered without a `503` (none waits past the layer's store timeout for a
//! connection), the duplicates are answered in flight with `Retry-After` until they replay the
//! first request's response, and every request's side effect happens once.
//!
//! Each test is skipped, with a message, when its database's URL is unset
//! (`ONCELY_TEST_POSTGRES_URL`, `ONCELY_TEST_MYSQL_URL`; `.ci/run` sets both).

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use http_body_util::BodyExt;
use oncely_core::{Policy, Scope, SystemClock};
use oncely_mysql::MySqlStore;
use oncely_postgres::PostgresStore;
use oncely_sqlx::{Tx, TxError};
use sqlx::Executor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

const SERVERS: usize = 3;
/// Connections in each server's pool.
const POOL: u32 = 3;
/// Slow first requests per server (each holds a connection in its transaction).
const SLOW_PER_SERVER: usize = 2;
/// How long a slow first request holds its transaction, in milliseconds: longer than the
/// layer's store timeout (5 seconds), so that a connection held by a waiting duplicate for the
/// whole of it would leave requests queued behind it answered `503`.
const HOLD_MS: u64 = 7_000;
/// Requests of other keys per server, sent while the duplicates retry.
const OTHERS_PER_SERVER: usize = 4;
/// The most attempts a retrying client makes (each in-flight answer asks for about a second).
const MAX_ATTEMPTS: usize = 30;

/// Side effects, counted per key across the three servers.
type Effects = Arc<Mutex<HashMap<String, usize>>>;

/// Holds its transaction `x-hold-ms` (the claim's uncommitted row with it), writes one row and
/// commits `201` naming it.
async fn order(
    State(effects): State<Effects>,
    headers: HeaderMap,
    mut tx: Tx<PostgresStore>,
) -> Result<Response, TxError> {
    let hold: i64 = headers
        .get("x-hold-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let key = tx.id().key.as_str().to_owned();
    if hold > 0 {
        sqlx::query("SELECT pg_sleep($1::float8 / 1000)")
            .bind(hold)
            .execute(&mut *tx)
            .await?;
    }
    let id = format!("row_{}", uuid::Uuid::new_v4().simple());
    sqlx::query("INSERT INTO oncely_cross_process_rows (id, key) VALUES ($1, $2)")
        .bind(&id)
        .bind(&key)
        .execute(&mut *tx)
        .await?;
    *effects.lock().unwrap().entry(key).or_default() += 1;
    tx.commit((StatusCode::CREATED, id)).await
}

async fn authenticate(mut req: Request, next: Next) -> Response {
    req.extensions_mut()
        .insert(Scope::new("acct_cross_process"));
    next.run(req).await
}

/// A server: its own store over its own pool of [`POOL`] connections, set up as
/// `PostgresStore::connect` sets up its own (the 4-second `lock_timeout` in every session, the
/// 5-second acquire timeout); with `fewest`, its claims go out with their `BEGIN` and its
/// completions with their `COMMIT` (`oncely serve --pg-fewest-round-trips`).
async fn server(url: &str, effects: &Effects, fewest: bool) -> (Router, sqlx::PgPool) {
    let bound = PostgresStore::TX_LOCK_TIMEOUT;
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POOL)
        .acquire_timeout(PostgresStore::DEFAULT_ACQUIRE_TIMEOUT)
        .connect_with(options.options([("lock_timeout", format!("{}ms", bound.as_millis()))]))
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool.clone(), Arc::new(SystemClock))
        .with_pool_lock_timeout(bound)
        .with_claim_sent_with_begin(fewest)
        .with_completion_sent_with_commit(fewest);
    store.migrate().await.unwrap();
    let router = Router::new()
        .route("/orders", post(order))
        .with_state(Arc::clone(effects))
        .layer(oncely_sqlx::layer(store, Policy::default()))
        .layer(middleware::from_fn(authenticate));
    (router, pool)
}

/// [`order`] on MySQL / MariaDB.
async fn order_my(
    State(effects): State<Effects>,
    headers: HeaderMap,
    mut tx: Tx<MySqlStore>,
) -> Result<Response, TxError> {
    let hold: i64 = headers
        .get("x-hold-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let key = tx.id().key.as_str().to_owned();
    if hold > 0 {
        sqlx::query("SELECT SLEEP(? / 1000)")
            .bind(hold)
            .execute(&mut *tx)
            .await?;
    }
    let id = format!("row_{}", uuid::Uuid::new_v4().simple());
    sqlx::query("INSERT INTO oncely_cross_process_rows (id, `key`) VALUES (?, ?)")
        .bind(&id)
        .bind(&key)
        .execute(&mut *tx)
        .await?;
    *effects.lock().unwrap().entry(key).or_default() += 1;
    tx.commit((StatusCode::CREATED, id)).await
}

/// A MySQL / MariaDB server: its own store over its own pool of [`POOL`] connections, set up
/// as `MySqlStore::connect` sets up its own (the 4-second `innodb_lock_wait_timeout` in every
/// session, the 5-second acquire timeout).
async fn server_my(url: &str, effects: &Effects) -> (Router, sqlx::MySqlPool) {
    let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(POOL)
        .acquire_timeout(MySqlStore::DEFAULT_ACQUIRE_TIMEOUT)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION innodb_lock_wait_timeout = 4")
                    .await
                    .map(drop)
            })
        })
        .connect_with(options)
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool.clone(), Arc::new(SystemClock));
    store.migrate().await.unwrap();
    let router = Router::new()
        .route("/orders", post(order_my))
        .with_state(Arc::clone(effects))
        .layer(oncely_sqlx::layer(store, Policy::default()))
        .layer(middleware::from_fn(authenticate));
    (router, pool)
}

#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Option<u64>,
    body: String,
}

async fn send(router: &Router, key: &str, hold_ms: u64) -> Answer {
    let req = axum::http::Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .header("x-hold-ms", hold_ms.to_string())
        .body(Body::from("order 1"))
        .unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let retry_after = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    Answer {
        status,
        replayed,
        retry_after,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A client that retries the in-flight answer after its `Retry-After`, with the same key,
/// until it gets another answer. Returns every answer it got.
async fn retrying(router: Router, key: String) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..MAX_ATTEMPTS {
        let a = send(&router, &key, 0).await;
        let again = a.status == 409 && a.body.contains("idempotency_request_in_flight");
        let wait = a.retry_after;
        answers.push(a);
        if !again {
            break;
        }
        let wait = wait.expect("an in-flight answer carries Retry-After");
        tokio::time::sleep(Duration::from_secs(wait.min(1))).await;
    }
    answers
}

/// The PostgreSQL bursts run one at a time: each is sized to use up its servers' pools if
/// duplicates held connections, and two at once would measure each other.
static ONE_BURST_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn burst_on_postgres(fewest: bool) {
    let _turn = ONE_BURST_AT_A_TIME.lock().await;
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
        return;
    };
    let effects = Effects::default();
    let mut servers = Vec::new();
    for _ in 0..SERVERS {
        servers.push(server(&url, &effects, fewest).await);
    }
    let pool = servers[0].1.clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS oncely_cross_process_rows \
         (id TEXT PRIMARY KEY, key TEXT NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let routers: Vec<Router> = servers.iter().map(|(r, _)| r.clone()).collect();
    burst(&routers, &effects, &run).await;
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM oncely_cross_process_rows WHERE key LIKE '%' || $1 || '%'",
    )
    .bind(&run)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows, expected_rows(), "one row per request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_duplicates_across_processes_uses_up_no_pool() {
    burst_on_postgres(false).await;
}

/// The same with the claim sent with the `BEGIN` and the completion with the `COMMIT`
/// (docs/DESIGN.md, "The claim goes out with the begin").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_duplicates_across_processes_uses_up_no_pool_with_the_fewest_round_trips() {
    burst_on_postgres(true).await;
}

/// The same on MySQL / MariaDB, where each try of a duplicate's claim does not wait for the
/// held key (`MySqlStore::claim_tx`); verified on MariaDB (MySQL 8 cannot bound one statement's
/// lock wait, see `MySqlStore::claim_tx`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_duplicates_across_processes_uses_up_no_pool_on_mysql() {
    let Ok(url) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!("skipping: ONCELY_TEST_MYSQL_URL is unset (a MySQL or MariaDB URL is needed)");
        return;
    };
    let effects = Effects::default();
    let mut servers = Vec::new();
    for _ in 0..SERVERS {
        servers.push(server_my(&url, &effects).await);
    }
    let pool = servers[0].1.clone();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS oncely_cross_process_rows \
         (id VARCHAR(64) PRIMARY KEY, `key` VARCHAR(255) NOT NULL) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let routers: Vec<Router> = servers.iter().map(|(r, _)| r.clone()).collect();
    burst(&routers, &effects, &run).await;
    let rows: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM oncely_cross_process_rows WHERE `key` LIKE CONCAT('%', ?, '%')",
    )
    .bind(&run)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows, expected_rows(), "one row per request");
}

/// One row per request: the slow first requests and the other keys' requests.
fn expected_rows() -> i64 {
    i64::try_from(SERVERS * (SLOW_PER_SERVER + OTHERS_PER_SERVER)).unwrap()
}

/// The burst against `routers` (one per server), with keys of the run `run`: the slow first
/// requests, the retried duplicates at the other servers, the other keys' requests; then what
/// each was answered and how often each side effect happened.
async fn burst(routers: &[Router], effects: &Effects, run: &str) {
    // The slow first requests: two per server, each holding one of its connections.
    let mut slow = Vec::new();
    for (s, router) in routers.iter().enumerate() {
        for n in 0..SLOW_PER_SERVER {
            let key = format!("slow-{run}-{s}-{n}");
            let router = router.clone();
            let k = key.clone();
            slow.push((
                s,
                key,
                tokio::spawn(async move { send(&router, &k, HOLD_MS).await }),
            ));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Duplicates of every slow request, retried, at each of the two other servers.
    let mut dups = Vec::new();
    for (owner, key, _) in &slow {
        for (s, router) in routers.iter().enumerate() {
            if s != *owner {
                dups.push((
                    key.clone(),
                    tokio::spawn(retrying(router.clone(), key.clone())),
                ));
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Other keys' requests at every server while the duplicates wait.
    let mut others = Vec::new();
    for (s, router) in routers.iter().enumerate() {
        for n in 0..OTHERS_PER_SERVER {
            let key = format!("other-{run}-{s}-{n}");
            let router = router.clone();
            let k = key.clone();
            others.push((key, tokio::spawn(async move { send(&router, &k, 0).await })));
        }
    }

    // A safety net far past every bound, so that a hang fails rather than blocks.
    let all = async {
        let mut firsts = HashMap::new();
        for (_, key, task) in slow {
            let a = task.await.unwrap();
            assert_eq!(a.status, 201, "a slow first request: {a:?}");
            assert!(!a.replayed);
            firsts.insert(key, a.body);
        }
        for (key, task) in others {
            let a = task.await.unwrap();
            assert_eq!(
                a.status, 201,
                "another key's request gets a connection while duplicates wait: {a:?}"
            );
            assert_eq!(effects.lock().unwrap().get(&key), Some(&1), "{key}");
        }
        for (key, task) in dups {
            let answers = task.await.unwrap();
            let (last, waits) = answers.split_last().expect("at least one answer");
            for w in waits {
                assert_eq!(w.status, 409, "a duplicate waits in flight: {w:?}");
                assert!(w.retry_after.is_some(), "{w:?}");
            }
            assert_eq!(
                last.status, 201,
                "a duplicate ends in the replay: {answers:?}"
            );
            assert!(last.replayed, "{last:?}");
            assert_eq!(&last.body, &firsts[&key], "the first request's response");
        }
        for key in firsts.keys() {
            assert_eq!(
                effects.lock().unwrap().get(key),
                Some(&1),
                "{key}: the side effect happened once"
            );
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("every request is answered");
}
