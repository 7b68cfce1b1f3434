//! Round trips to PostgreSQL per request, counted by a TCP proxy between the pool and the
//! server: a first execution through `oncely_sqlx::layer`, a replay, and the same business
//! write on a plain sqlx transaction without idempotency (the baseline). A round trip is a burst of bytes from the client that follows an answer from the
//! server (or opens the connection): pipelined messages sent together count once. Every count
//! includes the pool's two pings, sqlx's check of the connection before use and its test of
//! the connection when it is given back (docs/DESIGN.md, "The completion goes out with the
//! commit").
//!
//! Skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset (`.ci/run` sets it).

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use oncely_core::{Policy, Scope};
use oncely_postgres::PostgresStore;
use oncely_sqlx::{SqlStore, Tx, TxError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

const SCOPE: &str = "acct_round_trips";

/// The proxy's count of client bursts that followed a server answer, over all connections.
#[derive(Default)]
struct Counter {
    round_trips: AtomicUsize,
    connections: AtomicUsize,
}

/// Listens on an ephemeral port and forwards every connection to `upstream`, counting.
async fn proxy(upstream: String, counter: Arc<Counter>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let server = TcpStream::connect(&upstream).await.unwrap();
            counter.connections.fetch_add(1, Ordering::SeqCst);
            // Who sent last on this connection: 0 nobody, 1 the client, 2 the server.
            let last = Arc::new(AtomicU8::new(0));
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let (up_last, up_counter) = (Arc::clone(&last), Arc::clone(&counter));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if up_last.swap(1, Ordering::SeqCst) != 1 {
                        up_counter.round_trips.fetch_add(1, Ordering::SeqCst);
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = sw.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    last.store(2, Ordering::SeqCst);
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    port
}

/// The handler: one business row, then the commit (with the stored response, under the layer).
async fn order<S: SqlStore<Database = sqlx::Postgres>>(mut tx: Tx<S>) -> Result<Response, TxError> {
    let key = tx.id().key.as_str().to_owned();
    sqlx::query("INSERT INTO oncely_sqlx_round_trip_rows (id, key) VALUES ($1, $2)")
        .bind(uuid::Uuid::new_v4().simple().to_string())
        .bind(key)
        .execute(&mut *tx)
        .await?;
    tx.commit((StatusCode::CREATED, "created")).await
}

/// The baseline: the same business row on a plain sqlx transaction, with no idempotency.
async fn plain(pool: sqlx::PgPool) -> (StatusCode, &'static str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO oncely_sqlx_round_trip_rows (id, key) VALUES ($1, $2)")
        .bind(uuid::Uuid::new_v4().simple().to_string())
        .bind("plain")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (StatusCode::CREATED, "created")
}

async fn authenticate(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new(SCOPE));
    next.run(req).await
}

fn request(path: &str, key: &str) -> Request {
    axum::http::Request::post(path)
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Body::from("order 1"))
        .unwrap()
}

struct Harness {
    counter: Arc<Counter>,
    pool: sqlx::PgPool,
    router: Router,
}

impl Harness {
    /// Sends `req`, waits until the pool has its connection back (sqlx's release ping runs on
    /// a task of its own after the response), and returns the status and the round trips the
    /// request made.
    async fn count(&self, req: Request) -> (u16, usize) {
        let before = self.counter.round_trips.load(Ordering::SeqCst);
        let status = self.router.clone().oneshot(req).await.unwrap().status();
        let mut waited = 0;
        while self.pool.num_idle() < self.pool.size() as usize {
            waited += 1;
            assert!(waited < 2000, "the connection never came back to the pool");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let after = self.counter.round_trips.load(Ordering::SeqCst);
        (status.as_u16(), after - before)
    }
}

async fn harness(completion_with_commit: bool, claim_with_begin: bool) -> Option<Harness> {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
        return None;
    };
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let counter = Arc::new(Counter::default());
    let port = proxy(upstream, Arc::clone(&counter)).await;
    // As `PostgresStore::connect` sets a pool up (the session's lock_timeout relied on), with
    // one connection, so that every request runs on the one whose statements are prepared.
    let bound = PostgresStore::TX_LOCK_TIMEOUT;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            options
                .host("127.0.0.1")
                .port(port)
                .options([("lock_timeout", format!("{}ms", bound.as_millis()))]),
        )
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool.clone(), Arc::new(oncely_core::SystemClock))
        .with_pool_lock_timeout(bound)
        .with_completion_sent_with_commit(completion_with_commit)
        .with_claim_sent_with_begin(claim_with_begin);
    store.migrate().await.unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS oncely_sqlx_round_trip_rows \
         (id TEXT PRIMARY KEY, key TEXT NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let baseline_pool = pool.clone();
    let baseline = Router::new().route("/plain", post(move || plain(baseline_pool.clone())));
    let keyed = Router::new()
        .route("/orders", post(order::<PostgresStore>))
        .layer(oncely_sqlx::layer(
            store,
            Policy::default().with_lease(Duration::from_secs(60)),
        ))
        .layer(middleware::from_fn(authenticate));
    Some(Harness {
        counter,
        pool,
        router: keyed.merge(baseline),
    })
}

fn key() -> String {
    format!("rt-{}", uuid::Uuid::new_v4().simple())
}

/// One test, the settings one after the other: their harnesses create the same table, and
/// two concurrent `CREATE TABLE IF NOT EXISTS` of one name can collide in PostgreSQL's catalog.
#[tokio::test]
async fn a_first_execution_costs_at_most_two_round_trips_over_the_baseline_and_a_replay_none() {
    // The default: the claim after the `BEGIN`, the prepared completion, then the `COMMIT`.
    first_executions_cost(false, false, 7, 5).await;
    // `with_completion_sent_with_commit`: the completion goes out with the commit.
    first_executions_cost(true, false, 6, 5).await;
    // ... and `with_claim_sent_with_begin`: the claim goes out with the begin, and a first
    // execution costs the baseline's round trips. A replay's failed claim leaves sqlx no
    // connection to read on: it goes back to the pool (its release ping), and the read takes
    // it again, without the pool's check when it is back in time, else with it: one round
    // trip more in all than the business work at most.
    first_executions_cost(true, true, 5, 6).await;
}

/// Counts the round trips of first executions, replays and the baseline, and checks that a
/// first execution costs `expected` (the baseline costs 5) and a replay at most `replay_at_most`.
async fn first_executions_cost(
    completion_with_commit: bool,
    claim_with_begin: bool,
    expected: usize,
    replay_at_most: usize,
) {
    let Some(h) = harness(completion_with_commit, claim_with_begin).await else {
        return;
    };
    // Warm-up: every statement prepared on the connection.
    for _ in 0..3 {
        let k = key();
        assert_eq!(h.count(request("/orders", &k)).await.0, 201);
        assert_eq!(h.count(request("/orders", &k)).await.0, 201);
        assert_eq!(h.count(request("/plain", &k)).await.0, 201);
    }
    let connections = h.counter.connections.load(Ordering::SeqCst);
    let (mut first, mut replay, mut baseline) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let k = key();
        let (status, n) = h.count(request("/orders", &k)).await;
        assert_eq!(status, 201);
        first.push(n);
        let (status, n) = h.count(request("/orders", &k)).await;
        assert_eq!(status, 201);
        replay.push(n);
        let (status, n) = h.count(request("/plain", &k)).await;
        assert_eq!(status, 201);
        baseline.push(n);
    }
    assert_eq!(
        h.counter.connections.load(Ordering::SeqCst),
        connections,
        "no connection was opened while counting"
    );
    eprintln!("round trips: first execution {first:?}, replay {replay:?}, baseline {baseline:?}");
    // The baseline: the pool's check, BEGIN, the business INSERT, COMMIT, the release ping.
    assert!(baseline.iter().all(|&n| n == 5), "baseline {baseline:?}");
    // A first execution: the claim's own round trip is one over the baseline unless it goes
    // out with the begin; the completion is another unless it goes out with the commit.
    assert!(
        first.iter().all(|&n| n == expected),
        "first execution {first:?} against the baseline's 5 (expected {expected})"
    );
    assert!(
        replay.iter().all(|&n| n <= replay_at_most),
        "replay {replay:?} (at most {replay_at_most})"
    );
}
