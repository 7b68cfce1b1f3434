//! A [`Split`](oncely_sqlx::Split) store over PostgreSQL (keys in the memory store, business
//! writes in PostgreSQL) checks every business commit: a handler that ignored a failed
//! statement and went on to `Tx::commit` or `Tx::checkpoint` must not have its response stored
//! as a success (nor its step recorded as done) for writes that never committed. PostgreSQL
//! answers the `COMMIT` of such an aborted transaction with `ROLLBACK` and no error, and sqlx
//! does not read the command tag, so only a check before the `COMMIT` tells.
//!
//! Skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset (`.ci/run` sets it).

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use http_body_util::BodyExt;
use oncely_core::{
    IdempotencyKey, KeyStore, Maintenance, MemoryStore, Policy, RecordKey, RecordState, Scope,
};
use oncely_sqlx::{Split, Tx, TxError};
use std::sync::Arc;
use tower::ServiceExt;

type Store = Split<sqlx::Postgres>;

const SCOPE: &str = "acct_split_commit";

async fn insert_row(tx: &mut Tx<Store>, id: &str) -> Result<(), TxError> {
    let key = tx.id().key.as_str().to_owned();
    sqlx::query("INSERT INTO oncely_split_commit_rows (id, key) VALUES ($1, $2)")
        .bind(id)
        .bind(key)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A statement that fails (a missing table), its error ignored: PostgreSQL aborts the
/// transaction, and every later statement of it would fail too.
async fn ignore_a_failed_statement(tx: &mut Tx<Store>) {
    let failed = sqlx::query("SELECT * FROM oncely_no_such_table")
        .execute(&mut **tx)
        .await;
    assert!(failed.is_err(), "the statement fails");
}

/// A row, then (unless `x-clean`) a failed statement ignored, then `x-then`: `commit` (the
/// default), `checkpoint` (a recovery point, then a second phase that commits), or `end` (the
/// handler's own `COMMIT` through the `Tx`, then the commit).
async fn handler(headers: HeaderMap, mut tx: Tx<Store>) -> Result<Response, TxError> {
    let key = tx.id().key.as_str().to_owned();
    insert_row(&mut tx, &format!("first_{key}")).await?;
    if headers.get("x-clean").is_none() {
        ignore_a_failed_statement(&mut tx).await;
    }
    let then = headers.get("x-then").and_then(|v| v.to_str().ok());
    match then {
        Some("checkpoint") => {
            let between = tx.checkpoint(&"recorded").await?;
            let mut tx = between.begin().await?;
            insert_row(&mut tx, &format!("second_{key}")).await?;
            tx.commit((StatusCode::CREATED, "created")).await
        }
        Some("end") => {
            sqlx::query("COMMIT").execute(&mut *tx).await?;
            tx.commit((StatusCode::CREATED, "created")).await
        }
        _ => tx.commit((StatusCode::CREATED, "created")).await,
    }
}

async fn authenticate(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new(SCOPE));
    next.run(req).await
}

struct Harness {
    keys: Arc<MemoryStore>,
    pool: sqlx::PgPool,
    router: Router,
}

async fn harness() -> Option<Harness> {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
        return None;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(7461621078)")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS oncely_split_commit_rows \
         (id TEXT PRIMARY KEY, key TEXT NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let keys = Arc::new(MemoryStore::new());
    let store = Split::connect(Arc::clone(&keys) as Arc<dyn Maintenance>, pool.clone())
        .await
        .unwrap();
    let router = Router::new()
        .route("/orders", post(handler))
        .layer(oncely_sqlx::layer(store, Policy::default()))
        .layer(middleware::from_fn(authenticate));
    Some(Harness { keys, pool, router })
}

struct Answer {
    status: u16,
    replayed: bool,
    body: String,
}

async fn send(router: &Router, key: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = axum::http::Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "text/plain");
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let res = router
        .clone()
        .oneshot(b.body(Body::from("order 1")).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    Answer {
        status,
        replayed,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn key() -> String {
    format!("k-{}", uuid::Uuid::new_v4().simple())
}

impl Harness {
    async fn rows(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM oncely_split_commit_rows WHERE key = $1")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn state(&self, key: &str) -> Option<RecordState> {
        let id = RecordKey::new(Scope::new(SCOPE), IdempotencyKey::new(key).unwrap());
        self.keys.get(&id).await.unwrap().map(|r| r.state)
    }

    /// The first attempt and its retry of a handler whose transaction was aborted: neither is
    /// answered (nor replayed) as a success, no row exists, and no response is stored.
    async fn assert_nothing_passes_for_done(&self, key: &str, headers: &[(&str, &str)]) {
        for attempt in ["first attempt", "retry"] {
            let a = send(&self.router, key, headers).await;
            assert_eq!(
                a.status, 500,
                "{attempt}: the aborted transaction is the handler's failure: {}",
                a.body
            );
            assert!(a.body.contains("database_error"), "{attempt}: {}", a.body);
            assert!(!a.replayed, "{attempt}: nothing stored to replay");
            assert_eq!(self.rows(key).await, 0, "{attempt}: nothing committed");
            assert!(
                !matches!(self.state(key).await, Some(RecordState::Complete { .. })),
                "{attempt}: no response stored: {:?}",
                self.state(key).await
            );
        }
    }
}

/// The control: without the failed statement the split store commits, stores and replays.
#[tokio::test]
async fn a_clean_commit_is_stored_and_replayed() {
    let Some(h) = harness().await else { return };
    let k = key();
    let first = send(&h.router, &k, &[("x-clean", "1")]).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = send(&h.router, &k, &[("x-clean", "1")]).await;
    assert_eq!(again.status, 201);
    assert!(again.replayed);
    assert_eq!(h.rows(&k).await, 1);
    assert!(matches!(
        h.state(&k).await,
        Some(RecordState::Complete { .. })
    ));
}

#[tokio::test]
async fn a_commit_of_an_aborted_transaction_is_not_stored_as_a_success() {
    let Some(h) = harness().await else { return };
    h.assert_nothing_passes_for_done(&key(), &[]).await;
}

#[tokio::test]
async fn a_checkpoint_of_an_aborted_transaction_does_not_go_on() {
    let Some(h) = harness().await else { return };
    let k = key();
    h.assert_nothing_passes_for_done(&k, &[("x-then", "checkpoint")])
        .await;
}

/// A handler that ran `COMMIT` itself: its row committed outside the phase, and the layer says
/// so (`500 idempotency_handler_misuse`) rather than storing a success over it.
#[tokio::test]
async fn a_transaction_the_handler_ended_is_refused() {
    let Some(h) = harness().await else { return };
    let k = key();
    let a = send(&h.router, &k, &[("x-clean", "1"), ("x-then", "end")]).await;
    assert_eq!(a.status, 500, "{}", a.body);
    assert!(a.body.contains("idempotency_handler_misuse"), "{}", a.body);
    assert!(
        !matches!(h.state(&k).await, Some(RecordState::Complete { .. })),
        "no response stored: {:?}",
        h.state(&k).await
    );
}
