//! `GET /v1/idempotency-keys/{key}`: the state of the caller's key (absent, in flight and
//! whether suspended or marked for a person, or complete and until when it replays).

use crate::serve::App;
use crate::serve::problems::{internal, not_executed};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use oncely_core::{Clock, IdempotencyKey, RecordKey, RecordState, Scope, SystemClock};
use serde_json::json;

/// The body [`key_state`] answers (its schema; the handler writes the members it has).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct KeyState {
    key: String,
    #[schema(schema_with = key_states)]
    state: String,
    /// In flight but nobody is working on it (stopped at its recovery point, or its owner
    /// died): a retry with the same request resumes it at once.
    suspended: Option<bool>,
    /// In flight and marked for a person: the completer gave up on it after its re-drive
    /// attempts; it never runs again, and a retry is answered `409
    /// idempotency_request_needs_attention`.
    needs_attention: Option<bool>,
    /// When it was marked for a person, epoch milliseconds.
    marked_at: Option<i64>,
    /// How many times the completer re-drove it.
    redrive_attempts: Option<u32>,
    note: Option<String>,
    /// The stored response's status.
    status: Option<u16>,
    /// Epoch milliseconds.
    completed_at: Option<i64>,
    /// Epoch milliseconds.
    replays_until: Option<i64>,
    /// Epoch milliseconds.
    lease_expires_at: Option<i64>,
    #[schema(value_type = Option<Object>)]
    recovery_point: Option<serde_json::Value>,
}

/// `absent`, `in_flight` or `complete`.
fn key_states() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(["absent", "in_flight", "complete"]))
        .build()
}

/// `GET /v1/idempotency-keys/{key}`: the state of the caller's key.
#[utoipa::path(get, path = "/v1/idempotency-keys/{key}", operation_id = "getIdempotencyKey",
    summary = "The state of one of the caller's keys: absent, in_flight (suspended, or marked for a person) or complete, and until when it replays.",
    params(("key" = String, Path, min_length = 1, max_length = 255, pattern = "^[!-~]{1,255}$",
        description = "The key as sent in `Idempotency-Key` (unquoted), percent-encoded as one path segment.")),
    responses(
        (status = 200, description = "The key's state.", body = KeyState),
        (status = 400, description = "`idempotency_key_invalid`: the key in the path is not 1 to 255 visible ASCII characters.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 401, description = "`unauthenticated`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`unavailable`: the key store could not answer; retry later.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
pub async fn key_state(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    key: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let invalid = |detail: String| {
        not_executed(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            detail,
            json!({}),
        )
    };
    let Ok(Path(key)) = key else {
        return invalid("the key in the path is not valid UTF-8 (keys are visible ASCII)".into());
    };
    // A path segment is taken as is: the header's syntax (surrounding spaces, a quoted form)
    // does not apply, so a key with a space is invalid, never another key.
    if let Some(b) = key.bytes().find(|b| !b.is_ascii_graphic()) {
        return invalid(format!(
            "the key contains the byte 0x{b:02x}, which is not a visible ASCII character (a key is 1 to 255 visible ASCII characters)"
        ));
    }
    let key = match IdempotencyKey::new(&key) {
        Ok(k) => k,
        Err(e) => {
            let detail = e
                .to_string()
                .replace("the Idempotency-Key header is", "the key is");
            return invalid(format!(
                "{detail} (a key is 1 to 255 visible ASCII characters)"
            ));
        }
    };
    let window = oncely_core::clock::duration_millis(app.policy().replay_window);
    let now = SystemClock.now_millis();
    let rec = match app.store().get(&RecordKey::new(scope, key.clone())).await {
        Ok(r) => r,
        Err(e) => return internal(anyhow::anyhow!(e)),
    };
    let body = match rec {
        None => json!({"key": key.as_str(), "state": "absent"}),
        Some(r) => {
            let redrives = r.redrives;
            match r.state {
                RecordState::Released => json!({"key": key.as_str(), "state": "absent"}),
                RecordState::Complete {
                    completed_at,
                    response,
                } if completed_at + window > now => json!({
                    "key": key.as_str(), "state": "complete", "status": response.status,
                    "completed_at": completed_at, "replays_until": completed_at + window,
                }),
                RecordState::Complete { completed_at, .. } => json!({
                    "key": key.as_str(), "state": "absent", "completed_at": completed_at,
                    "note": "the replay window has passed: reusing this key starts a new request",
                }),
                // The completer gave up on it: nobody will run it again, a person must look.
                RecordState::InFlight {
                    lease_expires_at,
                    recovery_point,
                } if redrives.is_marked() => json!({
                    "key": key.as_str(), "state": "in_flight", "suspended": true,
                    "needs_attention": true, "marked_at": redrives.marked_at,
                    "redrive_attempts": redrives.attempts,
                    "lease_expires_at": lease_expires_at, "recovery_point": recovery_point,
                    "note": "the request could not be finished: the completer gave up on it and marked it for a person; it will not run again, and a retry with this key is answered 409 idempotency_request_needs_attention (do not retry with a new key either: it may have taken effect part-way)",
                }),
                // Suspended: the request stopped at its recovery point (an outside system failed,
                // or its server shut down) and its lease was cut short, or its owner died and the
                // lease lapsed. Nobody is working on it: the next retry (or the completer) takes
                // it over at once and resumes.
                RecordState::InFlight {
                    lease_expires_at,
                    recovery_point,
                } if lease_expires_at <= now => json!({
                    "key": key.as_str(), "state": "in_flight", "suspended": true,
                    "needs_attention": false, "redrive_attempts": redrives.attempts,
                    "lease_expires_at": lease_expires_at, "recovery_point": recovery_point,
                    "note": "no request is working on this key: retry the same request with the same key to resume it from its recovery point",
                }),
                RecordState::InFlight {
                    lease_expires_at,
                    recovery_point,
                } => json!({
                    "key": key.as_str(), "state": "in_flight", "suspended": false,
                    "needs_attention": false, "redrive_attempts": redrives.attempts,
                    "lease_expires_at": lease_expires_at, "recovery_point": recovery_point,
                }),
                // A state this server does not know: say so rather than guess.
                other => {
                    return internal(anyhow::anyhow!(
                        "the record of {key} is in a state this server does not know: {other:?}"
                    ));
                }
            }
        }
    };
    Json(body).into_response()
}
