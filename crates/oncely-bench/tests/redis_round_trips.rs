//! Round trips to Redis per request through the layer, counted by the latency proxy
//! (`oncely_bench::proxy`, no delay) between `oncely_redis::RedisStore` and the Redis at
//! `ONCELY_TEST_REDIS_URL` (skipped when unset). Counts, never timings.
//!
//! - `oncely_tower::IdempotencyLayer` with a single-phase handler that records no recovery
//!   point: a first execution is two round trips (the claim script, the completion script), a
//!   replay one (the claim script, which answers the stored response).
//! - A split store (`oncely_sqlx::Split`: keys in Redis, business writes in SQLite, in process),
//!   handler on `oncely_sqlx::Tx`: `Tx::commit` the same two and one. The split store's fencing
//!   of the business commit and its record of what committed live in its progress ledger, in
//!   the business database (docs/DESIGN.md, "Split stores"), so they cost Redis nothing.

#![allow(missing_docs)]

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use oncely_bench::proxy::{LatencyProxy, RoundTrips, upstream_of};
use oncely_core::{Maintenance, Policy, Scope};
use oncely_redis::{RedisConfig, RedisStore};
use oncely_sqlx::{Split, Tx, TxError};
use oncely_tower::IdempotencyLayer;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::ServiceExt;

type Lite = Split<sqlx::Sqlite>;

static RUNS: AtomicUsize = AtomicUsize::new(0);

async fn scope(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new("acct_round_trips"));
    next.run(req).await
}

fn request(key: &str) -> axum::http::Request<Body> {
    axum::http::Request::post("/v1/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(r#"{"sku":"sku_1"}"#))
        .expect("a request")
}

async fn plain() -> impl IntoResponse {
    RUNS.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, r#"{"id":"ord_1"}"#)
}

async fn insert(tx: &mut Tx<Lite>) -> Result<String, TxError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let id = format!("ord_{}", uuid::Uuid::new_v4().simple());
    sqlx::query("INSERT INTO orders (id, key) VALUES (?1, ?2)")
        .bind(&id)
        .bind(tx.id().key.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(id)
}

async fn split_commit(mut tx: Tx<Lite>) -> Result<Response, TxError> {
    let id = insert(&mut tx).await?;
    tx.commit((StatusCode::CREATED, id)).await
}

/// Sends each key twice and returns the round trips of each first execution and each replay.
async fn count(app: &Router, trips: &RoundTrips, what: &str) -> Vec<(u64, u64)> {
    let send = |key: String| async move {
        let before = trips.total();
        let res = app.clone().oneshot(request(&key)).await.expect("an answer");
        assert_eq!(res.status(), StatusCode::CREATED, "{what} {key}");
        let replayed = res.headers().contains_key("idempotent-replayed");
        axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .expect("the body");
        (trips.total() - before, replayed)
    };
    let prefix = uuid::Uuid::new_v4().simple().to_string();
    // Warm-up: the scripts in Redis's script cache, the connections open.
    for i in 0..3 {
        send(format!("{prefix}-warm-{i}")).await;
        send(format!("{prefix}-warm-{i}")).await;
    }
    let mut out = Vec::new();
    for i in 0..5 {
        let key = format!("{prefix}-{i}");
        let (first, replayed) = send(key.clone()).await;
        assert!(!replayed, "{what} {key}: first execution");
        let (replay, replayed) = send(key.clone()).await;
        assert!(replayed, "{what} {key}: replay");
        out.push((first, replay));
    }
    out
}

#[tokio::test]
async fn round_trips_per_first_execution_and_replay() {
    let Ok(url) = std::env::var("ONCELY_TEST_REDIS_URL") else {
        eprintln!("skipped: ONCELY_TEST_REDIS_URL is not set");
        return;
    };
    let proxy = LatencyProxy::start(&upstream_of(&url).expect("a Redis URL"), Duration::ZERO)
        .await
        .expect("the proxy starts");
    let store = RedisStore::connect_with(
        &proxy.url(&url).expect("a URL"),
        RedisConfig::new()
            .with_accept_volatile(true)
            .with_namespace(format!("rt-{}", uuid::Uuid::new_v4().simple())),
    )
    .await
    .expect("connects through the proxy");
    let trips = proxy.round_trips();

    let layer = Router::new()
        .route(
            "/v1/orders",
            post(plain).route_layer(IdempotencyLayer::new(Arc::new(store.clone()))),
        )
        .layer(middleware::from_fn(scope));
    RUNS.store(0, Ordering::SeqCst);
    assert_eq!(
        count(&layer, &trips, "layer").await,
        vec![(2, 1); 5],
        "layer: (first execution, replay) round trips per key"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 3 + 5, "one run per key");

    let dir = tempfile::tempdir().expect("a directory");
    let pool = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("business.sqlite3").display()
    ))
    .await
    .expect("SQLite");
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, key TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("the table");
    let keys: Arc<dyn Maintenance> = Arc::new(store);
    let split = Split::connect(keys, pool.clone())
        .await
        .expect("the progress ledger");
    let app = Router::new()
        .route("/v1/orders", post(split_commit))
        .layer(oncely_sqlx::layer(split, Policy::default()))
        .layer(middleware::from_fn(scope));
    RUNS.store(0, Ordering::SeqCst);
    assert_eq!(
        count(&app, &trips, "split commit").await,
        vec![(2, 1); 5],
        "split commit: (first execution, replay) round trips per key"
    );
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        3 + 5,
        "split commit: one run per key"
    );
    let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders")
        .fetch_one(&pool)
        .await
        .expect("a count");
    assert_eq!(rows, 3 + 5, "one order row per key");
}
