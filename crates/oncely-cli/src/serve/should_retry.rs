//! `x-should-retry` on every problem the server sends, at its edge.
//!
//! Generated SDKs (Stainless) honour `x-should-retry: true|false` before their own status
//! rules. Most problems set it where they are made; this middleware adds it to any
//! `application/problem+json` response that lacks it (a stored problem such as a card decline,
//! and its replays), from the body's `retryable` member (`false` when absent or unreadable).

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use oncely_core::X_SHOULD_RETRY;

/// The largest problem body read to find `retryable`: 64 KiB (problems are small; a larger
/// body is passed on unread, marked not retryable).
const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// The middleware (`axum::middleware::from_fn(should_retry::mark)`).
pub async fn mark(req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !is_problem || res.headers().contains_key(X_SHOULD_RETRY) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let (body, retryable) = match to_bytes(body, MAX_PROBLEM_BYTES).await {
        Ok(bytes) => {
            let retryable = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("retryable").and_then(serde_json::Value::as_bool))
                .unwrap_or(false);
            (Body::from(bytes), retryable)
        }
        Err(e) => {
            tracing::warn!(error = %e, "a problem body could not be read to mark x-should-retry");
            (Body::empty(), false)
        }
    };
    parts.headers.insert(
        X_SHOULD_RETRY,
        HeaderValue::from_static(if retryable { "true" } else { "false" }),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}
