//! The router: every route of the reference API, the authentication stand-in and the
//! idempotency layer over the write routes (or, for the benchmark baseline, plain
//! transactions with no claim).
//!
//! A request flows one way: `should_retry` (outermost) -> `auth` -> the layer
//! (prepare, claim) -> the route's handler with its transaction -> commit with the stored
//! response -> back out.

use super::db::BusinessDb;
use super::routes::{keys, orders, payments, reads, webhooks};
use super::store::Backend;
use super::{App, auth, health, metrics, openapi, problems, should_retry};
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use oncely_core::{IdempotencyKey, Policy, RecordKey, Scope};
use oncely_tower::{IdempotencyLayer, KeySource, StandardWebhooksLayer};

/// A set of transactional routes whose handlers run on store type `S`.
trait RouteSet {
    fn routes<S>() -> Router<App>
    where
        S: oncely_sqlx::SqlStore,
        S::Database: BusinessDb;
}

/// The write routes, keyed by `Idempotency-Key`.
struct Writes;

impl RouteSet for Writes {
    fn routes<S>() -> Router<App>
    where
        S: oncely_sqlx::SqlStore,
        S::Database: BusinessDb,
    {
        Router::new()
            .route("/v1/payments", post(payments::create_payment::<S>))
            .route("/v1/orders", post(orders::create_order::<S>))
    }
}

/// The webhook receiver, keyed by `webhook-id`.
struct Receivers;

impl RouteSet for Receivers {
    fn routes<S>() -> Router<App>
    where
        S: oncely_sqlx::SqlStore,
        S::Database: BusinessDb,
    {
        Router::new().route(webhooks::PATH, post(webhooks::receive::<S>))
    }
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

/// The routes of `R` over `backend`: behind `layer` (the idempotency layer made for that
/// backend's store), or, without one, on plain transactions (the benchmark baseline).
fn over<R: RouteSet>(backend: &Backend, layer: Option<IdempotencyLayer>) -> Router<App> {
    use oncely_sqlx::unclaimed::UnclaimedStore;
    fn plain<R: RouteSet, DB>(pool: sqlx::Pool<DB>) -> Router<App>
    where
        DB: sqlx::Database + BusinessDb,
    {
        R::routes::<UnclaimedStore<DB>>()
            .route_layer(middleware::from_fn_with_state(pool, unclaimed::<DB>))
    }
    match (backend, layer) {
        (Backend::Sqlite(_), Some(l)) => R::routes::<oncely_sqlite::SqliteStore>().route_layer(l),
        #[cfg(feature = "postgres")]
        (Backend::Postgres(_), Some(l)) => {
            R::routes::<oncely_postgres::PostgresStore>().route_layer(l)
        }
        (Backend::Split(_), Some(l)) => {
            R::routes::<oncely_sqlx::Split<sqlx::Sqlite>>().route_layer(l)
        }
        (Backend::Sqlite(s), None) => plain::<R, _>(s.pool().clone()),
        #[cfg(feature = "postgres")]
        (Backend::Postgres(s), None) => plain::<R, _>(s.pool().clone()),
        (Backend::Split(s), None) => plain::<R, _>(s.pool().clone()),
    }
}

/// The webhook receiver over `backend`: the signature verified first (outermost, before any
/// claim; the sender becomes the scope), then the API's layer keyed on `webhook-id` (a clone:
/// it shares the store, the metrics and the graceful shutdown).
fn receivers(
    backend: &Backend,
    layer: Option<IdempotencyLayer>,
    verify: StandardWebhooksLayer,
) -> Router<App> {
    let webhook_id = KeySource::header(standardwebhooks::HEADER_WEBHOOK_ID)
        .expect("webhook-id is a header name");
    over::<Receivers>(backend, layer.map(|l| l.with_key_source(webhook_id))).route_layer(verify)
}

/// The idempotency layer for `backend`'s store, with `policy`.
pub fn layer_for(backend: &Backend, policy: Policy) -> IdempotencyLayer {
    match backend {
        Backend::Sqlite(s) => oncely_sqlx::layer(s.clone(), policy),
        #[cfg(feature = "postgres")]
        Backend::Postgres(s) => oncely_sqlx::layer(s.clone(), policy),
        Backend::Split(s) => oncely_sqlx::layer(s.clone(), policy),
    }
}

/// Builds the router; `layer` (made by [`layer_for`] for `backend`) is `None` for the baseline
/// without idempotency; `verify` authenticates the webhook receiver's deliveries.
pub fn router(
    app: App,
    backend: &Backend,
    layer: Option<IdempotencyLayer>,
    verify: StandardWebhooksLayer,
) -> Router {
    let receivers = receivers(backend, layer.clone(), verify);
    let writes = over::<Writes>(backend, layer);
    Router::new()
        .merge(writes)
        .merge(receivers)
        .route("/v1/payments", get(reads::list_payments))
        .route("/v1/payments/{id}", get(reads::get_payment))
        .route("/v1/payments/{id}/events", get(reads::payment_events))
        .route("/v1/orders", get(reads::list_orders))
        .route("/v1/orders/{id}", get(reads::get_order))
        .route("/v1/idempotency-keys/{key}", get(keys::key_state))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(problems::no_route)
        .method_not_allowed_fallback(problems::no_method)
        .layer(middleware::from_fn(auth::authenticate))
        .layer(middleware::from_fn(should_retry::mark))
        .with_state(app)
}
