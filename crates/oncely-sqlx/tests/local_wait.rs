//! Duplicates of a transactional request this process is running wait in the process, not in
//! the database (`Claimer::local_wait`): a burst of them holds no pooled connection, so other
//! keys' requests still get one; each duplicate replays the first one's response once it has
//! committed, and one still waiting after `TransactionalClaimer::LOCAL_WAIT` is answered in
//! flight. PostgreSQL (skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset).

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use http_body_util::BodyExt;
use oncely_core::{Policy, Scope, SystemClock};
use oncely_postgres::PostgresStore;
use oncely_sqlx::{Tx, TxError};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// Sleeps `x-sleep-ms` inside the transaction (holding the claim's uncommitted row), then
/// writes one row and commits `201` naming it.
async fn slow(
    headers: axum::http::HeaderMap,
    mut tx: Tx<PostgresStore>,
) -> Result<Response, TxError> {
    let ms: i64 = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let key = tx.id().key.as_str().to_owned();
    sqlx::query("SELECT pg_sleep($1::float8 / 1000)")
        .bind(ms)
        .execute(&mut *tx)
        .await?;
    let id = format!("row_{}", uuid::Uuid::new_v4().simple());
    sqlx::query("INSERT INTO local_wait_rows (id, key) VALUES ($1, $2)")
        .bind(&id)
        .bind(&key)
        .execute(&mut *tx)
        .await?;
    tx.commit((StatusCode::CREATED, id)).await
}

async fn scope(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new("acct_local_wait"));
    next.run(req).await
}

/// The app on a pool of 3 connections that waits at most 1 second for one.
async fn app() -> Option<(Router, PostgresStore)> {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
        return None;
    };
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options.options([("lock_timeout", "4000ms")]))
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool, Arc::new(SystemClock))
        .with_pool_lock_timeout(PostgresStore::TX_LOCK_TIMEOUT);
    store.migrate().await.unwrap();
    // Serialized: two tests creating the table at once race in PostgreSQL's catalog.
    let mut ddl = store.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(7431)")
        .execute(&mut *ddl)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS local_wait_rows (id TEXT PRIMARY KEY, key TEXT NOT NULL)",
    )
    .execute(&mut *ddl)
    .await
    .unwrap();
    ddl.commit().await.unwrap();
    let router = Router::new()
        .route("/slow", post(slow))
        .route_layer(oncely_sqlx::layer(store.clone(), Policy::default()))
        .layer(middleware::from_fn(scope));
    Some((router, store))
}

fn request(key: &str, sleep_ms: u64) -> Request {
    axum::http::Request::post("/slow")
        .header("idempotency-key", key)
        .header("x-sleep-ms", sleep_ms.to_string())
        .body(Body::empty())
        .unwrap()
}

async fn send(router: &Router, req: Request) -> (u16, bool, Vec<u8>) {
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    (status, replayed, body)
}

async fn rows(store: &PostgresStore, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM local_wait_rows WHERE key = $1")
        .bind(key)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

fn key() -> String {
    format!("k-{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_duplicates_holds_no_connection_and_replays() {
    let Some((router, store)) = app().await else {
        return;
    };
    let k = key();
    let first = {
        let r = router.clone();
        let k = k.clone();
        tokio::spawn(async move { send(&r, request(&k, 2500)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 20 duplicates: in the database each would hold one of the 3 connections for the
    // first's remaining 2.2 seconds.
    let dups: Vec<_> = (0..20)
        .map(|_| {
            let r = router.clone();
            let k = k.clone();
            tokio::spawn(async move { send(&r, request(&k, 0)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another key meanwhile: gets a connection within the pool's 1-second acquire timeout.
    let other = key();
    let (status, _, body) = send(&router, request(&other, 0)).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(rows(&store, &other).await, 1);

    let (status, replayed, body) = first.await.unwrap();
    assert_eq!((status, replayed), (201, false));
    for d in dups {
        let (s, r, b) = d.await.unwrap();
        assert_eq!((s, r), (201, true), "{}", String::from_utf8_lossy(&b));
        assert_eq!(b, body, "every duplicate replays the first's response");
    }
    assert_eq!(rows(&store, &k).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_still_waiting_at_the_bound_is_in_flight() {
    let Some((router, store)) = app().await else {
        return;
    };
    let k = key();
    let wait_ms =
        u64::try_from(oncely_sqlx::TransactionalClaimer::<PostgresStore>::LOCAL_WAIT.as_millis())
            .unwrap();
    let first = {
        let r = router.clone();
        let k = k.clone();
        tokio::spawn(async move { send(&r, request(&k, wait_ms + 1500)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, body) = send(&router, request(&k, 0)).await;
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["code"], "idempotency_request_in_flight");
    assert_eq!(first.await.unwrap().0, 201);
    assert_eq!(rows(&store, &k).await, 1);
    // Now committed: a retry replays.
    let (status, replayed, _) = send(&router, request(&k, 0)).await;
    assert_eq!((status, replayed), (201, true));
}
