//! The server's problem+json answers (RFC 9457): the constructors every route uses, and the
//! answers for paths and methods that are not routes.
//!
//! `type` is `urn:oncely:problem:<code>`; every problem says whether a retry can help
//! (`retryable`, and the `x-should-retry` header of generated SDKs).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_core::Problem;
use oncely_core::problem::PROBLEM_JSON;
use oncely_tower::HandlerOutcome;
use serde_json::Value;

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
    respond(&Problem::other(
        status.as_u16(),
        code,
        title,
        detail,
        retryable,
    ))
}

/// The body of `p` as this server has always sent it: the members in alphabetical order (it
/// goes through a `serde_json::Value` object), where the layer's problems keep RFC 9457's
/// order. Either is the same JSON; keeping the bytes keeps stored responses, their replays and
/// clients that compare bytes unchanged.
pub fn body(p: &Problem) -> String {
    serde_json::to_value(p)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// Renders `p`: its status, `Content-Type: application/problem+json`, [`body`], and
/// `x-should-retry` from `retryable` (the Stainless SDK convention: generated clients honour it
/// before their status rules).
pub fn respond(p: &Problem) -> Response {
    let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, body(p)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    resp.headers_mut().insert(
        oncely_core::X_SHOULD_RETRY,
        HeaderValue::from_static(if p.retryable { "true" } else { "false" }),
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
    let mut p = Problem::other(status.as_u16(), code, title, detail, retryable);
    if let Value::Object(more) = extra {
        p.extensions = more;
    }
    let mut resp = respond(&p);
    if retryable {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp.extensions_mut().insert(HandlerOutcome::NotExecuted);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's problem bytes are the ones it sent before the one problem type: members in
    /// alphabetical order, extensions among them.
    #[test]
    fn server_problem_bytes_are_unchanged() {
        let p = Problem::other(422, "validation_failed", "Invalid request", "bad", false)
            .with_extension("errors", serde_json::json!([{"field": "amount"}]));
        assert_eq!(
            body(&p),
            r#"{"code":"validation_failed","detail":"bad","errors":[{"field":"amount"}],"retryable":false,"status":422,"title":"Invalid request","type":"urn:oncely:problem:validation_failed"}"#
        );
    }

    #[test]
    fn respond_sets_status_media_type_and_should_retry() {
        let res = respond(&Problem::other(503, "unavailable", "U", "d", true));
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(res.headers()[oncely_core::X_SHOULD_RETRY], "true");
    }
}
