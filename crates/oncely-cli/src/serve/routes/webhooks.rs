//! `POST /webhooks/processor`: the reference server's webhook receiver, built the way a user
//! would build one.
//!
//! The card processor (`oncely processor`) sends a signed Standard Webhooks delivery for every
//! charge it executes (`charge.succeeded`), retries it until it gets a `2xx`, and may deliver it
//! several times at once. The route's layers, outermost first:
//!
//! 1. [`StandardWebhooksLayer`](oncely_tower::StandardWebhooksLayer): the signature and the
//!    timestamp are verified **before** any claim (`401 webhook_signature_invalid`, `400
//!    webhook_timestamp_out_of_tolerance`, `400 webhook_headers_invalid`); the sender
//!    (`processor`) becomes the scope.
//! 2. The API's [`IdempotencyLayer`](oncely_tower::IdempotencyLayer), keyed on the `webhook-id`
//!    header ([`KeySource`](oncely_tower::KeySource)) instead of `Idempotency-Key`.
//! 3. [`receive`]: one transaction ([`oncely_sqlx::Tx`]) holds the claim, the effect (the
//!    payment confirmed, the event recorded) and the stored `200` answer, and commits them
//!    together. A redelivery, a concurrent duplicate, or a retry after this process died
//!    mid-request finds the stored answer and replays it: the event is applied once.
//!
//! `GET /v1/payments/{id}/events` lists the events applied to one of the caller's payments.

use crate::serve::App;
use crate::serve::db::{BusinessDb, WebhookEvent};
use crate::serve::problems::not_executed;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oncely_core::{Clock, SystemClock};
use oncely_sqlx::{SqlStore, Tx};
use oncely_tower::VerifiedWebhook;
use serde_json::{Value, json};

/// The receiver's path.
pub const PATH: &str = "/webhooks/processor";

/// The scope of the processor's deliveries: the sender their signature authenticates.
pub const SENDER: &str = "processor";

/// The recovery point `--crash-after` can name for this route (testing only): right after the
/// transaction with the effect and the stored answer committed, before the answer is sent.
pub const CRASH_POINT: &str = "webhook_applied";

/// `POST /webhooks/processor`: applies one verified event, once.
pub async fn receive<S>(
    State(app): State<App>,
    Extension(event): Extension<VerifiedWebhook>,
    mut tx: Tx<S>,
    body: Bytes,
) -> Response
where
    S: SqlStore,
    S::Database: BusinessDb,
{
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return not_executed(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                format!("the event is not JSON: {e}"),
                json!({}),
            );
        }
    };
    let kind = payload["type"].as_str().unwrap_or_default().to_owned();
    let object = &payload["data"]["object"];
    let account = object["metadata"]["account"].as_str().map(str::to_owned);
    let payment = object["metadata"]["payment"].as_str().map(str::to_owned);
    let charge = object["id"].as_str().map(str::to_owned);
    let result: Result<Response, oncely_sqlx::TxError> = async {
        // The effect: the payment confirmed (for a charge.succeeded about one of ours) ...
        let mut confirmed = false;
        if kind == "charge.succeeded"
            && let (Some(account), Some(payment), Some(charge)) = (&account, &payment, &charge)
        {
            confirmed = S::Database::confirm_charge(&mut tx, account, payment, charge).await? > 0;
        }
        // ... and the event recorded. One row per application, deliberately without a unique
        // constraint on the event id: the table counts applications, and the claim in this
        // transaction is what keeps them to one (the gates count the rows).
        let received_at = SystemClock.now_millis();
        S::Database::record_webhook_event(
            &mut tx,
            &WebhookEvent {
                id: &format!("whe_{}", uuid::Uuid::now_v7().simple()),
                sender: event.sender.as_str(),
                event_id: &event.id,
                kind: &kind,
                scope: account.as_deref(),
                payment: payment.as_deref(),
                received_at,
            },
        )
        .await?;
        let answer = json!({
            "received": event.id,
            "type": kind,
            "payment": payment,
            "confirmed": confirmed,
            "received_at": received_at,
        });
        let resp = (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response();
        tx.commit(resp).await
    }
    .await;
    match result {
        Ok(resp) => {
            app.crash_point(CRASH_POINT);
            resp
        }
        Err(e) => e.into_response(),
    }
}
