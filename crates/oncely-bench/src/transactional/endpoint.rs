//! What every variant's handler shares: the clock, the order in a request body, the `201`
//! answer (and the floor's stored copy of it), the database error as `500`, and the
//! authentication stand-in that puts the caller's scope into the request.

use super::SCOPE;
use axum::Router;
use axum::body::Body;
use axum::extract::Json;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use oncely_core::{Scope, StoredResponse};
use serde_json::{Value, json};
use std::time::{SystemTime, UNIX_EPOCH};

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(super) fn order_id() -> String {
    format!("ord_{}", uuid::Uuid::new_v4().simple())
}

pub(super) fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

pub(super) fn items_of(order: &Value) -> String {
    order.get("items").map(Value::to_string).unwrap_or_default()
}

/// The order in a request body: every variant parses it the same way (`serde_json::from_slice`
/// on the bytes, which the floor also hashes), so the handlers differ only in idempotency.
pub(super) fn order_of(body: &[u8]) -> Option<Value> {
    serde_json::from_slice(body).ok()
}

/// The response every variant sends: `201`, a JSON body naming the order.
pub(super) fn created(id: &str, order: &Value) -> (StatusCode, Json<Value>) {
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "items": order.get("items") })),
    )
}

/// A plain database error as `500` (the baseline and the floor).
pub(super) struct DbError(sqlx::Error);

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        Self(e)
    }
}

impl IntoResponse for DbError {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.0.to_string()).into_response()
    }
}

/// What the floor stores: the response it sends, as `StoredResponse` columns.
pub(super) fn floor_response(id: &str, order: &Value) -> (Vec<u8>, Vec<u8>) {
    let body =
        serde_json::to_vec(&json!({ "id": id, "items": order.get("items") })).unwrap_or_default();
    let stored = StoredResponse::new(
        201,
        vec![("content-type".to_owned(), b"application/json".to_vec())],
        Vec::new(),
    );
    (stored.encode_headers(), body)
}

pub(super) fn floor_reply(body: Vec<u8>) -> Response {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// The authentication stand-in every variant sits behind: puts the caller's scope into the
/// request extensions, where `oncely_tower::ExtensionScope` (the layer's default) finds it.
async fn scope(mut req: Request<Body>, next: Next) -> Response {
    req.extensions_mut().insert(Scope::new(SCOPE));
    next.run(req).await
}

/// Every router is finalized with `with_state(())`, as `axum::serve` does (through
/// `into_make_service`): a `Router<()>` driven through `oneshot` as it is would otherwise build
/// its handler's route, with every layer on it, again on every request (axum keeps a
/// stateless handler unbuilt until the state is given), a cost no server pays.
pub(super) fn with_scope(router: Router) -> Router {
    router.layer(middleware::from_fn(scope)).with_state(())
}
