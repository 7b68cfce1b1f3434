//! Webhook receivers: real Standard Webhooks deliveries (signed with the `standardwebhooks`
//! crate, as a sender signs them) through `StandardWebhooksLayer` + `IdempotencyLayer` keyed on
//! `webhook-id`, on real stores; and a key read from the body by a JSON Pointer.
//!
//! The PostgreSQL cases read `ONCELY_TEST_POSTGRES_URL` and skip when it is unset.

mod common;

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use common::{Got, send};
use http::StatusCode;
use oncely_core::{IdempotencyKey, InFlightBehavior, KeyStore, Policy, RecordKey, Scope};
use oncely_tower::{IdempotencyLayer, KeySource, StandardWebhooksLayer, VerifiedWebhook};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER_SECRET: &str = "whsec_dGhlIG90aGVyIHNlbmRlcidzIDMyLWJ5dGUgc2VjcmV0IQ==";
const EVENT: &str = r#"{"type":"charge.succeeded","data":{"id":"ch_00000001","amount":100}}"#;

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A delivery of `body` as event `id`, signed with `secret` at `timestamp` (seconds).
fn delivery(secret: &str, id: &str, timestamp: i64, body: &str) -> http::Request<Body> {
    let signature = standardwebhooks::Webhook::new(secret)
        .unwrap()
        .sign(id, timestamp, body.as_bytes())
        .unwrap();
    http::Request::post("/webhooks/processor")
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// The receiver: applies each event once (counted in `effects`) and answers `200` with the
/// effect's sequence number and the sender it came from.
fn receiver(store: Arc<dyn KeyStore>, effects: Arc<AtomicU64>, policy: Policy) -> Router {
    let handler = move |Extension(event): Extension<VerifiedWebhook>, body: String| {
        let effects = effects.clone();
        async move {
            // Slow enough that concurrent duplicates overlap the first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(body.contains("charge.succeeded"));
            format!(
                r#"{{"applied":{n},"sender":"{}","id":"{}"}}"#,
                event.sender, event.id
            )
        }
    };
    Router::new()
        .route("/webhooks/processor", post(handler))
        .layer(
            IdempotencyLayer::new(store)
                .with_policy(policy)
                .with_key_source(KeySource::header("webhook-id").unwrap()),
        )
        .layer(
            StandardWebhooksLayer::new()
                .with_sender(Scope::new("processor"), SECRET)
                .unwrap()
                .with_sender(Scope::new("other"), OTHER_SECRET)
                .unwrap(),
        )
}

fn sqlite_store(dir: &tempfile::TempDir) -> impl std::future::Future<Output = Arc<dyn KeyStore>> {
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("oncely.db").display()
    );
    async move {
        Arc::new(oncely_sqlite::SqliteStore::connect(&url).await.unwrap()) as Arc<dyn KeyStore>
    }
}

fn record_key(sender: &str, id: &str) -> RecordKey {
    RecordKey::new(Scope::new(sender), IdempotencyKey::new(id).unwrap())
}

fn unique(tag: &str) -> String {
    format!("msg_{tag}_{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn a_valid_delivery_runs_once_and_a_redelivery_replays_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir).await;
    let effects = Arc::new(AtomicU64::new(0));
    let app = receiver(store.clone(), effects.clone(), Policy::default());
    let id = unique("valid");

    let first = send(&app, delivery(SECRET, &id, now_secs(), EVENT)).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(first.json()["sender"], "processor");
    assert_eq!(first.json()["id"], id.as_str());
    assert!(!first.replayed());
    // The sender's retry: same id and body, a fresh timestamp and signature.
    let retry = send(&app, delivery(SECRET, &id, now_secs() - 30, EVENT)).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    // Scoped by the sender: the record is under (processor, id).
    assert!(
        store
            .get(&record_key("processor", &id))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .get(&record_key("other", &id))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_tampered_or_unsigned_delivery_is_401_and_claims_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir).await;
    let effects = Arc::new(AtomicU64::new(0));
    let app = receiver(store.clone(), effects.clone(), Policy::default());
    let id = unique("tampered");

    // The body changed after signing.
    let mut req = delivery(SECRET, &id, now_secs(), EVENT);
    *req.body_mut() = Body::from(EVENT.replace("100", "100000"));
    let got = send(&app, req).await;
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert_eq!(got.code(), "webhook_signature_invalid");
    // RFC 9110 section 11.6.1: a 401 carries a challenge.
    assert_eq!(got.headers["www-authenticate"], "Standard-Webhooks");
    // The id changed after signing (a forged key for a genuine body).
    let mut req = delivery(SECRET, &id, now_secs(), EVENT);
    req.headers_mut()
        .insert("webhook-id", "msg_forged".parse().unwrap());
    assert_eq!(send(&app, req).await.code(), "webhook_signature_invalid");
    // A secret no sender has.
    let stranger = "whsec_c3RyYW5nZXIgc2VjcmV0IG9mIDMyIGJ5dGVzIQ==";
    let got = send(&app, delivery(stranger, &id, now_secs(), EVENT)).await;
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert_eq!(got.headers["www-authenticate"], "Standard-Webhooks");
    // No signature at all.
    let mut req = delivery(SECRET, &id, now_secs(), EVENT);
    req.headers_mut().remove("webhook-signature");
    let got = send(&app, req).await;
    assert_eq!(got.status, StatusCode::UNAUTHORIZED);
    assert_eq!(got.headers["www-authenticate"], "Standard-Webhooks");
    // No id: the signature layer refuses it before the key source could.
    let mut req = delivery(SECRET, &id, now_secs(), EVENT);
    req.headers_mut().remove("webhook-id");
    let got = send(&app, req).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert_eq!(got.code(), "webhook_headers_invalid");
    assert!(
        !got.headers.contains_key("www-authenticate"),
        "only a 401 has one"
    );
    // A repeated id (the claim could use another id than the signed one).
    let mut req = delivery(SECRET, &id, now_secs(), EVENT);
    req.headers_mut()
        .append("webhook-id", "msg_other".parse().unwrap());
    assert_eq!(send(&app, req).await.code(), "webhook_headers_invalid");

    assert_eq!(effects.load(Ordering::SeqCst), 0);
    for scope in ["processor", "other"] {
        for key in [id.as_str(), "msg_forged", "msg_other"] {
            assert!(
                store.get(&record_key(scope, key)).await.unwrap().is_none(),
                "{scope}/{key} was claimed"
            );
        }
    }
    // The genuine delivery still runs: nothing was occupied by the forgeries.
    let got = send(&app, delivery(SECRET, &id, now_secs(), EVENT)).await;
    assert_eq!(got.status, StatusCode::OK);
    assert!(!got.replayed());
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_replayed_stale_or_future_delivery_is_400_and_claims_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir).await;
    let effects = Arc::new(AtomicU64::new(0));
    let app = receiver(store.clone(), effects.clone(), Policy::default());
    let id = unique("stale");

    // A captured delivery replayed 10 minutes later: its signature is genuine, its timestamp
    // outside the 5-minute tolerance.
    for ts in [now_secs() - 600, now_secs() + 600] {
        let got = send(&app, delivery(SECRET, &id, ts, EVENT)).await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{got:?}");
        assert_eq!(got.code(), "webhook_timestamp_out_of_tolerance");
    }
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    assert!(
        store
            .get(&record_key("processor", &id))
            .await
            .unwrap()
            .is_none()
    );
}

/// The tolerance is checked against the layer's clock, the store's, not the system clock: with
/// one clock an hour ahead of the system's and one an hour behind, a delivery signed at the
/// clock's "now" (and up to 300 seconds either side of it) is applied, and one signed at the
/// system's now is refused as out of tolerance.
#[tokio::test]
async fn the_timestamp_tolerance_follows_the_stores_clock_ahead_or_behind() {
    for skew in [3600, -3600] {
        let clock = oncely_core::ManualClock::new((now_secs() + skew) * 1000);
        let store: Arc<dyn KeyStore> = Arc::new(oncely_core::MemoryStore::with_clock(Arc::new(
            clock.clone(),
        )));
        let effects = Arc::new(AtomicU64::new(0));
        let app = Router::new()
            .route(
                "/webhooks/processor",
                post({
                    let effects = effects.clone();
                    move || async move {
                        effects.fetch_add(1, Ordering::SeqCst);
                        StatusCode::NO_CONTENT
                    }
                }),
            )
            .layer(
                IdempotencyLayer::new(store)
                    .with_clock(clock.clone())
                    .with_key_source(KeySource::header("webhook-id").unwrap()),
            )
            .layer(
                StandardWebhooksLayer::new()
                    .with_sender(Scope::new("processor"), SECRET)
                    .unwrap()
                    .with_clock(Arc::new(clock.clone())),
            );
        let clock_now = oncely_core::Clock::now_millis(&clock).div_euclid(1000);
        for (ts, applied) in [
            (clock_now, true),
            (clock_now - 300, true),
            (clock_now + 300, true),
            (clock_now - 301, false),
            (clock_now + 301, false),
            // The system's now is an hour away from the store's.
            (now_secs(), false),
        ] {
            let before = effects.load(Ordering::SeqCst);
            let got = send(&app, delivery(SECRET, &unique("clock"), ts, EVENT)).await;
            if applied {
                assert_eq!(
                    got.status,
                    StatusCode::NO_CONTENT,
                    "skew {skew}, ts {ts}: {got:?}"
                );
                assert_eq!(effects.load(Ordering::SeqCst), before + 1);
            } else {
                assert_eq!(
                    got.status,
                    StatusCode::BAD_REQUEST,
                    "skew {skew}, ts {ts}: {got:?}"
                );
                assert_eq!(got.code(), "webhook_timestamp_out_of_tolerance");
                assert_eq!(effects.load(Ordering::SeqCst), before);
            }
        }
        // The clock moves, and the tolerance with it: a delivery signed 400 seconds before the
        // store's "now" is refused, then applied once the clock is moved back 200 seconds.
        let old = clock_now - 400;
        let id = unique("moved");
        let got = send(&app, delivery(SECRET, &id, old, EVENT)).await;
        assert_eq!(got.code(), "webhook_timestamp_out_of_tolerance");
        clock.set((clock_now - 200) * 1000);
        let got = send(&app, delivery(SECRET, &id, old, EVENT)).await;
        assert_eq!(got.status, StatusCode::NO_CONTENT, "{got:?}");
    }
}

#[tokio::test]
async fn the_same_event_id_from_two_senders_is_two_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir).await;
    let effects = Arc::new(AtomicU64::new(0));
    let app = receiver(store, effects.clone(), Policy::default());
    let id = unique("two-senders");
    let a = send(&app, delivery(SECRET, &id, now_secs(), EVENT)).await;
    let b = send(&app, delivery(OTHER_SECRET, &id, now_secs(), EVENT)).await;
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(a.json()["sender"], "processor");
    assert_eq!(b.json()["sender"], "other");
    assert!(!b.replayed());
    assert_eq!(effects.load(Ordering::SeqCst), 2);
}

/// `tasks` concurrent deliveries of one event (each signed afresh, as a sender's concurrent
/// retries are), then counts: exactly one effect, every answer the same `200`.
async fn storm(store: Arc<dyn KeyStore>, tasks: usize) {
    let effects = Arc::new(AtomicU64::new(0));
    let policy = Policy::default().with_in_flight(InFlightBehavior::Wait {
        max: Duration::from_secs(10),
        poll: Duration::from_millis(20),
    });
    let app = receiver(store.clone(), effects.clone(), policy);
    let id = unique("storm");
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut handles = Vec::new();
    for i in 0..tasks {
        let (app, id, start) = (app.clone(), id.clone(), start.clone());
        handles.push(tokio::spawn(async move {
            let req = delivery(SECRET, &id, now_secs() - (i % 5) as i64, EVENT);
            start.wait().await;
            send(&app, req).await
        }));
    }
    let mut answers: Vec<Got> = Vec::new();
    for h in handles {
        answers.push(h.await.unwrap());
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1, "effects");
    let first = answers
        .iter()
        .find(|g| !g.replayed())
        .expect("one original");
    assert_eq!(answers.iter().filter(|g| !g.replayed()).count(), 1);
    for g in &answers {
        assert_eq!(g.status, StatusCode::OK, "{g:?}");
        assert_eq!(g.body, first.body);
    }
    assert_eq!(first.json()["applied"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_deliveries_of_one_event_apply_it_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    storm(sqlite_store(&dir).await, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_deliveries_of_one_event_apply_it_once_on_postgres() {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
        return;
    };
    let store = oncely_postgres::PostgresStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    storm(Arc::new(store), 50).await;
}

/// A Stripe-style receiver: the key is the event's `id` member, the scope the account the
/// (stand-in) authentication found.
#[tokio::test]
async fn a_key_read_by_json_pointer_follows_the_key_rules() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir).await;
    let effects = Arc::new(AtomicU64::new(0));
    let counted = effects.clone();
    let routes = Router::new().route(
        "/webhooks/stripe",
        post(move |body: String| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move { (StatusCode::CREATED, format!("{n}:{}", body.len())) }
        }),
    );
    let layer = IdempotencyLayer::new(store.clone())
        .with_key_source(KeySource::json_pointer("/id").unwrap());
    let app = common::app(layer, routes);
    let post =
        |account: &str, body: &str| common::post_req("/webhooks/stripe", account, None, body);
    let evt = uuid::Uuid::new_v4().simple().to_string();
    let body = format!(r#"{{"id":"evt_{evt}","type":"charge.succeeded","data":{{"amount":1}}}}"#);

    let first = send(&app, post("acct_1", &body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // The same event with its members reordered: the same request (RFC 8785), replayed.
    let reordered =
        format!(r#"{{"data":{{"amount":1}},"type":"charge.succeeded","id":"evt_{evt}"}}"#);
    let again = send(&app, post("acct_1", &reordered)).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    // Another account's event with the same id is its own.
    let other = send(&app, post("acct_2", &body)).await;
    assert!(!other.replayed());
    // The same id with another body: a mismatch, never a replay.
    let changed = body.replace("\"amount\":1", "\"amount\":2");
    assert_eq!(
        send(&app, post("acct_1", &changed)).await.code(),
        "idempotency_key_mismatch"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 2);
    assert!(
        store
            .get(&record_key("acct_1", &format!("evt_{evt}")))
            .await
            .unwrap()
            .is_some()
    );

    // Missing, not a string, invalid, not JSON, ambiguous: refused, nothing runs.
    let cases: [(&str, &str, &str); 5] = [
        (
            r#"{"type":"x"}"#,
            "idempotency_key_missing",
            "the JSON body member at /id",
        ),
        (r#"{"id":42}"#, "idempotency_key_invalid", "is a number"),
        (
            r#"{"id":"evt 1"}"#,
            "idempotency_key_invalid",
            "not visible ASCII",
        ),
        (
            "id=evt_1",
            "idempotency_body_not_canonicalizable",
            "not I-JSON",
        ),
        (
            r#"{"id":"a","id":"b"}"#,
            "idempotency_body_not_canonicalizable",
            "not I-JSON",
        ),
    ];
    for (body, code, says) in cases {
        let got = send(&app, post("acct_1", body)).await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(got.code(), code, "{body}");
        let detail = got.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(says), "{body}: {detail}");
    }
    assert_eq!(effects.load(Ordering::SeqCst), 2);
}

/// Another header (GitHub's `X-GitHub-Delivery`): sent once, by the key rules.
#[tokio::test]
async fn a_key_read_from_another_header_follows_the_key_rules() {
    let effects = Arc::new(AtomicU64::new(0));
    let counted = effects.clone();
    let routes = Router::new().route(
        "/webhooks/github",
        post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::ACCEPTED }
        }),
    );
    let layer = IdempotencyLayer::new(Arc::new(oncely_core::MemoryStore::new()))
        .with_key_source(KeySource::header("X-GitHub-Delivery").unwrap());
    let app = common::app(layer, routes);
    let req = |delivery: &[&str]| {
        let mut r = common::post_req("/webhooks/github", "repo_1", None, r#"{"action":"opened"}"#);
        for d in delivery {
            r.headers_mut()
                .append("x-github-delivery", d.parse().unwrap());
        }
        r
    };
    let id = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    assert_eq!(send(&app, req(&[id])).await.status, StatusCode::ACCEPTED);
    assert!(send(&app, req(&[id])).await.replayed());
    // The Idempotency-Key header is not this route's key.
    let mut only_std = req(&[]);
    only_std
        .headers_mut()
        .insert("idempotency-key", "k1".parse().unwrap());
    let got = send(&app, only_std).await;
    assert_eq!(got.code(), "idempotency_key_missing");
    assert!(
        got.json()["detail"]
            .as_str()
            .unwrap()
            .contains("x-github-delivery")
    );
    let got = send(&app, req(&[id, id])).await;
    assert_eq!(got.code(), "idempotency_key_invalid");
    assert!(
        got.json()["detail"]
            .as_str()
            .unwrap()
            .contains("sent 2 times")
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}
