//! The router: every route of the reference API, the authentication stand-in and the
//! idempotency layer over the write routes (or, for the benchmark baseline, plain
//! transactions with no claim).
//!
//! A request flows one way: the request id and its trace span (outermost, [`trace`]) ->
//! `should_retry` -> `auth` -> the layer
//! (prepare, claim) -> the route's handler with its transaction -> commit with the stored
//! response -> back out.

use super::baseline::{UnclaimedStore, unclaimed};
use super::db::BusinessDb;
use super::routes::{keys, orders, payments, reads, webhooks};
use super::store::{Backend, with_backend};
use super::{App, auth, grpc, health, metrics, openapi, problems, should_retry, trace};
use axum::Router;
use axum::middleware;
use axum::routing::{MethodRouter, get, post};
use oncely_core::Policy;
use oncely_tower::{IdempotencyLayer, KeySource, StandardWebhooksLayer};

/// What a keyed route's method router gets: the idempotency layer (or the baseline's plain
/// transaction), on the route's own methods only (`MethodRouter::route_layer`), so that another
/// method is answered `405` and a path that is no route `404` before anything claims a key.
/// `Router::route_layer` would wrap each route's `405` answer too.
type Keyed<'a> = &'a dyn Fn(MethodRouter<App>) -> MethodRouter<App>;

/// The write routes, with handlers whose transactions run on store type `S`, each `keyed`.
fn write_routes<S>(keyed: Keyed<'_>) -> Router<App>
where
    S: oncely_sqlx::SqlStore,
    S::Database: BusinessDb,
{
    Router::new()
        .route("/v1/payments", keyed(post(payments::create_payment::<S>)))
        .route("/v1/orders", keyed(post(orders::create_order::<S>)))
}

/// The write routes over `backend`: behind `layer` (the idempotency layer made for that
/// backend's store), or, without one, on plain transactions (the benchmark baseline).
fn writes(backend: &Backend, layer: Option<IdempotencyLayer>) -> Router<App> {
    fn plain<DB>(pool: sqlx::Pool<DB>) -> Router<App>
    where
        DB: sqlx::Database + BusinessDb,
    {
        let keyed = |m: MethodRouter<App>| {
            m.route_layer(middleware::from_fn_with_state(
                pool.clone(),
                unclaimed::<DB>,
            ))
        };
        write_routes::<UnclaimedStore<DB>>(&keyed).merge(grpc::routes::<UnclaimedStore<DB>>(&keyed))
    }
    // REST behind the layer, gRPC behind its gRPC form: one store, one set of metrics.
    fn layered<S>(l: IdempotencyLayer) -> Router<App>
    where
        S: oncely_sqlx::SqlStore,
        S::Database: BusinessDb,
    {
        let grpc_layer = grpc::layer(l.clone());
        write_routes::<S>(&|m| m.route_layer(l.clone()))
            .merge(grpc::routes::<S>(&|m| m.route_layer(grpc_layer.clone())))
    }
    match layer {
        Some(l) => with_backend!(backend, S, _ => layered::<S>(l)),
        None => with_backend!(backend, _S, s => plain(s.pool().clone())),
    }
}

/// The webhook receiver, with a handler whose transaction runs on store type `S`, `keyed`.
fn receiver_routes<S>(keyed: Keyed<'_>) -> Router<App>
where
    S: oncely_sqlx::SqlStore,
    S::Database: BusinessDb,
{
    Router::new().route(webhooks::PATH, keyed(post(webhooks::receive::<S>)))
}

/// The webhook receiver over `backend`: the signature verified first (outermost, before any
/// claim; the sender becomes the scope), then the API's layer keyed on `webhook-id` (a clone:
/// it shares the store, the metrics and the graceful shutdown), or, without one, a plain
/// transaction (the benchmark baseline); both on the route's own methods.
fn receivers(
    backend: &Backend,
    layer: Option<IdempotencyLayer>,
    verify: StandardWebhooksLayer,
) -> Router<App> {
    fn plain<DB>(pool: sqlx::Pool<DB>, verify: StandardWebhooksLayer) -> Router<App>
    where
        DB: sqlx::Database + BusinessDb,
    {
        receiver_routes::<UnclaimedStore<DB>>(&|m| {
            m.route_layer(middleware::from_fn_with_state(
                pool.clone(),
                unclaimed::<DB>,
            ))
            .route_layer(verify.clone())
        })
    }
    fn layered<S>(l: IdempotencyLayer, verify: StandardWebhooksLayer) -> Router<App>
    where
        S: oncely_sqlx::SqlStore,
        S::Database: BusinessDb,
    {
        receiver_routes::<S>(&|m| m.route_layer(l.clone()).route_layer(verify.clone()))
    }
    let webhook_id = KeySource::header(standardwebhooks::HEADER_WEBHOOK_ID)
        .expect("webhook-id is a header name");
    match layer.map(|l| l.with_key_source(webhook_id)) {
        Some(l) => with_backend!(backend, S, _ => layered::<S>(l, verify)),
        None => with_backend!(backend, _S, s => plain(s.pool().clone(), verify)),
    }
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

#[cfg(test)]
mod tests {
    use super::super::{ServeConfig, StoreUrl, build, grpc};
    use crate::processor::webhooks::DEV_WEBHOOK_SECRET;
    use axum::Router;
    use axum::body::{Body, to_bytes};
    use axum::http::{Request, StatusCode, header};
    use tower::ServiceExt as _;

    async fn server(dir: &tempfile::TempDir) -> Router {
        let db = dir.path().join("router.sqlite3");
        let cfg = ServeConfig {
            store: db.to_str().unwrap().parse::<StoreUrl>().unwrap(),
            // Never called: no request here reaches a handler that calls out.
            processor_url: "http://127.0.0.1:9".to_owned(),
            processor_timeout: std::time::Duration::from_secs(10),
            crash_after: None,
            policy: oncely_core::Policy::default(),
            business_path: None,
            pg_fewest_round_trips: false,
            completer_grace: None,
            idempotency_off: false,
            webhook_secret: DEV_WEBHOOK_SECRET.to_owned(),
        };
        build(&cfg).await.unwrap().1
    }

    struct Got {
        status: StatusCode,
        headers: axum::http::HeaderMap,
        body: serde_json::Value,
    }

    async fn send(app: &Router, method: &str, path: &str, key: Option<&str>) -> Got {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, "Bearer acct_router")
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::from("{}")).unwrap())
            .await
            .unwrap();
        let (parts, body) = res.into_parts();
        let bytes = to_bytes(body, 1 << 20).await.unwrap();
        Got {
            status: parts.status,
            headers: parts.headers,
            body: serde_json::from_slice(&bytes).unwrap_or_default(),
        }
    }

    /// A method a keyed route does not serve is `405 method_not_allowed` from the router, with
    /// `Allow`, before any claim: with a key it claims nothing (the key stays `absent`, free
    /// for the method the route serves), and without one it is not `400
    /// idempotency_key_missing` from the layer.
    #[tokio::test]
    async fn a_method_not_allowed_is_405_before_any_claim_on_every_keyed_route() {
        let dir = tempfile::tempdir().unwrap();
        let app = server(&dir).await;
        for path in [
            "/v1/payments",
            "/v1/orders",
            "/webhooks/processor",
            grpc::CREATE_PAYMENT,
        ] {
            for method in ["PUT", "PATCH", "DELETE"] {
                for key in [None, Some(format!("k-{method}-{}", path.len()))] {
                    let got = send(&app, method, path, key.as_deref()).await;
                    assert_eq!(
                        got.status,
                        StatusCode::METHOD_NOT_ALLOWED,
                        "{method} {path} {key:?}"
                    );
                    assert_eq!(
                        got.body["code"], "method_not_allowed",
                        "{method} {path} {key:?}"
                    );
                    assert!(got.headers.contains_key(header::ALLOW), "{method} {path}");
                    if let Some(k) = key {
                        let state =
                            send(&app, "GET", &format!("/v1/idempotency-keys/{k}"), None).await;
                        assert_eq!(
                            state.body["state"], "absent",
                            "{method} {path}: {}",
                            state.body
                        );
                    }
                }
            }
        }
        // The layer is still on the keyed methods: a POST without a key is refused by it.
        let got = send(&app, "POST", "/v1/orders", None).await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST);
        assert_eq!(got.body["code"], "idempotency_key_missing");
    }

    /// Every `401` of the server carries a challenge (RFC 9110 section 11.6.1): `Bearer` for the
    /// API without credentials, `Standard-Webhooks` for a webhook delivery that is not signed.
    #[tokio::test]
    async fn every_401_carries_a_www_authenticate_challenge() {
        let dir = tempfile::tempdir().unwrap();
        let app = server(&dir).await;
        for auth in [None, Some("Basic YTpi"), Some("Bearer ")] {
            let mut req = Request::get("/v1/orders");
            if let Some(a) = auth {
                req = req.header(header::AUTHORIZATION, a);
            }
            let res = app
                .clone()
                .oneshot(req.body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
            assert_eq!(
                res.headers()[header::WWW_AUTHENTICATE],
                "Bearer",
                "{auth:?}"
            );
        }
        let got = send(&app, "POST", "/webhooks/processor", None).await;
        // Unsigned: refused for its missing headers before any signature is checked.
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{}", got.body);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let req = Request::post("/webhooks/processor")
            .header("webhook-id", "msg_router")
            .header("webhook-timestamp", now.to_string())
            .header(
                "webhook-signature",
                "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            )
            .body(Body::from("{}"))
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()[header::WWW_AUTHENTICATE], "Standard-Webhooks");
    }
}
