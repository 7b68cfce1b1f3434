//! The concurrency gate (docs/DESIGN.md, "Near-simultaneous duplicates"): 200 concurrent
//! identical requests with one key, through a real axum server on a real TCP listener, against
//! a real store. The handler's side
//! effect (a per-key counter) must happen once; every other response must be either
//! `409 idempotency_request_in_flight` with `Retry-After`, or a byte-identical replay of the
//! first response (status, body, and every header other than `Date`, plus
//! `Idempotent-Replayed: true`). Repeated 20 times, on the memory store and on SQLite.

mod common;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::post;
use common::{authenticate, comparable_headers};
use http::StatusCode;
use oncely_core::{KeyStore, MemoryStore};
use oncely_tower::{IdempotencyContext, IdempotencyLayer};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CONCURRENT: usize = 200;
const ROUNDS: usize = 20;

/// Side effects per key, and in total.
#[derive(Default)]
struct Effects {
    per_key: Mutex<HashMap<String, usize>>,
    total: AtomicUsize,
}

fn routes(effects: Arc<Effects>) -> Router {
    Router::new().route(
        "/v1/payments",
        post(move |ctx: IdempotencyContext, body: String| {
            let effects = effects.clone();
            async move {
                let n = effects.total.fetch_add(1, Ordering::SeqCst) + 1;
                *effects
                    .per_key
                    .lock()
                    .unwrap()
                    .entry(ctx.id().key.to_string())
                    .or_default() += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                let mut res = (
                    StatusCode::CREATED,
                    format!(
                        r#"{{"payment":"pay_{n}","key":"{}","request":{body}}}"#,
                        ctx.id().key
                    ),
                )
                    .into_response();
                let h = res.headers_mut();
                h.insert("content-type", "application/json".parse().unwrap());
                h.append("x-multi", format!("a{n}").parse().unwrap());
                h.append("x-multi", format!("b{n}").parse().unwrap());
                h.insert("location", format!("/v1/payments/pay_{n}").parse().unwrap());
                res
            }
        }),
    )
}

struct Got {
    status: StatusCode,
    headers: http::HeaderMap,
    body: bytes::Bytes,
}

async fn gate(store: Arc<dyn KeyStore>, label: &str) {
    let effects = Arc::new(Effects::default());
    let layer = IdempotencyLayer::new(store);
    let metrics = layer.metrics();
    let app = routes(effects.clone())
        .layer(layer)
        .layer(axum::middleware::from_fn(authenticate));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENT)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let url = format!("http://{addr}/v1/payments");

    let (mut in_flight, mut replays) = (0usize, 0usize);
    for round in 0..ROUNDS {
        let key = format!("{label}-gate-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(CONCURRENT));
        let tasks: Vec<_> = (0..CONCURRENT)
            .map(|_| {
                let (client, url, key, barrier) =
                    (client.clone(), url.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let res = client
                        .post(&url)
                        .header("x-account", "acct_gate")
                        .header("idempotency-key", &key)
                        .header("content-type", "application/json")
                        .body(r#"{"amount":100,"currency":"eur"}"#)
                        .send()
                        .await
                        .unwrap();
                    Got {
                        status: res.status(),
                        headers: res.headers().clone(),
                        body: res.bytes().await.unwrap(),
                    }
                })
            })
            .collect();
        let mut all = Vec::with_capacity(CONCURRENT);
        for t in tasks {
            all.push(t.await.unwrap());
        }
        assert_eq!(
            effects.per_key.lock().unwrap().get(&key).copied(),
            Some(1),
            "{label} round {round}: the side effect must happen once"
        );
        let originals: Vec<&Got> = all
            .iter()
            .filter(|g| {
                g.status == StatusCode::CREATED && !g.headers.contains_key("idempotent-replayed")
            })
            .collect();
        assert_eq!(
            originals.len(),
            1,
            "{label} round {round}: one original response"
        );
        let original = originals[0];
        for g in &all {
            if std::ptr::eq(g, original) {
                continue;
            }
            if g.status == StatusCode::CONFLICT {
                assert_eq!(g.headers["content-type"], "application/problem+json");
                let v: serde_json::Value = serde_json::from_slice(&g.body).unwrap();
                assert_eq!(
                    v["code"], "idempotency_request_in_flight",
                    "{label} round {round}"
                );
                assert_eq!(v["retryable"], true);
                assert_eq!(g.headers["retry-after"], "1");
                in_flight += 1;
            } else {
                assert_eq!(
                    g.headers["idempotent-replayed"], "true",
                    "{label} round {round}: {:?}",
                    g.status
                );
                assert_eq!(g.status, original.status);
                assert_eq!(
                    g.body, original.body,
                    "{label} round {round}: byte-identical body"
                );
                assert_eq!(
                    comparable_headers(&g.headers),
                    comparable_headers(&original.headers),
                    "{label} round {round}: identical headers"
                );
                replays += 1;
            }
        }
    }
    assert_eq!(effects.total.load(Ordering::SeqCst), ROUNDS, "{label}");
    assert_eq!(in_flight + replays, ROUNDS * (CONCURRENT - 1));
    let m = metrics.snapshot();
    assert_eq!(m.claims, ROUNDS as u64);
    assert_eq!(m.in_flight_conflicts, in_flight as u64);
    assert_eq!(m.replays, replays as u64);
    assert_eq!(
        (m.store_errors, m.fencing_rejections, m.mismatches),
        (0, 0, 0),
        "{label}"
    );
    println!(
        "{label}: {ROUNDS} rounds x {CONCURRENT}: {in_flight} in-flight 409s, {replays} replays, 1 execution per round"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_identical_requests_execute_once_on_the_memory_store() {
    gate(Arc::new(MemoryStore::new()), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_identical_requests_execute_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("oncely.db").display()
    );
    let store = oncely_sqlite::SqliteStore::connect(&url).await.unwrap();
    gate(Arc::new(store), "sqlite").await;
}
