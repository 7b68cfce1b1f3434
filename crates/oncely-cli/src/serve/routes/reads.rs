//! The reads: the caller's payments and orders, listed or by id, and the webhook events
//! applied to a payment.

use crate::serve::App;
use crate::serve::db::{Order, Page, Payment};
use crate::serve::problems::{internal, not_found};
use anyhow::Result;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use oncely_core::Scope;

/// A read by id: the resource, a `404 not_found` problem, or a `503 unavailable` problem.
fn found<T: serde::Serialize>(read: Result<Option<T>>, what: &str) -> Response {
    match read {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => not_found(what),
        Err(e) => internal(e),
    }
}

/// `GET /v1/payments`.
#[utoipa::path(get, path = "/v1/payments", operation_id = "listPayments", summary = "The caller's payments.",
    responses(
        (status = 200, description = "OK", body = Page<Payment>),
        (status = 401, description = "`unauthenticated`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 404, description = "`not_found`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`unavailable`: the database could not answer; retry later.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
pub async fn list_payments(State(app): State<App>, Extension(scope): Extension<Scope>) -> Response {
    match app.db().payments(scope.as_str()).await {
        Ok(p) => Json(Page { data: p }).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /v1/payments/{id}`.
#[utoipa::path(get, path = "/v1/payments/{id}", operation_id = "getPayment", params(("id" = String, Path)),
    responses(
        (status = 200, description = "OK", body = Payment),
        (status = 401, description = "`unauthenticated`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 404, description = "`not_found`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`unavailable`: the database could not answer; retry later.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
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
        Ok(events) => Json(serde_json::json!({ "data": events })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /v1/orders/{id}`.
#[utoipa::path(get, path = "/v1/orders/{id}", operation_id = "getOrder", params(("id" = String, Path)),
    responses(
        (status = 200, description = "OK", body = Order),
        (status = 401, description = "`unauthenticated`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 404, description = "`not_found`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`unavailable`: the database could not answer; retry later.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
pub async fn get_order(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Response {
    found(app.db().order_by_id(scope.as_str(), &id).await, "order")
}

/// `GET /v1/orders`.
#[utoipa::path(get, path = "/v1/orders", operation_id = "listOrders", responses(
        (status = 200, description = "OK", body = Page<Order>),
        (status = 401, description = "`unauthenticated`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 404, description = "`not_found`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`unavailable`: the database could not answer; retry later.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
pub async fn list_orders(State(app): State<App>, Extension(scope): Extension<Scope>) -> Response {
    match app.db().orders(scope.as_str()).await {
        Ok(o) => Json(Page { data: o }).into_response(),
        Err(e) => internal(e),
    }
}
