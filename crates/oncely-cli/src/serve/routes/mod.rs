//! The reference API's routes, one file per resource.
//!
//! | file | routes |
//! |---|---|
//! | [`payments`] | `POST /v1/payments`: the multi-phase payment flow, top to bottom |
//! | [`orders`] | `POST /v1/orders`: one phase, one commit |
//! | [`reads`] | `GET /v1/payments`, `/v1/payments/{id}`, `/v1/payments/{id}/events`, `/v1/orders`, `/v1/orders/{id}` |
//! | [`keys`] | `GET /v1/idempotency-keys/{key}`: the state of the caller's key |
//! | [`webhooks`] | `POST /webhooks/processor`: the processor's signed Standard Webhooks events, each applied once |
//!
//! [`body`] checks the write routes' JSON bodies before any effect.

pub mod body;
pub mod keys;
pub mod orders;
pub mod payments;
pub mod reads;
pub mod webhooks;

use super::problems::not_executed;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_sqlx::TxError;
use serde_json::{Value, json};

/// How a request that ran can fail: in its database phase, or at an outside system.
pub enum Failure {
    /// A phase failed; it rolled back.
    Tx(TxError),
    /// An outside system failed part-way: the request stops at its last committed step (the
    /// layer keeps it in flight there with its lease cut short), and a retry with the same
    /// key resumes there.
    Upstream(String),
}

impl From<TxError> for Failure {
    fn from(e: TxError) -> Self {
        Self::Tx(e)
    }
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Self::Tx(e.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Self::Tx(e) => e.into_response(),
            Self::Upstream(why) => {
                // The full error (addresses) goes to the log, not to the client.
                tracing::warn!(error = %why, "request suspended at its recovery point; a retry resumes it");
                not_executed(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream_unavailable",
                    "a system this request depends on failed part-way; the request stopped at its last completed step: retry it with the same Idempotency-Key to resume there",
                    json!({}),
                )
            }
        }
    }
}

/// A JSON response with `status` and, if given, a `Location` header.
pub fn json_response(status: StatusCode, body: &Value, location: Option<String>) -> Response {
    let mut resp = (status, Json(body)).into_response();
    if let Some(loc) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    resp
}
