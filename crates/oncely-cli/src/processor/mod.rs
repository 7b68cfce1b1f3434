//! `oncely processor`: the simulated outside systems — a card processor and a mailer — with
//! their own idempotent ledgers.
//!
//! They run as their own process so that they outlive a killed API server, exactly like a real
//! card network does: the gates count here how many times each charge and each e-mail was
//! *executed*, which is the side effect that must happen once.
//!
//! - `POST /charges` (`Idempotency-Key` required) `{"amount":…, "currency":…, "source":…}` ->
//!   `201 {"id":"ch_…", "status":"succeeded", …}`, or `402 {"error":"card_declined"}` for the
//!   sources `tok_decline` and `tok_chargeDeclined`. The same key replays the first answer.
//! - `POST /emails` (`Idempotency-Key` required) `{"to":…, "subject":…}` -> `202 {"id":"em_…"}`.
//! - `GET /charges`, `GET /emails`: per key, how many calls arrived and how many executed,
//!   with the `metadata` object of the first request (the API sends its account, its own
//!   `Idempotency-Key` and the payment id there).
//! - Every executed charge emits a signed Standard Webhooks event, `charge.succeeded`, to the
//!   receivers registered at `POST /webhook-endpoints`, retried until acknowledged; see
//!   [`webhooks`] (`GET /events`, `POST /events/{id}/deliver`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One idempotent ledger: per key, the first answer and the call/execution counts.
#[derive(Default)]
struct Ledger {
    entries: BTreeMap<String, Entry>,
    next_id: u64,
}

struct Entry {
    status: u16,
    body: Value,
    metadata: Value,
    calls: u64,
    executions: u64,
}

#[derive(Serialize)]
struct EntryView<'a> {
    key: &'a str,
    id: Option<&'a str>,
    metadata: &'a Value,
    status: u16,
    calls: u64,
    executions: u64,
}

pub mod webhooks;

#[derive(Clone)]
struct Ledgers {
    charges: Arc<Mutex<Ledger>>,
    emails: Arc<Mutex<Ledger>>,
    webhooks: Arc<webhooks::Sender>,
    latency: Latency,
}

/// How long the simulated systems take to answer, after the call was recorded (and, for a
/// first call, executed): a slow outside system whose answer comes late, the case in which an
/// API's lease must outlast the call. Default: no delay.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    /// Before `POST /charges` answers.
    pub charge: std::time::Duration,
    /// Before `POST /emails` answers.
    pub email: std::time::Duration,
}

/// The processor's router; its webhook events are signed with `webhook_secret`
/// (`whsec_<base64>`), and its answers delayed by `latency`.
///
/// # Errors
///
/// When `webhook_secret` is not a Standard Webhooks secret.
pub fn router(webhook_secret: &str, latency: Latency) -> anyhow::Result<Router> {
    let sender = Arc::new(webhooks::Sender::new(webhook_secret)?);
    let ledgers = Ledgers {
        charges: Arc::default(),
        emails: Arc::default(),
        webhooks: Arc::clone(&sender),
        latency,
    };
    Ok(Router::new()
        .route("/charges", post(charge).get(list_charges))
        .route("/emails", post(email).get(list_emails))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(ledgers)
        .merge(
            Router::new()
                .route(
                    "/webhook-endpoints",
                    post(webhooks::register)
                        .get(webhooks::endpoints)
                        .delete(webhooks::forget_endpoints),
                )
                .route("/events", get(webhooks::list).post(webhooks::trigger))
                .route("/events/{id}/deliver", post(webhooks::deliver))
                .with_state(sender),
        ))
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    let mut values = headers.get_all("idempotency-key").iter();
    let first = values.next()?.to_str().ok()?.to_owned();
    if values.next().is_some() || first.is_empty() {
        return None;
    }
    Some(first)
}

fn missing_key() -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": "idempotency_key_missing"})),
    )
        .into_response()
}

/// Runs `execute` once per key; later calls replay the first answer.
fn once(
    ledger: &Mutex<Ledger>,
    key: String,
    metadata: Value,
    execute: impl FnOnce(u64) -> (u16, Value),
) -> Response {
    let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
    let next = l.next_id + 1;
    let mut executed = false;
    let entry = l.entries.entry(key).or_insert_with(|| {
        executed = true;
        let (status, body) = execute(next);
        Entry {
            status,
            body,
            metadata,
            calls: 0,
            executions: 1,
        }
    });
    entry.calls += 1;
    let (status, body) = (entry.status, entry.body.clone());
    if executed {
        l.next_id = next;
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

async fn charge(State(s): State<Ledgers>, headers: HeaderMap, Json(req): Json<Value>) -> Response {
    let Some(key) = key_of(&headers) else {
        return missing_key();
    };
    let metadata = req["metadata"].clone();
    let mut succeeded = None;
    let res = once(&s.charges, key, metadata.clone(), |n| {
        let source = req["source"].as_str().unwrap_or_default();
        if matches!(source, "tok_decline" | "tok_chargeDeclined") {
            (
                402,
                json!({"error": "card_declined", "decline_code": "generic_decline"}),
            )
        } else {
            let charge = json!({
                "id": format!("ch_{n:08}"),
                "status": "succeeded",
                "amount": req["amount"],
                "currency": req["currency"],
            });
            succeeded = Some(charge.clone());
            (201, charge)
        }
    });
    // Executed (not a replay of the ledger): the event goes out once per charge.
    if let Some(charge) = succeeded {
        s.webhooks.charge_succeeded(&charge, &metadata);
    }
    tokio::time::sleep(s.latency.charge).await;
    res
}

async fn email(State(s): State<Ledgers>, headers: HeaderMap, Json(req): Json<Value>) -> Response {
    let Some(key) = key_of(&headers) else {
        return missing_key();
    };
    let metadata = req["metadata"].clone();
    let res = once(&s.emails, key, metadata, |n| {
        (
            202,
            json!({"id": format!("em_{n:08}"), "to": req["to"], "status": "queued"}),
        )
    });
    tokio::time::sleep(s.latency.email).await;
    res
}

fn list(ledger: &Mutex<Ledger>) -> Json<Value> {
    let l = ledger.lock().unwrap_or_else(|e| e.into_inner());
    let entries: Vec<EntryView<'_>> = l
        .entries
        .iter()
        .map(|(k, e)| EntryView {
            key: k,
            id: e.body["id"].as_str(),
            metadata: &e.metadata,
            status: e.status,
            calls: e.calls,
            executions: e.executions,
        })
        .collect();
    let executions: u64 = l.entries.values().map(|e| e.executions).sum();
    let calls: u64 = l.entries.values().map(|e| e.calls).sum();
    Json(json!({"entries": entries, "executions": executions, "calls": calls}))
}

async fn list_charges(State(s): State<Ledgers>) -> Json<Value> {
    list(&s.charges)
}

async fn list_emails(State(s): State<Ledgers>) -> Json<Value> {
    list(&s.emails)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn call(
        app: &Router,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (u16, Value) {
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let resp = app
            .clone()
            .oneshot(req.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    #[tokio::test]
    async fn charges_execute_once_per_key_and_count_calls() {
        let app = router(webhooks::DEV_WEBHOOK_SECRET, Latency::default()).unwrap();
        let body = json!({"amount": 100, "currency": "usd", "source": "tok_visa"});
        let (s1, b1) = call(&app, "POST", "/charges", Some("k1"), body.clone()).await;
        let (s2, b2) = call(&app, "POST", "/charges", Some("k1"), body.clone()).await;
        assert_eq!((s1, s2), (201, 201));
        assert_eq!(b1, b2);
        let (s3, b3) = call(&app, "POST", "/charges", Some("k2"), body).await;
        assert_eq!(s3, 201);
        assert_ne!(b1["id"], b3["id"]);
        let decline = json!({"amount": 1, "currency": "usd", "source": "tok_decline"});
        assert_eq!(
            call(&app, "POST", "/charges", Some("k3"), decline).await.0,
            402
        );
        let (_, ledger) = call(&app, "GET", "/charges", None, Value::Null).await;
        assert_eq!(ledger["executions"], 3);
        assert_eq!(ledger["calls"], 4);
        assert_eq!(ledger["entries"][0]["key"], "k1");
        assert_eq!(ledger["entries"][0]["calls"], 2);
        assert_eq!(ledger["entries"][0]["executions"], 1);
        assert_eq!(call(&app, "POST", "/charges", None, json!({})).await.0, 400);
    }
}
