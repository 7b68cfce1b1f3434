//! The server's problem+json answers (RFC 9457): the constructors every route uses, and the
//! answers for paths and methods that are not routes.
//!
//! `type` is `urn:oncely:problem:<code>`; every problem says whether a retry can help
//! (`retryable`, and the `x-should-retry` header of generated SDKs).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_tower::HandlerOutcome;
use serde_json::{Value, json};

/// Any path that is not a route: a problem, not an empty body.
pub async fn no_route(uri: axum::http::Uri) -> Response {
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

/// A route with another method: `405 method_not_allowed`.
pub async fn no_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let detail = format!("{method} is not allowed on {}", uri.path());
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "Method not allowed",
        detail,
        false,
    )
}

/// `404 not_found`: no such `what` (a payment, an order) for the caller.
pub fn not_found(what: &str) -> Response {
    let detail = format!("no such {what} for this account");
    problem(
        StatusCode::NOT_FOUND,
        "not_found",
        "Not found",
        detail,
        false,
    )
}

/// `503 unavailable`: the database failed; the error goes to the log, not to the client.
pub fn internal(e: anyhow::Error) -> Response {
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

/// A problem+json response that the layer must not store: nothing was executed (validation
/// failed before any effect), so the key is released and the client may correct and retry.
pub fn not_executed(
    status: StatusCode,
    code: &str,
    detail: impl Into<String>,
    extra: Value,
) -> Response {
    let title = match status.as_u16() {
        400 => "Malformed request",
        409 => "Conflict",
        415 => "Unsupported media type",
        422 => "Invalid request",
        _ => "Service unavailable",
    };
    let retryable = status.is_server_error() || status == StatusCode::CONFLICT;
    let mut resp = problem_with(status, code, title, detail.into(), retryable, extra);
    if retryable {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp.extensions_mut().insert(HandlerOutcome::NotExecuted);
    resp
}
