//! `GET /healthz` (liveness) and `GET /readyz` (readiness) of `oncely serve`.
//!
//! Liveness answers `200 ok` whenever the process serves HTTP, also while the key store is
//! down: restarting the process would not bring the store back. Readiness answers `200` only
//! when the key store answers one read within 2 seconds, and `503 not_ready` (problem+json,
//! `Retry-After`) otherwise, so that a load balancer sends keyed writes only where they can
//! be claimed.

use super::App;
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use oncely_core::{IdempotencyKey, RecordKey, Scope};
use serde_json::json;
use std::time::Duration;

/// How long readiness waits for the store's answer: 2 seconds.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz`.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", security(()),
    summary = "Liveness: the process serves HTTP (200 even while the key store is down).",
    responses((status = 200, description = "Alive.", content_type = "text/plain", body = String)))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// What `/readyz` answers when ready (its schema).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct Readiness {
    #[schema(pattern = "^ready$")]
    status: String,
    store: String,
}

/// `GET /readyz`: one read of a key nobody uses, bounded by [`PROBE_TIMEOUT`].
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", security(()),
    summary = "Readiness: the key store answers (route traffic here only then).",
    responses(
        (status = 200, description = "Ready.", body = Readiness),
        (status = 503, description = "`not_ready`: the key store does not answer yet.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
pub async fn readyz(State(app): State<App>) -> Response {
    let probe = match IdempotencyKey::new("readiness-probe") {
        Ok(k) => RecordKey::new(Scope::new("oncely-readiness-probe"), k),
        Err(_) => unreachable!("a constant valid key"),
    };
    let answer = tokio::time::timeout(PROBE_TIMEOUT, app.store().get(&probe)).await;
    let detail = match answer {
        Ok(Ok(_)) => return Json(json!({"status": "ready", "store": "answers"})).into_response(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "readiness: the key store does not answer");
            "the idempotency key store does not answer; keyed writes answer 503 until it does"
        }
        Err(_) => "the idempotency key store did not answer within 2 seconds",
    };
    oncely_core::Problem::custom(503, "not_ready", "Not ready", detail)
        .with_retryable(true)
        .with_retry_after(1)
        .into_response()
}
