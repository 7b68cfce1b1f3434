//! The server's own problem+json answers (RFC 9457): the application codes of this API
//! (`not_found`, `method_not_allowed`, `unauthenticated`, `unavailable`, and the refusals of
//! [`not_executed`]), built as [`oncely_core::Problem::custom`] and rendered by the one
//! renderer the layer uses too (`Problem`'s `IntoResponse`), so a server problem and a layer
//! problem have the same members in the same order and the same headers.
//!
//! `type` is `urn:oncely:problem:<code>`; every problem says whether a retry can help
//! (`retryable`, and the `x-should-retry` header of generated SDKs).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_core::Problem;
use oncely_tower::HandlerOutcome;
use serde_json::Value;

/// Any path that is not a route: a problem, not an empty body.
pub async fn no_route(uri: axum::http::Uri) -> Response {
    let detail = format!(
        "{} is not a route of this API (see /openapi.json)",
        uri.path()
    );
    Problem::custom(404, "not_found", "Not found", detail).into_response()
}

/// A route with another method: `405 method_not_allowed`.
pub async fn no_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let detail = format!("{method} is not allowed on {}", uri.path());
    Problem::custom(405, "method_not_allowed", "Method not allowed", detail).into_response()
}

/// `404 not_found`: no such `what` (a payment, an order) for the caller.
pub fn not_found(what: &str) -> Response {
    let detail = format!("no such {what} for this account");
    Problem::custom(404, "not_found", "Not found", detail).into_response()
}

/// `401 unauthenticated` with `WWW-Authenticate: Bearer`: a `/v1/` request without a usable
/// `Authorization: Bearer <account>`.
pub fn unauthenticated() -> Response {
    let mut resp = Problem::custom(
        401,
        "unauthenticated",
        "Authentication required",
        "send Authorization: Bearer <account>",
    )
    .into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// `503 unavailable`: the database failed; the error goes to the log, not to the client.
pub fn internal(e: anyhow::Error) -> Response {
    // The error (addresses, driver messages) goes to the log, not to the client.
    tracing::error!(error = %format!("{e:#}"), "request failed");
    Problem::custom(
        503,
        "unavailable",
        "Service unavailable",
        "the service's database could not answer; retry later",
    )
    .with_retryable(true)
    .with_retry_after(1)
    .into_response()
}

/// A problem+json response that the layer must not store: nothing was executed (validation
/// failed before any effect), so the key is released and the client may correct and retry.
/// A `409` or `5xx` is retryable and carries `Retry-After: 1`; `extra`'s members (an object)
/// become extensions.
pub fn not_executed(
    status: StatusCode,
    code: &str,
    detail: impl Into<String>,
    extra: Value,
) -> Response {
    // One code, one title: a library code keeps the library's.
    let title = match status.as_u16() {
        _ if oncely_core::ErrorCode::from_name(code).is_some() => {
            oncely_core::ErrorCode::from_name(code).map_or("", oncely_core::ErrorCode::title)
        }
        400 => "Malformed request",
        409 => "Conflict",
        415 => "Unsupported media type",
        422 => "Invalid request",
        _ => "Service unavailable",
    };
    let retryable = status.is_server_error() || status == StatusCode::CONFLICT;
    let mut p = Problem::custom(status.as_u16(), code, title, detail).with_retryable(retryable);
    if retryable {
        p = p.with_retry_after(1);
    }
    if let Value::Object(more) = extra {
        p = p.with_extensions(more);
    }
    let mut resp = p.into_response();
    resp.extensions_mut().insert(HandlerOutcome::NotExecuted);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;
    use oncely_core::problem::PROBLEM_JSON;
    use oncely_core::{ErrorCode, StatusProfile, X_SHOULD_RETRY};

    /// The body and the names of the headers of a response.
    async fn parts_of(res: Response) -> (StatusCode, Vec<String>, Vec<u8>) {
        let status = res.status();
        let mut names: Vec<String> = res.headers().keys().map(|k| k.to_string()).collect();
        names.sort_unstable();
        let body = to_bytes(res.into_body(), 64 * 1024).await.unwrap().to_vec();
        (status, names, body)
    }

    /// The body a problem with these members renders to, rebuilt from the parsed JSON: equal
    /// bytes mean the same members in the same order.
    fn rebuilt(body: &[u8]) -> Vec<u8> {
        let v: Value = serde_json::from_slice(body).unwrap();
        let mut p = Problem::custom(
            u16::try_from(v["status"].as_u64().unwrap()).unwrap(),
            v["code"].as_str().unwrap(),
            v["title"].as_str().unwrap(),
            v["detail"].as_str().unwrap(),
        )
        .with_retryable(v["retryable"].as_bool().unwrap());
        for (k, x) in v.as_object().unwrap() {
            if ![
                "type",
                "title",
                "status",
                "detail",
                "instance",
                "code",
                "retryable",
            ]
            .contains(&k.as_str())
            {
                p = p.with_extension(k.clone(), x.clone());
            }
        }
        p.to_json()
    }

    /// The server's 404, 405 and 401 and the layer's problems are rendered by the same code:
    /// the same member order (RFC 9457's: type, title, status, detail, then code, retryable)
    /// and the same headers (content type, x-should-retry).
    #[tokio::test]
    async fn server_and_layer_problems_have_the_same_shape() {
        let uri: axum::http::Uri = "/nowhere".parse().unwrap();
        let layer = oncely_tower::problem_response(&Problem::new(
            ErrorCode::KeyMissing,
            StatusProfile::Ietf,
            "send one",
        ))
        .map(axum::body::Body::new);
        let (status, layer_headers, layer_body) = parts_of(layer).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(layer_headers, ["content-type", X_SHOULD_RETRY]);
        assert_eq!(
            String::from_utf8(layer_body.clone()).unwrap(),
            r#"{"type":"urn:oncely:problem:idempotency_key_missing","title":"Idempotency-Key header missing","status":400,"detail":"send one","code":"idempotency_key_missing","retryable":false}"#
        );
        assert_eq!(rebuilt(&layer_body), layer_body);

        let (status, headers, body) = parts_of(no_route(uri.clone()).await).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(headers, layer_headers);
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            r#"{"type":"urn:oncely:problem:not_found","title":"Not found","status":404,"detail":"/nowhere is not a route of this API (see /openapi.json)","code":"not_found","retryable":false}"#
        );

        let (status, headers, body) = parts_of(no_method(axum::http::Method::PUT, uri).await).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(headers, layer_headers);
        assert_eq!(rebuilt(&body), body);
        assert!(body.starts_with(br#"{"type":"urn:oncely:problem:method_not_allowed","title":"Method not allowed","status":405,"detail":"#));

        let (status, mut headers, body) = parts_of(unauthenticated()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        headers.retain(|h| h != "www-authenticate");
        assert_eq!(headers, layer_headers);
        assert_eq!(rebuilt(&body), body);
    }

    #[tokio::test]
    async fn not_executed_keeps_its_headers_and_extensions() {
        let res = not_executed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "bad",
            serde_json::json!({"errors": [{"field": "amount"}]}),
        );
        assert_eq!(res.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(res.headers()[X_SHOULD_RETRY], "false");
        assert!(res.headers().get(header::RETRY_AFTER).is_none());
        assert!(res.extensions().get::<HandlerOutcome>().is_some());
        let (_, _, body) = parts_of(res).await;
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"type":"urn:oncely:problem:validation_failed","title":"Invalid request","status":422,"detail":"bad","code":"validation_failed","retryable":false,"errors":[{"field":"amount"}]}"#
        );
        let res = not_executed(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_unavailable",
            "x",
            Value::Null,
        );
        assert_eq!(res.headers()[X_SHOULD_RETRY], "true");
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
        let res = internal(anyhow::anyhow!("boom"));
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()[X_SHOULD_RETRY], "true");
        // Retryable, so it says when: every retryable problem carries Retry-After.
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
    }
}
