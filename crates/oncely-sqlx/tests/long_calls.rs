//! A live request keeps its lease, whatever it is doing: outside calls that each take three
//! times the lease, duplicates arriving all the while, on every store the transactional layer
//! runs on (SQLite, PostgreSQL, MySQL / MariaDB, and split stores: keys in Redis, a Redis
//! Cluster or memory, business writes in SQLite), in real time.
//!
//! Checked for each: the lease seen in the store is always in the future while the request
//! runs (except where a phase holds SQLite's one write lock, see below), every duplicate is
//! answered in flight (none runs the handler), the record's fencing token never moves (no
//! takeover), and each outside call is made once.
//!
//! Two handlers: the right shape (every outside call between two phases, with
//! `Between::call`), and the wrong one (an outside call made inside an open phase). The
//! wrong one must not lose its lease either where the store allows it (PostgreSQL, MySQL and
//! split stores); on SQLite its phase holds the database's write lock for the call's duration, so
//! nothing can renew the lease meanwhile, and nothing can take it over either: the test checks
//! that no takeover happens and each call is made once.
//!
//! Tests that need a server skip, printing why, when `ONCELY_TEST_POSTGRES_URL`,
//! `ONCELY_TEST_MYSQL_URL`, `ONCELY_TEST_REDIS_URL` or `ONCELY_TEST_REDIS_CLUSTER_URL` is unset.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::{Router, http};
use http_body_util::BodyExt;
use oncely_core::{
    Clock, KeyStore, Maintenance, Policy, RecordKey, RecordState, Scope, SystemClock,
};
use oncely_sqlx::{SqlStore, Tx, TxError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

/// The lease of every claim: short, as a user who wants fast takeovers after a crash sets it.
const LEASE: Duration = Duration::from_millis(900);
/// The heartbeat: a third of the lease, as `oncely serve` sets it.
const HEARTBEAT: Duration = Duration::from_millis(300);
/// Each outside call takes three times the lease.
const CALL: Duration = Duration::from_millis(2700);
/// A duplicate of the request arrives this often.
const DUPLICATE_EVERY: Duration = Duration::from_millis(150);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Serialize, Deserialize)]
enum Step {
    Recorded,
    Charged,
}

/// The outside systems: how many times each call was made.
#[derive(Default)]
struct Outside {
    calls: Mutex<HashMap<&'static str, usize>>,
}

impl Outside {
    async fn call(&self, name: &'static str) {
        *self.calls.lock().unwrap().entry(name).or_default() += 1;
        tokio::time::sleep(CALL).await;
    }

    /// A call that answers at once.
    async fn call_now(&self, name: &'static str) {
        *self.calls.lock().unwrap().entry(name).or_default() += 1;
    }

    fn count(&self, name: &'static str) -> usize {
        self.calls.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

/// The right shape: record the intent, commit, call with no transaction open, record the
/// result in the next phase.
async fn between_phases<S: SqlStore>(
    State(outside): State<Arc<Outside>>,
    tx: Tx<S>,
) -> Result<Response, TxError> {
    let resumed: Option<Step> = tx.resume_from()?;
    let mut between = tx.checkpoint(&Step::Recorded).await?;
    if resumed < Some(Step::Charged) {
        between.call(|| outside.call("charge")).await?;
        between = between.begin().await?.checkpoint(&Step::Charged).await?;
    }
    between.call(|| outside.call("email")).await?;
    between
        .begin()
        .await?
        .commit((StatusCode::CREATED, "paid"))
        .await
}

/// The wrong shape: each outside call made while a phase's transaction is open.
async fn inside_a_phase<S: SqlStore>(
    State(outside): State<Arc<Outside>>,
    tx: Tx<S>,
) -> Result<Response, TxError> {
    let between = tx.checkpoint(&Step::Recorded).await?;
    let tx = between.begin().await?;
    outside.call("charge").await;
    let between = tx.checkpoint(&Step::Charged).await?;
    let tx = between.begin().await?;
    outside.call("email").await;
    tx.commit((StatusCode::CREATED, "paid")).await
}

async fn authenticate(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new("acct_long"));
    next.run(req).await
}

fn request(path: &str, key: &str) -> Request {
    http::Request::post(path)
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Body::from("pay 1"))
        .unwrap()
}

struct Answer {
    status: u16,
    replayed: bool,
    body: String,
}

async fn send(router: &Router, req: Request) -> Answer {
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Whether the store's view of the lease may lapse while a phase is open (SQLite: the phase
/// holds the write lock the renewal needs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// Nothing a phase does keeps the heartbeat from renewing.
    Always,
    /// The phase holds the write lock every renewal needs.
    BlockedByAnOpenPhase,
}

/// Runs `handler`'s route on `store` with one request and a duplicate every
/// [`DUPLICATE_EVERY`] until it ends, watching the record, and checks the outcome.
async fn run<S: SqlStore>(store: S, wrong_shape: bool, renewal: Renewal) {
    let outside = Arc::new(Outside::default());
    let path = if wrong_shape { "/inside" } else { "/between" };
    let router = Router::new()
        .route("/between", post(between_phases::<S>))
        .route("/inside", post(inside_a_phase::<S>))
        .with_state(Arc::clone(&outside))
        .layer(oncely_sqlx::layer(
            store.clone(),
            Policy::default()
                .with_lease(LEASE)
                .with_heartbeat(HEARTBEAT),
        ))
        .layer(middleware::from_fn(authenticate));
    let key = format!("long-{}", uuid::Uuid::new_v4().simple());
    let id = RecordKey::new(
        Scope::new("acct_long"),
        oncely_core::IdempotencyKey::new(&key).unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));

    let owner = {
        let (router, key) = (router.clone(), key.clone());
        tokio::spawn(async move { send(&router, request(path, &key)).await })
    };
    // The store's view of the lease, every 50 ms while the request runs.
    let watcher = {
        let (store, id, done) = (store.clone(), id.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut lapsed = Vec::new();
            let mut seen_in_flight = 0;
            while !done.load(Ordering::Acquire) {
                let now = SystemClock.now_millis();
                if let Some(rec) = store.get(&id).await.unwrap()
                    && let RecordState::InFlight {
                        lease_expires_at, ..
                    } = rec.state
                {
                    seen_in_flight += 1;
                    if lease_expires_at <= now {
                        lapsed.push(now - lease_expires_at);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (seen_in_flight, lapsed)
        })
    };
    // Duplicates, all the while.
    let duplicates = {
        let (router, key, done) = (router.clone(), key.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut answers = Vec::new();
            tokio::time::sleep(DUPLICATE_EVERY).await;
            while !done.load(Ordering::Acquire) {
                answers.push(send(&router, request(path, &key)).await);
                tokio::time::sleep(DUPLICATE_EVERY).await;
            }
            answers
        })
    };

    let first = owner.await.unwrap();
    done.store(true, Ordering::Release);
    let (seen_in_flight, lapsed) = watcher.await.unwrap();
    let duplicates = duplicates.await.unwrap();

    assert_eq!(first.status, 201, "{}", first.body);
    assert!(!first.replayed);
    assert_eq!(outside.count("charge"), 1, "the charge was made once");
    assert_eq!(outside.count("email"), 1, "the e-mail was sent once");
    let rec = store.get(&id).await.unwrap().expect("the record");
    assert_eq!(rec.state_name(), "complete");
    assert_eq!(rec.token.0, 1, "no takeover: the fencing token never moved");
    // About 2 calls of 2.7 s, a duplicate every 150 ms: dozens of them (on SQLite with the
    // wrong shape, each waits for the phase's write lock first: a few).
    let least = if renewal == Renewal::BlockedByAnOpenPhase && wrong_shape {
        2
    } else {
        10
    };
    assert!(duplicates.len() >= least, "{} duplicates", duplicates.len());
    for d in &duplicates {
        let in_flight = d.status == 409 && d.body.contains("idempotency_request_in_flight");
        // The last one may have found the request complete.
        let replay = d.status == 201 && d.replayed && d.body == first.body;
        // SQLite, wrong shape only: a duplicate that needs a write (the lease looked lapsed)
        // waits for the phase's write lock, bounded by the busy timeout.
        let waited = renewal == Renewal::BlockedByAnOpenPhase
            && wrong_shape
            && d.status == 503
            && d.body.contains("idempotency_store_unavailable");
        assert!(
            in_flight || replay || waited,
            "a duplicate was answered {} {}",
            d.status,
            d.body
        );
    }
    assert!(
        seen_in_flight >= 10,
        "the watcher saw the request in flight"
    );
    if renewal == Renewal::Always || !wrong_shape {
        assert!(
            lapsed.is_empty(),
            "the lease lapsed while the request was alive, by {lapsed:?} ms"
        );
    }
}

// ---- the stores ------------------------------------------------------------------------

async fn sqlite() -> oncely_sqlite::SqliteStore {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.keep().join("long_calls.sqlite3");
    let store = oncely_sqlite::SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
}

async fn postgres() -> Option<oncely_postgres::PostgresStore> {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is not set");
        return None;
    };
    let store = oncely_postgres::PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

async fn mysql() -> Option<oncely_mysql::MySqlStore> {
    let Ok(url) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!("skipping: ONCELY_TEST_MYSQL_URL is not set");
        return None;
    };
    let store = oncely_mysql::MySqlStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

/// Keys in `keys`, business transactions in a fresh SQLite database.
async fn split(keys: Arc<dyn Maintenance>) -> oncely_sqlx::Split<sqlx::Sqlite> {
    oncely_sqlx::Split::connect(keys, sqlite().await.pool().clone())
        .await
        .unwrap()
}

async fn redis(url_var: &str, extra: &str) -> Option<Arc<dyn Maintenance>> {
    let Ok(url) = std::env::var(url_var) else {
        eprintln!("skipping: {url_var} is not set");
        return None;
    };
    let url = if extra.is_empty() {
        url
    } else {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{extra}")
    };
    let config = oncely_redis::RedisConfig::new()
        .with_namespace(format!("oncely-long-{}", uuid::Uuid::new_v4().simple()));
    let store = oncely_redis::RedisStore::connect_with(&url, config)
        .await
        .unwrap();
    Some(Arc::new(store))
}

async fn redis_split(url_var: &str, extra: &str) -> Option<oncely_sqlx::Split<sqlx::Sqlite>> {
    Some(split(redis(url_var, extra).await?).await)
}

macro_rules! both_shapes {
    ($name:ident, $store:expr, $renewal:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn outside_calls_between_phases_keep_the_lease() {
                let Some(store) = $store else { return };
                run(store, false, Renewal::Always).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn outside_calls_inside_a_phase_are_not_taken_over() {
                let Some(store) = $store else { return };
                run(store, true, $renewal).await;
            }
        }
    };
}

both_shapes!(
    on_sqlite,
    Some(sqlite().await),
    Renewal::BlockedByAnOpenPhase
);
both_shapes!(on_postgres, postgres().await, Renewal::Always);
both_shapes!(
    on_postgres_with_the_fewest_round_trips,
    postgres().await.map(|s| s
        .with_claim_sent_with_begin(true)
        .with_completion_sent_with_commit(true)),
    Renewal::Always
);
both_shapes!(on_mysql, mysql().await, Renewal::Always);
both_shapes!(
    on_memory_keys,
    Some(split(Arc::new(oncely_core::MemoryStore::new())).await),
    Renewal::Always
);
both_shapes!(
    on_redis_keys,
    redis_split("ONCELY_TEST_REDIS_URL", "accept_volatile=true").await,
    Renewal::Always
);
both_shapes!(
    on_redis_cluster_keys,
    redis_split("ONCELY_TEST_REDIS_CLUSTER_URL", "").await,
    Renewal::Always
);

// ---- what else can stop a heartbeat --------------------------------------------------------

/// PostgreSQL with a pool of 3 connections, all held by 3 requests whose outside calls run
/// inside their phases: the heartbeat's renewals still get a connection (the store renews on a
/// pool of its own), so another process's duplicates never take any of them over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_handlers_hold_entirely_does_not_cost_a_lease() {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is not set");
        return;
    };
    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&url)
        .await
        .unwrap();
    let store = oncely_postgres::PostgresStore::from_pool(small, Arc::new(SystemClock));
    store.migrate().await.unwrap();
    // Another process: its own store and pool on the same database.
    let other = oncely_postgres::PostgresStore::connect(&url).await.unwrap();
    let outside = Arc::new(Outside::default());
    let policy = Policy::default()
        .with_lease(LEASE)
        .with_heartbeat(HEARTBEAT);
    let router = |store: oncely_postgres::PostgresStore| {
        Router::new()
            .route(
                "/inside",
                post(inside_a_phase::<oncely_postgres::PostgresStore>),
            )
            .with_state(Arc::clone(&outside))
            .layer(oncely_sqlx::layer(store, policy.clone()))
            .layer(middleware::from_fn(authenticate))
    };
    let (mine, theirs) = (router(store.clone()), router(other.clone()));
    let keys: Vec<String> = (0..3)
        .map(|_| format!("pool-{}", uuid::Uuid::new_v4().simple()))
        .collect();
    let owners: Vec<_> = keys
        .iter()
        .map(|k| {
            let (r, k) = (mine.clone(), k.clone());
            tokio::spawn(async move { send(&r, request("/inside", &k)).await })
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let duplicates = {
        let (r, keys, done) = (theirs.clone(), keys.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut answers = Vec::new();
            tokio::time::sleep(DUPLICATE_EVERY).await;
            while !done.load(Ordering::Acquire) {
                for k in &keys {
                    answers.push(send(&r, request("/inside", k)).await);
                }
                tokio::time::sleep(DUPLICATE_EVERY).await;
            }
            answers
        })
    };
    let mut firsts = Vec::new();
    for o in owners {
        firsts.push(o.await.unwrap());
    }
    done.store(true, Ordering::Release);
    let duplicates = duplicates.await.unwrap();
    for f in &firsts {
        assert_eq!(f.status, 201, "{}", f.body);
        assert!(!f.replayed);
    }
    assert_eq!(outside.count("charge"), 3, "one charge per request");
    assert_eq!(outside.count("email"), 3, "one e-mail per request");
    for k in &keys {
        let id = RecordKey::new(
            Scope::new("acct_long"),
            oncely_core::IdempotencyKey::new(k).unwrap(),
        );
        let rec = other.get(&id).await.unwrap().unwrap();
        assert_eq!(rec.state_name(), "complete");
        assert_eq!(rec.token.0, 1, "no takeover of {k}");
    }
    assert!(duplicates.len() >= 10, "{} duplicates", duplicates.len());
    for d in &duplicates {
        let in_flight = d.status == 409 && d.body.contains("idempotency_request_in_flight");
        let replay = d.status == 201 && d.replayed;
        assert!(
            in_flight || replay,
            "a duplicate got {} {}",
            d.status,
            d.body
        );
    }
}

/// The checked call itself: a transactional handler whose thread is blocked for three leases
/// (its heartbeat cannot run) is taken over by another process, which makes the call; the
/// owner, awake again, is refused by `Between::call` and makes none. SQLite, real time.
#[test]
fn a_phase_that_lost_its_lease_makes_no_outside_call() {
    let lease = Duration::from_millis(300);
    let policy = Policy::default()
        .with_lease(lease)
        .with_heartbeat(Duration::from_millis(100));
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("lost.sqlite3").display());
    let runtime = || tokio::runtime::Runtime::new().unwrap();
    let (owner_store, taker_store) = runtime().block_on(async {
        let a = oncely_sqlite::SqliteStore::connect(&url).await.unwrap();
        a.migrate().await.unwrap();
        let b = oncely_sqlite::SqliteStore::connect(&url).await.unwrap();
        (a, b)
    });
    let outside = Arc::new(Outside::default());
    let refused = Arc::new(AtomicBool::new(false));
    async fn blocking(
        State((outside, refused, block)): State<(Arc<Outside>, Arc<AtomicBool>, Duration)>,
        tx: Tx<oncely_sqlite::SqliteStore>,
    ) -> Result<Response, TxError> {
        let between = tx.checkpoint(&Step::Recorded).await?;
        // Synchronous work on the runtime's only thread: the heartbeat cannot run.
        std::thread::sleep(block);
        match between.call(|| outside.call_now("charge")).await {
            Ok(()) => {}
            Err(e) => {
                refused.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
        between
            .begin()
            .await?
            .commit((StatusCode::CREATED, "paid"))
            .await
    }
    let router = |store, block| {
        Router::new()
            .route("/blocking", post(blocking))
            .with_state((Arc::clone(&outside), Arc::clone(&refused), block))
            .layer(oncely_sqlx::layer(store, policy.clone()))
            .layer(middleware::from_fn(authenticate))
    };
    let (owner_app, taker_app) = (
        router(owner_store, lease * 3),
        router(taker_store, Duration::ZERO),
    );
    let taker = std::thread::spawn(move || {
        runtime().block_on(async move {
            tokio::time::sleep(lease * 2).await;
            send(&taker_app, request("/blocking", "lost-1")).await
        })
    });
    let owner = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move { send(&owner_app, request("/blocking", "lost-1")).await });
    let taker = taker.join().unwrap();
    assert_eq!(taker.status, 201, "{}", taker.body);
    assert_eq!(owner.status, 409, "{}", owner.body);
    assert!(owner.body.contains("idempotency_request_in_flight"));
    assert!(
        refused.load(Ordering::SeqCst),
        "Between::call refused the owner"
    );
    assert_eq!(outside.count("charge"), 1, "the charge was made once");
}

// ---- a graceful shutdown during an outside call ----------------------------------------------

/// Server `a` (its store `a`) shuts down 500 ms into a request whose charge takes three leases,
/// with a shutdown grace of 300 ms; server `b` (another process: its own store on the same
/// database) gets a duplicate every [`DUPLICATE_EVERY`] until one is answered `201`. The drain
/// does not suspend the request while its charge runs (it keeps the lease, and `b`'s duplicates
/// are answered in flight); once the charge returned and the next phase recorded it, the next
/// outside call (the e-mail) is refused and the request suspended there, and `b`'s retry
/// resumes after the charge. The charge is made once.
async fn drain_during_an_outside_call<S: SqlStore>(a: S, b: S) {
    let outside = Arc::new(Outside::default());
    let policy = Policy::default()
        .with_lease(LEASE)
        .with_heartbeat(HEARTBEAT);
    let router = |store: S| {
        let layer = oncely_sqlx::layer(store, policy.clone());
        let drain = layer.drain();
        let router = Router::new()
            .route("/between", post(between_phases::<S>))
            .with_state(Arc::clone(&outside))
            .layer(layer)
            .layer(middleware::from_fn(authenticate));
        (router, drain)
    };
    let ((a, drain), (b, _)) = (router(a), router(b));
    let key = format!("drain-{}", uuid::Uuid::new_v4().simple());
    let first = {
        let key = key.clone();
        tokio::spawn(async move { send(&a, request("/between", &key)).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    drain.start();
    let abandoned = tokio::spawn(async move {
        if tokio::time::timeout(Duration::from_millis(300), drain.idle())
            .await
            .is_err()
        {
            drain.abandon().await
        } else {
            0
        }
    });
    let mut answers = Vec::new();
    loop {
        tokio::time::sleep(DUPLICATE_EVERY).await;
        let got = send(&b, request("/between", &key)).await;
        let done = got.status == 201;
        answers.push(got);
        if done || answers.len() > 200 {
            break;
        }
    }
    let first = first.await.unwrap();
    let suspended = abandoned.await.unwrap();
    assert_eq!(outside.count("charge"), 1, "the charge was made once");
    assert_eq!(outside.count("email"), 1, "the e-mail was sent once");
    assert_eq!(suspended, 1, "suspended after its charge");
    assert_eq!(first.status, 503, "{}", first.body);
    assert!(first.body.contains("request_suspended"), "{}", first.body);
    let (last, before) = answers.split_last().unwrap();
    assert_eq!(last.status, 201, "{}", last.body);
    assert!(before.len() >= 10, "{} duplicates", before.len());
    for d in before {
        assert!(
            d.status == 409 && d.body.contains("idempotency_request_in_flight"),
            "a duplicate got {} {}",
            d.status,
            d.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_an_outside_call_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("drain.sqlite3").display());
    let a = oncely_sqlite::SqliteStore::connect(&url).await.unwrap();
    a.migrate().await.unwrap();
    let b = oncely_sqlite::SqliteStore::connect(&url).await.unwrap();
    drain_during_an_outside_call(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_an_outside_call_on_postgres() {
    let Some(a) = postgres().await else { return };
    let Some(b) = postgres().await else { return };
    drain_during_an_outside_call(a, b).await;
}
