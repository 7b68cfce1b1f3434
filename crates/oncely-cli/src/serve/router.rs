//! The router: every route of the reference API, the authentication stand-in and the
//! idempotency layer over the write routes (or, for the benchmark baseline, plain
//! transactions with no claim).
//!
//! A request flows one way: the request id and its trace span (outermost, [`trace`]) ->
//! `should_retry` -> `auth` -> the layer
//! (prepare, claim) -> the route's handler with its transaction -> commit with the stored
//! response -> back out.

use super::db::BusinessDb;
use super::routes::{keys, orders, payments, reads, webhooks};
use super::store::{Backend, with_backend};
use super::{App, auth, grpc, health, metrics, openapi, problems, should_retry, trace};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use oncely_core::{IdempotencyKey, Policy, RecordKey, Scope};
use oncely_tower::{IdempotencyLayer, KeySource, StandardWebhooksLayer};

/// The write routes, with handlers whose transactions run on store type `S`.
fn write_routes<S>() -> Router<App>
where
    S: oncely_sqlx::SqlStore,
    S::Database: BusinessDb,
{
    Router::new()
        .route("/v1/payments", post(payments::create_payment::<S>))
        .route("/v1/orders", post(orders::create_order::<S>))
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
        DB: sqlx::Database + BusinessDb,
    {
        write_routes::<UnclaimedStore<DB>>()
            .merge(grpc::routes::<UnclaimedStore<DB>>())
            .route_layer(middleware::from_fn_with_state(pool, unclaimed::<DB>))
    }
    // REST behind the layer, gRPC behind its gRPC form: one store, one set of metrics.
    fn layered<S>(l: IdempotencyLayer) -> Router<App>
    where
        S: oncely_sqlx::SqlStore,
        S::Database: BusinessDb,
    {
        write_routes::<S>()
            .route_layer(l.clone())
            .merge(grpc::routes::<S>().route_layer(grpc::layer(l)))
    }
    match layer {
        Some(l) => with_backend!(backend, S, _ => layered::<S>(l)),
        None => with_backend!(backend, _S, s => plain(s.pool().clone())),
    }
}

/// The webhook receiver, with a handler whose transaction runs on store type `S`.
fn receiver_routes<S>() -> Router<App>
where
    S: oncely_sqlx::SqlStore,
    S::Database: BusinessDb,
{
    Router::new().route(webhooks::PATH, post(webhooks::receive::<S>))
}

/// The webhook receiver over `backend`: the signature verified first (outermost, before any
/// claim; the sender becomes the scope), then the API's layer keyed on `webhook-id` (a clone:
/// it shares the store, the metrics and the graceful shutdown), or, without one, a plain
/// transaction (the benchmark baseline).
fn receivers(
    backend: &Backend,
    layer: Option<IdempotencyLayer>,
    verify: StandardWebhooksLayer,
) -> Router<App> {
    use oncely_sqlx::unclaimed::UnclaimedStore;
    fn plain<DB>(pool: sqlx::Pool<DB>) -> Router<App>
    where
        DB: sqlx::Database + BusinessDb,
    {
        receiver_routes::<UnclaimedStore<DB>>()
            .route_layer(middleware::from_fn_with_state(pool, unclaimed::<DB>))
    }
    let webhook_id = KeySource::header(standardwebhooks::HEADER_WEBHOOK_ID)
        .expect("webhook-id is a header name");
    let routes = match layer.map(|l| l.with_key_source(webhook_id)) {
        Some(l) => with_backend!(backend, S, _ => receiver_routes::<S>().route_layer(l)),
        None => with_backend!(backend, _S, s => plain(s.pool().clone())),
    };
    routes.route_layer(verify)
}

/// The idempotency layer for `backend`'s store, with `policy`.
pub fn layer_for(backend: &Backend, policy: Policy) -> IdempotencyLayer {
    with_backend!(backend, _S, s => oncely_sqlx::layer(s.clone(), policy))
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
    let writes = writes(backend, layer);
    let router = Router::new()
        .merge(writes)
        .merge(receivers)
        .route("/v1/payments", get(reads::list_payments))
        .route("/v1/payments/{id}", get(reads::get_payment))
        .route("/v1/payments/{id}/events", get(reads::payment_events))
        .route("/v1/orders", get(reads::list_orders))
        .route("/v1/orders/{id}", get(reads::get_order))
        .route("/v1/idempotency-keys/{key}", get(keys::key_state))
        .route(grpc::GET_PAYMENT, post(grpc::get_payment))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::serve_document))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(problems::no_route)
        .method_not_allowed_fallback(problems::no_method)
        .layer(middleware::from_fn(auth::authenticate))
        .layer(middleware::from_fn(should_retry::mark));
    trace::with_request_ids(router.with_state(app))
}
