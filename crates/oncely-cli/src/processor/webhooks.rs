//! The processor as a webhook sender: every executed charge emits a `charge.succeeded` event,
//! delivered as a signed [Standard Webhooks] request to the registered receivers, retried on
//! any failure, and re-deliverable on demand, many copies at once (the webhook gate's tool).
//!
//! - `POST /webhook-endpoints` `{"url": "http://…/webhooks/processor"}`: registers a receiver
//!   (an API server does it when it starts; the same URL twice counts once). Attempts go to the
//!   receivers in turn, as through a load balancer.
//! - `GET /webhook-endpoints`: `{"endpoints": [url, …]}`.
//! - `DELETE /webhook-endpoints`: forgets every receiver (a gate does it before it restarts
//!   its servers on new ports).
//! - `POST /events` `{"type": …, "data": …}`: emits an event now (a provider's "send a test
//!   event" button), delivered like the others; answers `201 {"id"}`. With `"deliver": false`
//!   it is only recorded, so that its first deliveries are the ones `deliver` sends at once.
//! - `GET /events`: every event with its delivery attempts (`statuses`, `0` for a transport
//!   failure) and whether one was acknowledged with a `2xx`.
//! - `POST /events/{id}/deliver` `{"copies": N}`: delivers the event `N` times at once, each
//!   copy with its own retries, and answers when all ended: `{"copies", "delivered",
//!   "attempts", "first_statuses"}`.
//!
//! Each attempt is signed afresh (`webhook-id` = the event id, the same on every attempt;
//! `webhook-timestamp` = now, seconds; `webhook-signature` = `v1,` HMAC-SHA256 by the
//! `standardwebhooks` crate). Retries: up to [`MAX_ATTEMPTS`] attempts per delivery, full
//! jitter (base 100 ms, cap 2 s, the SDK's own [`Backoff`]), a receiver's `Retry-After` as a
//! lower bound, each attempt bounded by 15 seconds (the specification recommends 15 to 30); a
//! `410 Gone` ends a delivery. The specification's own schedule spans days; this one is
//! compressed so that a gate run sees redeliveries in seconds.
//!
//! [Standard Webhooks]: https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oncely_client::Backoff;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The signing secret of the reference pair (`oncely processor` and `oncely serve`) when none is
/// given: a well-known value for tests and demos only. Set `--webhook-secret` (or
/// `ONCELY_WEBHOOK_SECRET`) on both in anything else.
pub const DEV_WEBHOOK_SECRET: &str = "whsec_b25jZWx5LXJlZmVyZW5jZS1wcm9jZXNzb3ItZGV2LXNlY3JldA==";

/// The most attempts one delivery makes (the first included): 12.
pub const MAX_ATTEMPTS: u32 = 12;

/// The longest one attempt may take: 15 seconds.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// The retry backoff between attempts: full jitter, base 100 ms, cap 2 s.
const BACKOFF: Backoff = Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(2));

/// The most copies one `deliver` call sends at once.
const MAX_COPIES: usize = 1000;

/// One event and its delivery record.
struct Event {
    kind: String,
    payload: Vec<u8>,
    /// The status of every attempt, in order (`0`: no response).
    statuses: Vec<u16>,
    delivered: bool,
}

/// The sender's state: its secret, the receivers, the events.
pub(crate) struct Sender {
    signer: standardwebhooks::Webhook,
    endpoints: Mutex<Vec<String>>,
    next: AtomicUsize,
    events: Mutex<BTreeMap<String, Event>>,
    http: reqwest::Client,
}

impl Sender {
    /// A sender signing with `secret` (`whsec_<base64>`).
    ///
    /// # Errors
    ///
    /// When the secret is not a Standard Webhooks secret.
    pub(crate) fn new(secret: &str) -> anyhow::Result<Self> {
        if secret.strip_prefix("whsec_").unwrap_or(secret).is_empty() {
            anyhow::bail!("the webhook secret is empty");
        }
        let signer = standardwebhooks::Webhook::new(secret)
            .map_err(|e| anyhow::anyhow!("invalid webhook secret: {e}"))?;
        Ok(Self {
            signer,
            endpoints: Mutex::default(),
            next: AtomicUsize::new(0),
            events: Mutex::default(),
            http: reqwest::Client::builder()
                .timeout(ATTEMPT_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        })
    }

    /// Records a `charge.succeeded` event for `charge` (the processor's answer, with the
    /// request's `metadata`) and starts delivering it in the background.
    pub(crate) fn charge_succeeded(self: &Arc<Self>, charge: &Value, metadata: &Value) {
        let mut object = charge.clone();
        object["object"] = json!("charge");
        object["metadata"] = metadata.clone();
        self.emit("charge.succeeded", json!({"object": object}), true);
    }

    /// Records an event of type `kind` with `data` and (if `deliver`) starts delivering it in
    /// the background; returns its id.
    fn emit(self: &Arc<Self>, kind: &str, data: Value, deliver: bool) -> String {
        let id = {
            let mut events = lock(&self.events);
            // Unique across processor restarts (a UUIDv7, time-ordered): a receiver keeps event
            // ids for its whole replay window, and a reused id with another body is a mismatch.
            let id = format!("evt_{}", uuid::Uuid::now_v7().simple());
            let payload = json!({"id": id, "type": kind, "created": now_secs(), "data": data});
            events.insert(
                id.clone(),
                Event {
                    kind: kind.to_owned(),
                    payload: serde_json::to_vec(&payload).expect("a Value serializes"),
                    statuses: Vec::new(),
                    delivered: false,
                },
            );
            id
        };
        if deliver {
            let me = Arc::clone(self);
            let event = id.clone();
            tokio::spawn(async move { me.deliver(&event).await });
        }
        id
    }

    /// One delivery of event `id`, with its retries: the first attempt's status, the attempts
    /// made, and whether a `2xx` acknowledged it.
    async fn deliver(&self, id: &str) -> Delivery {
        let Some(payload) = lock(&self.events).get(id).map(|e| e.payload.clone()) else {
            return Delivery::default();
        };
        let mut out = Delivery::default();
        for attempt in 0..MAX_ATTEMPTS {
            let (status, retry_after) = self.attempt(id, &payload).await;
            out.attempts += 1;
            out.first_status.get_or_insert(status);
            {
                let mut events = lock(&self.events);
                if let Some(e) = events.get_mut(id) {
                    e.statuses.push(status);
                    if (200..300).contains(&status) {
                        e.delivered = true;
                    }
                }
            }
            if (200..300).contains(&status) {
                out.delivered = true;
                return out;
            }
            if status == 410 {
                tracing::warn!(
                    event = id,
                    "the receiver answered 410 Gone: delivery stopped"
                );
                return out;
            }
            let jitter = BACKOFF.delay(attempt, None, &mut rand::rng());
            let wait = retry_after.map_or(jitter, |r| r.min(BACKOFF.cap()).max(jitter));
            tracing::debug!(
                event = id,
                status,
                attempt,
                ?wait,
                "webhook delivery failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
        tracing::warn!(
            event = id,
            attempts = MAX_ATTEMPTS,
            "webhook delivery gave up"
        );
        out
    }

    /// One signed attempt to the next receiver: its status (`0`: no receiver, or no response)
    /// and its `Retry-After` in seconds, if any.
    async fn attempt(&self, id: &str, payload: &[u8]) -> (u16, Option<Duration>) {
        let url = {
            let endpoints = lock(&self.endpoints);
            if endpoints.is_empty() {
                return (0, None);
            }
            endpoints[self.next.fetch_add(1, Ordering::Relaxed) % endpoints.len()].clone()
        };
        let timestamp = now_secs();
        let Ok(signature) = self.signer.sign(id, timestamp, payload) else {
            return (0, None);
        };
        let res = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header(standardwebhooks::HEADER_WEBHOOK_ID, id)
            .header(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP, timestamp)
            .header(standardwebhooks::HEADER_WEBHOOK_SIGNATURE, signature)
            .body(payload.to_vec())
            .send()
            .await;
        match res {
            Ok(r) => {
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                (r.status().as_u16(), retry_after)
            }
            Err(e) => {
                tracing::debug!(event = id, %url, error = %e, "webhook attempt got no response");
                (0, None)
            }
        }
    }
}

/// What one delivery did.
#[derive(Debug, Default, Clone, Copy)]
struct Delivery {
    first_status: Option<u16>,
    attempts: u32,
    delivered: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `POST /webhook-endpoints {"url"}`.
pub(crate) async fn register(State(s): State<Arc<Sender>>, Json(req): Json<Value>) -> Response {
    let Some(url) = req["url"]
        .as_str()
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
    else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "url must be an http(s) URL"})),
        )
            .into_response();
    };
    let mut endpoints = lock(&s.endpoints);
    if !endpoints.iter().any(|e| e == url) {
        endpoints.push(url.to_owned());
    }
    (
        StatusCode::CREATED,
        Json(json!({"url": url, "endpoints": endpoints.len()})),
    )
        .into_response()
}

/// `GET /webhook-endpoints`.
pub(crate) async fn endpoints(State(s): State<Arc<Sender>>) -> Json<Value> {
    Json(json!({"endpoints": *lock(&s.endpoints)}))
}

/// `DELETE /webhook-endpoints`.
pub(crate) async fn forget_endpoints(State(s): State<Arc<Sender>>) -> StatusCode {
    lock(&s.endpoints).clear();
    StatusCode::NO_CONTENT
}

/// `POST /events {"type", "data", "deliver"?}`.
pub(crate) async fn trigger(State(s): State<Arc<Sender>>, Json(req): Json<Value>) -> Response {
    let Some(kind) = req["type"].as_str().filter(|k| !k.is_empty()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "type must be a non-empty string"})),
        )
            .into_response();
    };
    let deliver = req["deliver"].as_bool().unwrap_or(true);
    let id = s.emit(kind, req["data"].clone(), deliver);
    (StatusCode::CREATED, Json(json!({"id": id}))).into_response()
}

/// `GET /events`.
pub(crate) async fn list(State(s): State<Arc<Sender>>) -> Json<Value> {
    let events = lock(&s.events);
    let list: Vec<Value> = events
        .iter()
        .map(|(id, e)| {
            let payload: Value = serde_json::from_slice(&e.payload).unwrap_or(Value::Null);
            json!({
                "id": id,
                "type": e.kind,
                "payment": payload["data"]["object"]["metadata"]["payment"],
                "attempts": e.statuses.len(),
                "statuses": e.statuses,
                "delivered": e.delivered,
            })
        })
        .collect();
    Json(json!({"events": list}))
}

/// `POST /events/{id}/deliver {"copies": N}`.
pub(crate) async fn deliver(
    State(s): State<Arc<Sender>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if !lock(&s.events).contains_key(&id) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such event"})),
        )
            .into_response();
    }
    let copies = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|b| b["copies"].as_u64())
        .map_or(1, |n| usize::try_from(n).unwrap_or(usize::MAX));
    if !(1..=MAX_COPIES).contains(&copies) {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": format!("copies must be 1 to {MAX_COPIES}")})),
        )
            .into_response();
    }
    let start = Arc::new(tokio::sync::Barrier::new(copies));
    let tasks: Vec<_> = (0..copies)
        .map(|_| {
            let (s, id, start) = (Arc::clone(&s), id.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                s.deliver(&id).await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(copies);
    for t in tasks {
        results.push(t.await.unwrap_or_default());
    }
    Json(json!({
        "event": id,
        "copies": copies,
        "delivered": results.iter().filter(|d| d.delivered).count(),
        "attempts": results.iter().map(|d| d.attempts).sum::<u32>(),
        "first_statuses": results.iter().map(|d| d.first_status.unwrap_or(0)).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// Registers `receiver` with the processor at `processor_url`, retrying every 500 ms until it
/// answers (an API server does this when it starts; the processor may start later).
pub async fn register_receiver(processor_url: String, receiver: String) {
    let http = reqwest::Client::new();
    loop {
        let res = http
            .post(format!("{processor_url}/webhook-endpoints"))
            .json(&json!({"url": receiver}))
            .send()
            .await;
        match res {
            Ok(r) if r.status().is_success() => {
                tracing::info!(%receiver, "registered the webhook receiver with the processor");
                return;
            }
            Ok(r) => {
                tracing::warn!(status = %r.status(), "the processor refused the webhook receiver")
            }
            Err(e) => tracing::debug!(error = %e, "the processor is not reachable yet"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;
    use axum::routing::post;

    async fn serve(app: axum::Router) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        url
    }

    /// A receiver that verifies each attempt (the reference crate), fails the first two with
    /// `503`, and records the ids it saw.
    async fn flaky_receiver() -> (String, Arc<Mutex<Vec<(String, bool)>>>) {
        let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
        let s = Arc::clone(&seen);
        let app = axum::Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let s = Arc::clone(&s);
                async move {
                    let valid = standardwebhooks::Webhook::new(DEV_WEBHOOK_SECRET)
                        .unwrap()
                        .verify(&body, &headers)
                        .is_ok();
                    let id = headers["webhook-id"].to_str().unwrap().to_owned();
                    let n = {
                        let mut s = lock(&s);
                        s.push((id, valid));
                        s.len()
                    };
                    if n <= 2 {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::NO_CONTENT
                    }
                }
            }),
        );
        (serve(app).await, seen)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_charge_emits_a_signed_event_retried_until_acknowledged_and_redeliverable() {
        let (receiver, seen) = flaky_receiver().await;
        let processor =
            serve(crate::processor::router(DEV_WEBHOOK_SECRET, Default::default()).unwrap()).await;
        register_receiver(processor.clone(), format!("{receiver}/hook")).await;
        let http = reqwest::Client::new();
        let charge = http
            .post(format!("{processor}/charges"))
            .header("idempotency-key", "k1")
            .json(
                &json!({"amount": 100, "currency": "usd", "source": "tok_visa",
                          "metadata": {"payment": "pay_1"}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(charge.status(), 201);
        // The ledger's replay of the same charge emits nothing new.
        let again = http
            .post(format!("{processor}/charges"))
            .header("idempotency-key", "k1")
            .json(&json!({"amount": 100, "currency": "usd", "source": "tok_visa"}))
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 201);
        let events = loop {
            let v: Value = http
                .get(format!("{processor}/events"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if v["events"][0]["delivered"] == true {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(events["events"].as_array().unwrap().len(), 1, "{events}");
        let event = &events["events"][0];
        assert_eq!(event["type"], "charge.succeeded");
        assert_eq!(event["payment"], "pay_1");
        assert_eq!(event["statuses"], json!([503, 503, 204]));
        let id = event["id"].as_str().unwrap().to_owned();
        {
            let seen = lock(&seen);
            assert_eq!(seen.len(), 3);
            // One id on every attempt, each attempt signed afresh and valid.
            assert!(seen.iter().all(|(i, valid)| *i == id && *valid), "{seen:?}");
        }
        let redelivered: Value = http
            .post(format!("{processor}/events/{id}/deliver"))
            .json(&json!({"copies": 5}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(redelivered["delivered"], 5, "{redelivered}");
        assert_eq!(
            redelivered["first_statuses"],
            json!([204, 204, 204, 204, 204])
        );
        assert_eq!(lock(&seen).len(), 8);
        let missing = http
            .post(format!("{processor}/events/evt_nope/deliver"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), 404);
        // A test event, then no receivers at all: it is retried, never acknowledged.
        let test: Value = http
            .post(format!("{processor}/events"))
            .json(&json!({"type": "ping", "data": {}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let test_id = test["id"].as_str().unwrap();
        assert!(test_id.starts_with("evt_") && test_id != id, "{test}");
        let forget = http
            .delete(format!("{processor}/webhook-endpoints"))
            .send()
            .await
            .unwrap();
        assert_eq!(forget.status(), 204);
        let unheard = http
            .post(format!("{processor}/events/{id}/deliver"))
            .json(&json!({"copies": 1}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        assert_eq!(unheard["delivered"], 0, "{unheard}");
        assert_eq!(unheard["attempts"], MAX_ATTEMPTS);
    }
}
