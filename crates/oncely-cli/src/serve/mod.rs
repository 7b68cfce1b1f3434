//! `oncely serve`: a reference payments API built with the library the way a user would build
//! it: an authentication middleware that puts the caller's account into the request as the
//! [`Scope`], the [`IdempotencyLayer`] over the write routes, and handlers that commit their
//! atomic phases through the key store.
//!
//! Authentication is a stand-in: `Authorization: Bearer <account>` makes `<account>` the
//! caller (and the idempotency scope). A real service puts its own authenticated identity there.

pub mod db;
pub mod health;
pub mod openapi;
pub mod payments;
pub mod server;
pub mod should_retry;
pub mod standby;

use anyhow::{Context as _, Result, bail};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use db::Db;
use oncely_core::{
    Clock, IdempotencyKey, KeyStore, MemoryStore, Policy, RecordKey, RecordState, Scope,
    SystemClock,
};
use oncely_tower::{IdempotencyLayer, Metrics};
use serde_json::{Value, json};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where the key store lives, from `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory`: in this process only.
    Memory,
    /// `sqlite://path`, or a plain file path: the embedded default.
    Sqlite(String),
    /// `postgres://…`
    Postgres(String),
    /// `redis://…`, `rediss://…`, or a Redis Cluster: `redis+cluster://host:port,host:port…`
    /// (`rediss+cluster://` for TLS); see `oncely_redis::RedisStore::connect_with` for the
    /// query options (`accept_volatile`, `wait_replicas`, `wait_timeout_ms`).
    Redis(String),
}

impl FromStr for StoreUrl {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(if s == "memory" {
            Self::Memory
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Self::Postgres(s.to_owned())
        } else if [
            "redis://",
            "rediss://",
            "redis+cluster://",
            "rediss+cluster://",
        ]
        .iter()
        .any(|p| s.starts_with(p))
        {
            Self::Redis(s.to_owned())
        } else if let Some(path) = s.strip_prefix("sqlite://") {
            Self::Sqlite(path.to_owned())
        } else if s.contains("://") {
            bail!(
                "unknown store {s:?}: expected memory, a file path, sqlite://PATH, postgres://…, redis://… or redis+cluster://…"
            )
        } else {
            Self::Sqlite(s.to_owned())
        })
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Sqlite(p) => write!(f, "sqlite://{p}"),
            Self::Postgres(u) | Self::Redis(u) => f.write_str(u),
        }
    }
}

/// The store the handlers' transactions run on ([`oncely_sqlx::SqlStore`]).
#[derive(Clone)]
pub enum Backend {
    /// The SQLite key store's database holds the business tables: one commit per phase.
    Sqlite(oncely_sqlite::SqliteStore),
    /// The PostgreSQL key store's database holds the business tables: one commit per phase.
    #[cfg(feature = "postgres")]
    Postgres(oncely_postgres::PostgresStore),
    /// Keys in the memory or Redis store, business data in an embedded SQLite database.
    Split(oncely_sqlx::Split<sqlx::Sqlite>),
}

/// The opened key store, its phase mechanism and the business database.
pub struct Opened {
    /// The key store.
    pub store: Arc<dyn KeyStore>,
    /// The phase mechanism.
    pub backend: Backend,
    /// The business database.
    pub db: Db,
}

fn sqlite_url(path: &str) -> String {
    format!("sqlite://{path}?mode=rwc")
}

/// Keys in `store` (memory, Redis), business data in the embedded SQLite `db`.
pub(super) fn split(store: Arc<dyn KeyStore>, db: Db) -> Opened {
    #[allow(clippy::infallible_destructuring_match)]
    let pool = match &db {
        Db::Sqlite(pool) => pool.clone(),
        #[cfg(feature = "postgres")]
        Db::Postgres(_) => unreachable!("the embedded business database is SQLite"),
    };
    Opened {
        backend: Backend::Split(oncely_sqlx::Split::new(store.clone(), pool)),
        store,
        db,
    }
}
/// Opens a key store (running its migrations) and the business database next to it.
/// `business_path` is where the embedded business database goes for the memory and Redis stores.
pub async fn open(url: &StoreUrl, business_path: Option<&str>) -> Result<Opened> {
    async fn plain_db(path: Option<&str>) -> Result<Db> {
        let opts = match path {
            Some(p) => sqlx::sqlite::SqliteConnectOptions::from_str(&sqlite_url(p))?,
            None => sqlx::sqlite::SqliteConnectOptions::from_str("sqlite::memory:")?,
        }
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
        // An in-memory database exists once per connection: keep exactly one.
        let max = if path.is_some() { 4 } else { 1 };
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(opts)
            .await
            .context("open the embedded business database")?;
        Ok(Db::Sqlite(pool))
    }
    let opened = match url {
        StoreUrl::Memory => split(Arc::new(MemoryStore::new()), plain_db(business_path).await?),
        StoreUrl::Sqlite(path) => {
            let store = oncely_sqlite::SqliteStore::connect(&sqlite_url(path))
                .await
                .with_context(|| format!("open the SQLite key store at {path}"))?;
            let db = Db::Sqlite(store.pool().clone());
            Opened {
                store: Arc::new(store.clone()),
                backend: Backend::Sqlite(store),
                db,
            }
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => bail!("this oncely was built without the postgres feature"),
        // PostgreSQL and Redis may be down at start: the server starts anyway and answers 503
        // until they answer (standby.rs); the business tables come with the store's.
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(u) => return standby::open_postgres(u).await,
        StoreUrl::Redis(u) => {
            let path = business_path.map_or_else(|| default_business_path(u), str::to_owned);
            let db = plain_db(Some(&path)).await?;
            db.migrate().await.context("create the business tables")?;
            return standby::open_redis(u, db).await;
        }
    };
    opened
        .db
        .migrate()
        .await
        .context("create the business tables")?;
    Ok(opened)
}

/// Where the business data of a Redis-backed server goes without `--business-db`: a file in
/// the system's temporary directory named after the Redis URL (so a restart finds its payments
/// again, and nothing is written into the working directory).
fn default_business_path(redis_url: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(redis_url.as_bytes());
    std::env::temp_dir()
        .join(format!(
            "oncely-business-{}.sqlite3",
            hex::encode(&digest[..8])
        ))
        .to_string_lossy()
        .into_owned()
}

/// Opens an existing key store alone (for the jobs): no business tables are created, and a
/// SQLite path that does not exist is an error rather than a new empty store.
pub async fn open_store(url: &StoreUrl) -> Result<Arc<dyn KeyStore>> {
    Ok(match url {
        StoreUrl::Memory => {
            bail!(
                "the memory store lives inside one server process; run the job there (oncely serve runs the reaper and the completer in-process)"
            )
        }
        StoreUrl::Sqlite(path) => {
            if !std::path::Path::new(path).exists() {
                bail!("no key store at {path}: the file does not exist (check the path)");
            }
            Arc::new(
                oncely_sqlite::SqliteStore::connect(&sqlite_url(path))
                    .await
                    .with_context(|| format!("open the SQLite key store at {path}"))?,
            )
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => bail!("this oncely was built without the postgres feature"),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(u) => {
            let store = oncely_postgres::PostgresStore::connect(u)
                .await
                .context("connect to the PostgreSQL key store")?;
            store
                .migrate()
                .await
                .context("check the key store's tables")?;
            Arc::new(store)
        }
        StoreUrl::Redis(u) => Arc::new(
            oncely_redis::RedisStore::connect(u)
                .await
                .context("connect to the Redis key store")?,
        ),
    })
}

/// The server's shared state.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn KeyStore>,
    db: Db,
    http: reqwest::Client,
    processor_url: String,
    crash_after: Option<String>,
    policy: Policy,
    metrics: Arc<Metrics>,
    drain: Option<oncely_tower::Drain>,
    payments_created: AtomicU64,
    reaped: AtomicU64,
    orphaned: AtomicU64,
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The key store.
    pub store: StoreUrl,
    /// The processor's base URL.
    pub processor_url: String,
    /// Abort the process right after this recovery point commits (testing only).
    pub crash_after: Option<String>,
    /// The idempotency policy.
    pub policy: Policy,
    /// The embedded business database for memory/Redis stores.
    pub business_path: Option<String>,
    /// Run the completer in-process with this grace (milliseconds after a lease lapses).
    pub completer_grace: Option<Duration>,
    /// Serve the same endpoints without the idempotency layer (the benchmark baseline).
    pub idempotency_off: bool,
}

impl App {
    /// The business database.
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// Kills the process with SIGKILL if `--crash-after` names this recovery point (testing
    /// only): no destructor runs, nothing is flushed, exactly like a machine dying.
    pub fn crash_point(&self, name: &str) {
        if self.inner.crash_after.as_deref() == Some(name) {
            eprintln!("oncely: --crash-after {name}: killing this process now, as asked");
            #[cfg(unix)]
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            std::process::abort();
        }
    }

    fn payment_created(&self) {
        self.inner.payments_created.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls an outside system with a derived idempotency key; returns the status and JSON body.
    pub async fn outside_call(&self, path: &str, key: &str, body: Value) -> Result<(u16, Value)> {
        let resp = self
            .inner
            .http
            .post(format!("{}/{path}", self.inner.processor_url))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("call the outside system at /{path}"))?;
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }
}

/// The credentials of `Authorization: Bearer <token>`: the scheme name is matched
/// case-insensitively (RFC 9110 section 11.1), with one or more spaces before the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_matches(' '))
}

/// The authentication stand-in: `Authorization: Bearer <account>` -> [`Scope`].
async fn authenticate(mut req: Request, next: Next) -> Response {
    let account = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .filter(|a| !a.is_empty() && a.len() <= 255 && a.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned);
    match account {
        Some(a) => {
            req.extensions_mut().insert(Scope::new(a));
            next.run(req).await
        }
        None if req.uri().path().starts_with("/v1/") => {
            let mut resp = problem(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Authentication required",
                "send Authorization: Bearer <account>".into(),
                false,
            );
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
        None => next.run(req).await,
    }
}

/// Any path that is not a route: a problem, not an empty body.
async fn no_route(uri: axum::http::Uri) -> Response {
    let detail = format!(
        "{} is not a route of this API (see /openapi.json)",
        uri.path()
    );
    problem(
        StatusCode::NOT_FOUND,
        "not_found",
        "Not found",
        detail,
        false,
    )
}

async fn no_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let detail = format!("{method} is not allowed on {}", uri.path());
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "Method not allowed",
        detail,
        false,
    )
}

/// A read by id: the resource, a `404 not_found` problem, or a `503 unavailable` problem.
fn found<T: serde::Serialize>(read: Result<Option<T>>, what: &str) -> Response {
    match read {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => not_found(what),
        Err(e) => internal(e),
    }
}

fn not_found(what: &str) -> Response {
    let detail = format!("no such {what} for this account");
    problem(
        StatusCode::NOT_FOUND,
        "not_found",
        "Not found",
        detail,
        false,
    )
}

fn internal(e: anyhow::Error) -> Response {
    // The error (addresses, driver messages) goes to the log, not to the client.
    tracing::error!(error = %format!("{e:#}"), "request failed");
    let detail = "the service's database could not answer; retry later".to_owned();
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "Service unavailable",
        detail,
        true,
    )
}

/// An RFC 9457 problem+json response of this API (`type` is `urn:oncely:problem:<code>`).
pub fn problem(
    status: StatusCode,
    code: &str,
    title: &str,
    detail: String,
    retryable: bool,
) -> Response {
    problem_with(status, code, title, detail, retryable, json!({}))
}

/// [`problem`] with extension members (RFC 9457 section 3.2), e.g. the invalid fields.
pub fn problem_with(
    status: StatusCode,
    code: &str,
    title: &str,
    detail: String,
    retryable: bool,
    extra: Value,
) -> Response {
    let mut body = json!({
        "type": format!("urn:oncely:problem:{code}"), "title": title, "status": status.as_u16(),
        "detail": detail, "code": code, "retryable": retryable,
    });
    if let (Some(obj), Value::Object(more)) = (body.as_object_mut(), extra) {
        obj.extend(more);
    }
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    // The Stainless SDK convention: generated clients honour it before their status rules.
    resp.headers_mut().insert(
        oncely_core::X_SHOULD_RETRY,
        HeaderValue::from_static(if retryable { "true" } else { "false" }),
    );
    resp
}

async fn list_payments(State(app): State<App>, Extension(scope): Extension<Scope>) -> Response {
    match app.db().payments(scope.as_str()).await {
        Ok(p) => Json(json!({ "data": p })).into_response(),
        Err(e) => internal(e),
    }
}

async fn get_payment(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Response {
    found(app.db().payment_by_id(scope.as_str(), &id).await, "payment")
}

async fn get_order(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Response {
    found(app.db().order_by_id(scope.as_str(), &id).await, "order")
}

async fn list_orders(State(app): State<App>, Extension(scope): Extension<Scope>) -> Response {
    match app.db().orders(scope.as_str()).await {
        Ok(o) => Json(json!({ "data": o })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /v1/idempotency-keys/{key}`: the state of the caller's key.
async fn key_state(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let invalid = |detail: String| {
        payments::not_executed(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            detail,
            json!({}),
        )
    };
    let Ok(Path(key)) = key else {
        return invalid("the key in the path is not valid UTF-8 (keys are visible ASCII)".into());
    };
    // A path segment is taken as is: the header's syntax (surrounding spaces, a quoted form)
    // does not apply, so a key with a space is invalid, never another key.
    if let Some(b) = key.bytes().find(|b| !b.is_ascii_graphic()) {
        return invalid(format!(
            "the key contains the byte 0x{b:02x}, which is not a visible ASCII character (a key is 1 to 255 visible ASCII characters)"
        ));
    }
    let key = match IdempotencyKey::new(&key) {
        Ok(k) => k,
        Err(e) => {
            let detail = e
                .to_string()
                .replace("the Idempotency-Key header is", "the key is");
            return invalid(format!(
                "{detail} (a key is 1 to 255 visible ASCII characters)"
            ));
        }
    };
    let window = oncely_core::clock::duration_millis(app.inner.policy.replay_window);
    let now = SystemClock.now_millis();
    let rec = match app
        .inner
        .store
        .get(&RecordKey::new(scope, key.clone()))
        .await
    {
        Ok(r) => r,
        Err(e) => return internal(anyhow::anyhow!(e)),
    };
    let body = match rec {
        None => json!({"key": key.as_str(), "state": "absent"}),
        Some(r) => match r.state {
            RecordState::Released => json!({"key": key.as_str(), "state": "absent"}),
            RecordState::Complete {
                completed_at,
                response,
            } if completed_at + window > now => json!({
                "key": key.as_str(), "state": "complete", "status": response.status,
                "completed_at": completed_at, "replays_until": completed_at + window,
            }),
            RecordState::Complete { completed_at, .. } => json!({
                "key": key.as_str(), "state": "absent", "completed_at": completed_at,
                "note": "the replay window has passed: reusing this key starts a new request",
            }),
            // Suspended: the request stopped at its recovery point (an outside system failed,
            // or its server shut down) and its lease was cut short, or its owner died and the
            // lease lapsed. Nobody is working on it: the next retry (or the completer) takes
            // it over at once and resumes.
            RecordState::InFlight {
                lease_expires_at,
                recovery_point,
            } if lease_expires_at <= now => json!({
                "key": key.as_str(), "state": "in_flight", "suspended": true,
                "lease_expires_at": lease_expires_at, "recovery_point": recovery_point,
                "note": "no request is working on this key: retry the same request with the same key to resume it from its recovery point",
            }),
            RecordState::InFlight {
                lease_expires_at,
                recovery_point,
            } => json!({
                "key": key.as_str(), "state": "in_flight", "suspended": false,
                "lease_expires_at": lease_expires_at, "recovery_point": recovery_point,
            }),
        },
    };
    Json(body).into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    let mut text = app.inner.metrics.render_prometheus();
    text.push_str(
        "# HELP oncely_payments_created_total Payments this process created (first executions).\n\
         # TYPE oncely_payments_created_total counter\n",
    );
    text.push_str(&format!(
        "oncely_payments_created_total {}\n",
        app.inner.payments_created.load(Ordering::Relaxed)
    ));
    for (name, help, value) in [
        (
            "oncely_reaped_total",
            "Records past retention the in-process reaper deleted.",
            &app.inner.reaped,
        ),
        (
            "oncely_orphaned_total",
            "Of those, records still in flight (abandoned, never finished).",
            &app.inner.orphaned,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            value.load(Ordering::Relaxed)
        ));
    }
    if let Ok(n) = app.db().payment_count().await {
        text.push_str(
            "# HELP oncely_payments Payments in the database.\n# TYPE oncely_payments gauge\n",
        );
        text.push_str(&format!("oncely_payments {n}\n"));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The write routes, with handlers whose transactions run on store type `S`.
fn write_routes<S>() -> Router<App>
where
    S: oncely_sqlx::SqlStore,
    S::Database: db::BusinessDb,
{
    Router::new()
        .route("/v1/payments", post(payments::create_payment::<S>))
        .route("/v1/orders", post(payments::create_order::<S>))
}

/// `serve --idempotency off`: the same handlers on a plain transaction, with no claim.
async fn unclaimed<DB: sqlx::Database>(
    State(pool): State<sqlx::Pool<DB>>,
    mut req: Request,
    next: Next,
) -> Response {
    let scope = req
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or_else(|| Scope::new("anonymous"));
    let key = IdempotencyKey::from_header_values(
        req.headers()
            .get_all("idempotency-key")
            .iter()
            .map(HeaderValue::as_bytes),
    )
    .or_else(|_| IdempotencyKey::new(&uuid::Uuid::new_v4().to_string()))
    .expect("a UUID is a valid key");
    let id = RecordKey::new(scope, key);
    if let Err(e) = oncely_sqlx::unclaimed::attach_unclaimed(&pool, id, req.extensions_mut()).await
    {
        return e.into_response();
    }
    next.run(req).await
}

/// The write routes over `backend`: behind `layer` (the idempotency layer made for that
/// backend's store), or, without one, on plain transactions (the benchmark baseline).
fn writes(backend: &Backend, layer: Option<IdempotencyLayer>) -> Router<App> {
    use oncely_sqlx::unclaimed::UnclaimedStore;
    fn plain<DB>(pool: sqlx::Pool<DB>) -> Router<App>
    where
        DB: sqlx::Database + db::BusinessDb,
    {
        write_routes::<UnclaimedStore<DB>>()
            .route_layer(middleware::from_fn_with_state(pool, unclaimed::<DB>))
    }
    match (backend, layer) {
        (Backend::Sqlite(_), Some(l)) => {
            write_routes::<oncely_sqlite::SqliteStore>().route_layer(l)
        }
        #[cfg(feature = "postgres")]
        (Backend::Postgres(_), Some(l)) => {
            write_routes::<oncely_postgres::PostgresStore>().route_layer(l)
        }
        (Backend::Split(_), Some(l)) => {
            write_routes::<oncely_sqlx::Split<sqlx::Sqlite>>().route_layer(l)
        }
        (Backend::Sqlite(s), None) => plain(s.pool().clone()),
        #[cfg(feature = "postgres")]
        (Backend::Postgres(s), None) => plain(s.pool().clone()),
        (Backend::Split(s), None) => plain(s.pool().clone()),
    }
}

/// The idempotency layer for `backend`'s store, with `policy`.
fn layer_for(backend: &Backend, policy: Policy) -> IdempotencyLayer {
    match backend {
        Backend::Sqlite(s) => oncely_sqlx::layer(s.clone(), policy),
        #[cfg(feature = "postgres")]
        Backend::Postgres(s) => oncely_sqlx::layer(s.clone(), policy),
        Backend::Split(s) => oncely_sqlx::layer(s.clone(), policy),
    }
}

/// Builds the router; `layer` (made by [`layer_for`] for `backend`) is `None` for the baseline
/// without idempotency.
pub fn router(app: App, backend: &Backend, layer: Option<IdempotencyLayer>) -> Router {
    let writes = writes(backend, layer);
    Router::new()
        .merge(writes)
        .route("/v1/payments", get(list_payments))
        .route("/v1/payments/{id}", get(get_payment))
        .route("/v1/orders", get(list_orders))
        .route("/v1/orders/{id}", get(get_order))
        .route("/v1/idempotency-keys/{key}", get(key_state))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(middleware::from_fn(authenticate))
        .layer(middleware::from_fn(should_retry::mark))
        .with_state(app)
}

/// Opens the store and builds the app.
pub async fn build(cfg: &ServeConfig) -> Result<(App, Router)> {
    cfg.policy
        .validate()
        .context("invalid idempotency policy")?;
    let opened = open(&cfg.store, cfg.business_path.as_deref()).await?;
    let layer = layer_for(&opened.backend, cfg.policy.clone());
    let app = App {
        inner: Arc::new(Inner {
            store: opened.store,
            db: opened.db,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            processor_url: cfg.processor_url.trim_end_matches('/').to_owned(),
            crash_after: cfg.crash_after.clone(),
            policy: cfg.policy.clone(),
            metrics: layer.metrics(),
            drain: (!cfg.idempotency_off).then(|| layer.drain()),
            payments_created: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            orphaned: AtomicU64::new(0),
        }),
    };
    let router = router(
        app.clone(),
        &opened.backend,
        (!cfg.idempotency_off).then_some(layer),
    );
    Ok((app, router))
}

impl App {
    /// Runs the reaper in this process every `every`, counting what it deletes for `/metrics`.
    pub fn spawn_reaper(&self, every: Duration) {
        let app = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match oncely_core::jobs::reap_all(
                    &*app.inner.store,
                    1000,
                    oncely_core::jobs::DEFAULT_REAP_PAUSE,
                )
                .await
                {
                    Ok(r) => {
                        app.inner.reaped.fetch_add(r.deleted, Ordering::Relaxed);
                        app.inner.orphaned.fetch_add(r.orphaned, Ordering::Relaxed);
                        if r.deleted > 0 {
                            tracing::info!(
                                deleted = r.deleted,
                                orphaned = r.orphaned,
                                "reaped records past retention"
                            );
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the reaper could not reach the key store")
                    }
                }
            }
        });
    }

    /// The layer's graceful-shutdown handle (`None` without the layer).
    pub fn drain(&self) -> Option<oncely_tower::Drain> {
        self.inner.drain.clone()
    }

    /// The key store.
    pub fn store(&self) -> Arc<dyn KeyStore> {
        self.inner.store.clone()
    }
}
