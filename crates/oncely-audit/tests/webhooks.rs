//! The audit against webhook receivers and against `PUT`/`DELETE` endpoints, over real sockets:
//!
//! - a Standard Webhooks receiver that checks, then inserts, the event id: flagged;
//! - Oncely's receiver (`StandardWebhooksLayer` + `IdempotencyLayer` keyed on `webhook-id`):
//!   passes, with every request signed afresh by the audit;
//! - a Stripe-style receiver keyed on the body's `/id`: passes;
//! - a `PUT` that appends and a `DELETE` that decrements: flagged by the method check; a `PUT`
//!   that sets: passes.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use http::Method;
use oncely_audit::audit::{
    self, AuditConfig, KeyPlacement, Status, Url, anti_patterns as ap, checks,
};
use oncely_core::{MemoryStore, Scope};
use oncely_tower::{IdempotencyLayer, KeySource, StandardWebhooksLayer, VerifiedWebhook};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECOND_SECRET: &str = "whsec_dGhlIG90aGVyIHNlbmRlcidzIDMyLWJ5dGUgc2VjcmV0IQ==";
/// How long applying one event takes.
const WORK: Duration = Duration::from_millis(60);

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The events a receiver applied, in order: (sender, event id, record id).
#[derive(Default, Clone)]
struct Applied(Arc<Mutex<Vec<(String, String, String)>>>);

impl Applied {
    /// Applies one event (after [`WORK`]): a new record `evt_N`.
    async fn apply(&self, sender: &str, event: &str) -> Value {
        tokio::time::sleep(WORK).await;
        let mut v = self.0.lock().unwrap();
        let id = format!("evt_{:06}", v.len() + 1);
        v.push((sender.to_owned(), event.to_owned(), id.clone()));
        json!({"id": id, "event": event, "sender": sender, "applied": true})
    }

    fn list(&self) -> Value {
        let v = self.0.lock().unwrap();
        Value::Array(
            v.iter()
                .map(|(s, e, id)| json!({"id": id, "sender": s, "event": e}))
                .collect(),
        )
    }
}

/// A receiver that verifies signatures correctly (the reference crate) but deduplicates by
/// looking the event id up, then inserting it after applying the event: concurrent
/// redeliveries all pass the look-up.
async fn check_then_insert_receiver() -> String {
    #[derive(Clone, Default)]
    struct S {
        applied: Applied,
        seen: Arc<Mutex<HashMap<(String, String), Value>>>,
    }
    async fn receive(State(s): State<S>, headers: HeaderMap, body: Bytes) -> Response {
        let mut sender = None;
        for (name, secret) in [("processor", SECRET), ("other", SECOND_SECRET)] {
            if standardwebhooks::Webhook::new(secret)
                .unwrap()
                .verify(&body, &headers)
                .is_ok()
            {
                sender = Some(name);
            }
        }
        let Some(sender) = sender else {
            return StatusCode::UNAUTHORIZED.into_response();
        };
        let id = headers["webhook-id"]
            .to_str()
            .unwrap_or_default()
            .to_owned();
        let key = (sender.to_owned(), id.clone());
        // The mistake: a look-up, then (much later) an insert.
        let known = s.seen.lock().unwrap().get(&key).cloned();
        if let Some(stored) = known {
            return axum::Json(stored).into_response();
        }
        let answer = s.applied.apply(sender, &id).await;
        s.seen.lock().unwrap().insert(key, answer.clone());
        axum::Json(answer).into_response()
    }
    let s = S::default();
    let list = s.applied.clone();
    serve(
        Router::new()
            .route("/webhooks/processor", post(receive))
            .route(
                "/events",
                get(move || async move { axum::Json(list.list()) }),
            )
            .with_state(s),
    )
    .await
}

/// Oncely's receiver: the signature checked before any claim, the key from `webhook-id`, the
/// scope the sender.
async fn oncely_receiver() -> String {
    let applied = Applied::default();
    let a = applied.clone();
    let receive = move |axum::Extension(event): axum::Extension<VerifiedWebhook>| {
        let a = a.clone();
        async move { axum::Json(a.apply(event.sender.as_str(), &event.id).await) }
    };
    serve(
        Router::new()
            .route("/webhooks/processor", post(receive))
            .layer(
                IdempotencyLayer::new(Arc::new(MemoryStore::new()))
                    .with_key_source(KeySource::header("webhook-id").unwrap()),
            )
            .layer(
                StandardWebhooksLayer::new()
                    .with_sender(Scope::new("processor"), SECRET)
                    .unwrap()
                    .with_sender(Scope::new("other"), SECOND_SECRET)
                    .unwrap(),
            )
            .route(
                "/events",
                get(move || async move { axum::Json(applied.list()) }),
            ),
    )
    .await
}

/// A Stripe-style receiver: the key is the event's `/id`, the scope the account named by
/// `Authorization: Bearer <account>` (a stand-in for a verified `Stripe-Signature`).
async fn body_keyed_receiver() -> String {
    async fn authenticate(mut req: Request, next: Next) -> Response {
        let account = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        if let Some(a) = account {
            req.extensions_mut().insert(Scope::new(a));
        }
        next.run(req).await
    }
    let applied = Applied::default();
    let a = applied.clone();
    let receive = move |axum::Extension(scope): axum::Extension<Scope>, body: String| {
        let a = a.clone();
        async move {
            let event: Value = serde_json::from_str(&body).unwrap();
            let id = event["id"].as_str().unwrap_or_default().to_owned();
            (
                StatusCode::OK,
                axum::Json(a.apply(scope.as_str(), &id).await),
            )
        }
    };
    serve(
        Router::new()
            .route("/webhooks/stripe", post(receive))
            .layer(
                IdempotencyLayer::new(Arc::new(MemoryStore::new()))
                    .with_key_source(KeySource::json_pointer("/id").unwrap()),
            )
            .route(
                "/events",
                get(move || async move { axum::Json(applied.list()) }),
            )
            .layer(middleware::from_fn(authenticate)),
    )
    .await
}

/// `PUT /logs/{id}` appends its entry (the mistake), `PUT /items/{id}` sets the item,
/// `DELETE /stock/{id}` decrements a counter (the mistake); each readable with `GET`.
async fn resources() -> String {
    type Db = Arc<Mutex<HashMap<String, Value>>>;
    async fn append(State(db): State<Db>, Path(id): Path<String>, body: String) -> Response {
        let mut db = db.lock().unwrap();
        let log = db.entry(format!("log/{id}")).or_insert_with(|| json!([]));
        log.as_array_mut()
            .unwrap()
            .push(serde_json::from_str(&body).unwrap_or(Value::Null));
        axum::Json(json!({"entries": log.as_array().unwrap().len()})).into_response()
    }
    async fn read_log(State(db): State<Db>, Path(id): Path<String>) -> Response {
        let db = db.lock().unwrap();
        axum::Json(db.get(&format!("log/{id}")).cloned().unwrap_or(json!([]))).into_response()
    }
    async fn set(State(db): State<Db>, Path(id): Path<String>, body: String) -> Response {
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        db.lock().unwrap().insert(format!("item/{id}"), v.clone());
        axum::Json(json!({"id": id, "item": v})).into_response()
    }
    async fn read_item(State(db): State<Db>, Path(id): Path<String>) -> Response {
        match db.lock().unwrap().get(&format!("item/{id}")) {
            Some(v) => axum::Json(json!({"id": id, "item": v})).into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        }
    }
    async fn decrement(State(db): State<Db>, Path(id): Path<String>) -> Response {
        let mut db = db.lock().unwrap();
        let n = db.entry(format!("stock/{id}")).or_insert(json!(100));
        *n = json!(n.as_i64().unwrap() - 1);
        StatusCode::NO_CONTENT.into_response()
    }
    async fn read_stock(State(db): State<Db>, Path(id): Path<String>) -> Response {
        let db = db.lock().unwrap();
        axum::Json(json!({"stock": db.get(&format!("stock/{id}")).cloned().unwrap_or(json!(100))}))
            .into_response()
    }
    serve(
        Router::new()
            .route("/logs/{id}", put(append).get(read_log))
            .route("/items/{id}", put(set).get(read_item))
            .route("/stock/{id}", get(read_stock).delete(decrement))
            .with_state(Db::default()),
    )
    .await
}

fn event() -> Value {
    json!({"type": "charge.succeeded", "data": {"id": "ch_00000001", "amount": 100, "currency": "usd"}})
}

fn webhook_config(base: &str) -> AuditConfig {
    let mut cfg = AuditConfig::new(
        Url::parse(base).unwrap(),
        Method::POST,
        "/webhooks/processor",
        event(),
    );
    cfg.key_placement = KeyPlacement::Header(http::HeaderName::from_static("webhook-id"));
    cfg.webhook_secret = Some(SECRET.into());
    cfg.second_webhook_secret = Some(SECOND_SECRET.into());
    cfg.count_url = Some("/events".into());
    cfg.timeout = Duration::from_secs(5);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_that_checks_then_inserts_the_event_id_is_flagged() {
    let base = check_then_insert_receiver().await;
    let mut cfg = webhook_config(&base);
    cfg.trials = 3;
    let report = audit::run(&cfg).await;
    let c = report.check(checks::CONCURRENCY).unwrap();
    assert_eq!(
        (c.status, c.anti_pattern),
        (Status::Fail, Some(ap::CHECK_THEN_INSERT_RACE)),
        "{}",
        report.render_text()
    );
    assert!(!report.passed());
    // Its signatures were verified: the audit's requests were signed, each one afresh.
    let replay = report.check(checks::REPLAY_FIDELITY).unwrap();
    assert_eq!(replay.status, Status::Pass, "{}", report.render_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oncely_s_standard_webhooks_receiver_passes() {
    let base = oncely_receiver().await;
    let cfg = webhook_config(&base);
    let report = audit::run(&cfg).await;
    assert!(report.passed(), "{}", report.render_text());
    for name in [
        checks::CONCURRENCY,
        checks::REPLAY_FIDELITY,
        checks::PAYLOAD_MISMATCH,
        checks::CANONICAL_JSON,
        checks::CROSS_SCOPE,
        checks::CLIENT_BYPASS,
        checks::MALFORMED_KEYS,
        checks::MISSING_KEY,
        checks::IN_FLIGHT,
    ] {
        assert_eq!(
            report.check(name).unwrap().status,
            Status::Pass,
            "{name}\n{}",
            report.render_text()
        );
    }
    let evidence = report
        .check(checks::REPLAY_FIDELITY)
        .unwrap()
        .evidence
        .join("\n");
    assert!(
        evidence.contains("webhook-id: \"oncely-audit-"),
        "{evidence}"
    );
    // Without the signature, the receiver refuses everything: the checks see no 2xx.
    let mut unsigned = webhook_config(&base);
    unsigned.webhook_secret = None;
    unsigned.second_webhook_secret = None;
    let report = audit::run(&unsigned).await;
    assert_eq!(
        report.check(checks::REPLAY_FIDELITY).unwrap().status,
        Status::Inconclusive,
        "{}",
        report.render_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_keyed_on_a_body_member_passes_with_the_key_there() {
    let base = body_keyed_receiver().await;
    let mut cfg = AuditConfig::new(
        Url::parse(&base).unwrap(),
        Method::POST,
        "/webhooks/stripe",
        json!({"id": "evt_placeholder", "type": "charge.succeeded", "data": {"amount": 100}}),
    );
    cfg.key_placement = KeyPlacement::JsonPointer("/id".into());
    cfg.auth = Some("Bearer acct_1".into());
    cfg.second_auth = Some("Bearer acct_2".into());
    cfg.count_url = Some("/events".into());
    cfg.timeout = Duration::from_secs(5);
    let report = audit::run(&cfg).await;
    assert!(report.passed(), "{}", report.render_text());
    for name in [
        checks::CONCURRENCY,
        checks::PAYLOAD_MISMATCH,
        checks::CANONICAL_JSON,
        checks::CROSS_SCOPE,
        checks::MALFORMED_KEYS,
        checks::MISSING_KEY,
    ] {
        assert_eq!(
            report.check(name).unwrap().status,
            Status::Pass,
            "{name}\n{}",
            report.render_text()
        );
    }
    // The key went into the body: each request its own, the repeated key as two members.
    let malformed = report
        .check(checks::MALFORMED_KEYS)
        .unwrap()
        .evidence
        .join("\n");
    assert!(malformed.contains(r#""id":"oncely-audit-"#), "{malformed}");
    assert!(malformed.contains("key at /id"), "{malformed}");
}

/// An audit of `METHOD path` on the resources fixture, the method check's verdict.
async fn method_check(
    method: Method,
    path: &str,
    body: Value,
) -> (Status, Option<&'static str>, String) {
    let base = resources().await;
    let mut cfg = AuditConfig::new(Url::parse(&base).unwrap(), method, path, body);
    cfg.trials = 1;
    cfg.concurrency = 2;
    cfg.timeout = Duration::from_secs(5);
    let report = audit::run(&cfg).await;
    let c = report.check(checks::METHOD_IDEMPOTENCY).unwrap();
    (
        c.status,
        c.anti_pattern,
        format!("{}\n{}", c.detail, c.evidence.join("\n")),
    )
}

#[tokio::test]
async fn a_put_that_appends_is_flagged_and_a_put_that_sets_passes() {
    let (status, anti, detail) =
        method_check(Method::PUT, "/logs/1", json!({"entry": "paid"})).await;
    assert_eq!(
        (status, anti),
        (Status::Fail, Some(ap::METHOD_NOT_IDEMPOTENT)),
        "{detail}"
    );
    assert!(
        detail.contains("the method promises idempotency; this endpoint is not"),
        "{detail}"
    );
    assert!(detail.contains("GET of the resource"), "{detail}");

    let (status, anti, detail) =
        method_check(Method::PUT, "/items/1", json!({"colour": "red"})).await;
    assert_eq!((status, anti), (Status::Pass, None), "{detail}");
}

#[tokio::test]
async fn a_delete_that_decrements_is_flagged() {
    let (status, anti, detail) = method_check(Method::DELETE, "/stock/1", Value::Null).await;
    assert_eq!(
        (status, anti),
        (Status::Fail, Some(ap::METHOD_NOT_IDEMPOTENT)),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_method_check_is_not_applicable_to_post() {
    let base = oncely_receiver().await;
    let report = audit::run(&webhook_config(&base)).await;
    assert_eq!(
        report.check(checks::METHOD_IDEMPOTENCY).unwrap().status,
        Status::NotApplicable
    );
}
