//! The reads: the caller's payments and orders, listed or by id, and the webhook events
//! applied to a payment.

use crate::serve::App;
use crate::serve::problems::{internal, not_found};
use anyhow::Result;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use oncely_core::Scope;
use serde_json::json;

/// A read by id: the resource, a `404 not_found` problem, or a `503 unavailable` problem.
fn found<T: serde::Serialize>(read: Result<Option<T>>, what: &str) -> Response {
    match read {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => not_found(what),
        Err(e) => internal(e),
    }
}

/// `GET /v1/payments`.
pub async fn list_payments(State(app): State<App>, Extension(scope): Extension<Scope>) -> Response {
    match app.db().payments(scope.as_str()).await {
        Ok(p) => Json(json!({ "data": p })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /v1/payments/{id}`.
pub async fn get_payment(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Response {
    found(app.db().payment_by_id(scope.as_str(), &id).await, "payment")
}

/// `GET /v1/payments/{id}/events`: the webhook events applied to the caller's payment, one
/// row per application (so a duplicate would show).
pub async fn payment_events(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Response {
    match app.db().payment_by_id(scope.as_str(), &id).await {
        Ok(Some(_)) => {}
        Ok(None) => return not_found("payment"),
        Err(e) => return internal(e),
    }
    match app.db().webhook_events(scope.as_str(), &id).await {
        Ok(events) => Json(json!({ "data": events })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /v1/orders/{id}`.
pub async fn get_order(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Response {
    found(app.db().order_by_id(scope.as_str(), &id).await, "order")
}

/// `GET /v1/orders`.
pub async fn list_orders(State(app): State<App>, Extension(scope): Extension<Scope>) -> Response {
    match app.db().orders(scope.as_str()).await {
        Ok(o) => Json(json!({ "data": o })).into_response(),
        Err(e) => internal(e),
    }
}
