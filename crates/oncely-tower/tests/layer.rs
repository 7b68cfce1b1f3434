//! The layer's behaviour through an axum `Router`, on the real `MemoryStore` (and on store
//! wrappers for the failure cases), one request at a time with `oneshot`.

mod common;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Router};
use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body::Frame;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, FencingToken, IdempotencyKey, KeyStore, MemoryStore, Policy,
    RecordKey, RecordState, Scope, StatusProfile, StoredResponse,
};
use oncely_tower::{HandlerOutcome, IdempotencyContext, IdempotencyLayer};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A handler that counts its calls and echoes the scope, the body and the call number, with a
/// multi-valued header and a cookie.
fn counting_routes(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/v1/orders",
        post(move |ctx: IdempotencyContext, body: String| {
            let calls = Arc::clone(&calls);
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let mut res = (
                    StatusCode::CREATED,
                    format!(
                        r#"{{"scope":"{}","request":{},"call":{n}}}"#,
                        ctx.id().scope,
                        body
                    ),
                )
                    .into_response();
                let h = res.headers_mut();
                h.insert("content-type", "application/json".parse().unwrap());
                h.append("x-multi", "first".parse().unwrap());
                h.append("set-cookie", "session=secret".parse().unwrap());
                h.append("x-multi", "second".parse().unwrap());
                h.insert("location", format!("/v1/orders/{n}").parse().unwrap());
                res
            }
        }),
    )
}

fn setup() -> (Router, Arc<AtomicUsize>, Arc<MemoryStore>, IdempotencyLayer) {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(store.clone());
    let app = app(layer.clone(), counting_routes(calls.clone()));
    (app, calls, store, layer)
}

#[tokio::test]
async fn first_request_runs_and_the_retry_replays_it_verbatim() {
    let (app, calls, _, layer) = setup();
    let first = send(
        &app,
        post_req("/v1/orders", "acct_a", Some("k1"), r#"{"sku":"A"}"#),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    // The first caller gets the original response whole, cookie included.
    assert_eq!(first.headers["set-cookie"], "session=secret");

    let retry = send(
        &app,
        post_req("/v1/orders", "acct_a", Some("k1"), r#"{"sku":"A"}"#),
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.body, first.body, "byte-identical body");
    assert_eq!(
        &retry.body[..],
        br#"{"scope":"acct_a","request":{"sku":"A"},"call":1}"#
    );
    assert!(retry.replayed());
    let multi: Vec<_> = retry.headers.get_all("x-multi").iter().collect();
    assert_eq!(multi, vec!["first", "second"], "multi-valued, in order");
    assert_eq!(retry.headers["location"], "/v1/orders/1");
    assert_eq!(retry.headers["content-type"], "application/json");
    assert!(
        retry.headers.get("set-cookie").is_none(),
        "never replay a cookie"
    );

    let m = layer.metrics().snapshot();
    assert_eq!((m.claims, m.replays, m.store_errors), (1, 1, 0));
}

#[tokio::test]
async fn same_key_different_body_is_422_and_never_the_stored_body() {
    // docs/DESIGN.md, "Validation skipped on one path".
    let (app, calls, _, layer) = setup();
    let body1 = r#"{"ref":"X","accounts":[{"id":"12345"}]}"#;
    let body2 = r#"{"ref":"X","accounts":[{"id":"54321"}]}"#;
    let first = send(&app, post_req("/v1/orders", "acct_a", Some("k"), body1)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send(&app, post_req("/v1/orders", "acct_a", Some("k"), body2)).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.code(), "idempotency_key_mismatch");
    assert_eq!(other.json()["retryable"], false);
    assert!(other.headers.get("retry-after").is_none());
    assert!(!String::from_utf8_lossy(&other.body).contains("12345"));
    // A different query string is a different request too.
    let q = send(
        &app,
        post_req("/v1/orders?dry_run=1", "acct_a", Some("k"), body1),
    )
    .await;
    assert_eq!(q.code(), "idempotency_key_mismatch");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.metrics().snapshot().mismatches, 2);
}

#[tokio::test]
async fn reordered_and_reformatted_json_replays() {
    // docs/DESIGN.md, "Serializer differences": JSON is compared canonically (RFC 8785); arrays stay order-sensitive.
    let (app, calls, _, _) = setup();
    let first = send(
        &app,
        post_req("/v1/orders", "acct_a", Some("k"), r#"{"a":1,"b":[1,2]}"#),
    )
    .await;
    let retry = send(
        &app,
        post_req(
            "/v1/orders",
            "acct_a",
            Some("k"),
            "{ \"b\": [1, 2],\n  \"a\": 1 }",
        ),
    )
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    let arrays = send(
        &app,
        post_req("/v1/orders", "acct_a", Some("k"), r#"{"a":1,"b":[2,1]}"#),
    )
    .await;
    assert_eq!(arrays.code(), "idempotency_key_mismatch");
}

/// The correctness hole closed by docs/DESIGN.md, "JSON bodies and the I-JSON rule":
/// `{"amount":1,"amount":5000}` and `{"amount":5000}` used to share a fingerprint (the tree kept
/// the last value), so a retry whose body a first-wins parser reads as amount 1 was handed the
/// stored response of the amount-5000 request. A body with a repeated member name is now refused
/// with its own 400 before any claim, for either value, and never replays; nothing in the store
/// changes.
#[tokio::test]
async fn duplicate_member_names_are_400_before_any_claim_and_never_a_replay() {
    let (app, calls, store, layer) = setup();
    let first = send(
        &app,
        post_req(
            "/v1/orders",
            "acct_a",
            Some("k"),
            r#"{"amount":5000,"sku":"A"}"#,
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let id = RecordKey::new(Scope::new("acct_a"), IdempotencyKey::new("k").unwrap());
    let before = store.get(&id).await.unwrap().unwrap();
    for body in [
        r#"{"amount":1,"amount":5000,"sku":"A"}"#,
        r#"{"amount":5000,"amount":1,"sku":"A"}"#,
        r#"{"amount":5000,"sku":"A","\u0061mount":5000}"#,
    ] {
        let dup = send(&app, post_req("/v1/orders", "acct_a", Some("k"), body)).await;
        assert_eq!(dup.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(dup.code(), "idempotency_body_not_canonicalizable");
        assert_eq!(dup.json()["retryable"], false);
        assert!(
            dup.json()["detail"]
                .as_str()
                .unwrap()
                .contains("two members with the same name"),
            "{:?}",
            dup.json()
        );
        assert!(!dup.replayed());
        assert!(!String::from_utf8_lossy(&dup.body).contains("\"call\""));
    }
    // A fresh key with a duplicate is refused too, and is never claimed.
    let fresh = send(
        &app,
        post_req("/v1/orders", "acct_a", Some("k2"), r#"{"a":1,"a":1}"#),
    )
    .await;
    assert_eq!(fresh.code(), "idempotency_body_not_canonicalizable");
    let k2 = RecordKey::new(Scope::new("acct_a"), IdempotencyKey::new("k2").unwrap());
    assert!(store.get(&k2).await.unwrap().is_none(), "no claim was made");
    // Lone surrogates likewise.
    let got = send(
        &app,
        post_req("/v1/orders", "acct_a", Some("k3"), r#"{"sku":"\ud800"}"#),
    )
    .await;
    assert_eq!(got.code(), "idempotency_body_not_canonicalizable");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(store.get(&id).await.unwrap().unwrap(), before);
    let m = layer.metrics().snapshot();
    assert_eq!((m.claims, m.replays, m.mismatches), (1, 0, 0));
    assert_eq!(m.body_not_canonicalizable, 5);
    // The original body still replays.
    let retry = send(
        &app,
        post_req(
            "/v1/orders",
            "acct_a",
            Some("k"),
            r#"{"sku":"A","amount":5000}"#,
        ),
    )
    .await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
}

/// A 64-bit id beyond 2^53 (no double carries it) is fingerprinted by its digits
/// (docs/DESIGN.md, "Large numbers"): the request runs, a byte-identical or reordered retry
/// replays, and a retry that spells the same number otherwise, or writes its nearest double
/// (`9007199254740992` for `9007199254740993`, the one RFC 8785 alone would hash), is a
/// mismatch, never a replay.
#[tokio::test]
async fn a_64_bit_id_runs_replays_and_a_respelled_one_is_a_mismatch() {
    let (app, calls, _, layer) = setup();
    for (key, body, others) in [
        (
            "big",
            r#"{"customer_id":12345678901234567890,"amount":100}"#,
            &[
                r#"{"customer_id":1.2345678901234567890e19,"amount":100}"#,
                r#"{"customer_id":12345678901234567000,"amount":100}"#,
                r#"{"customer_id":12345678901234567891,"amount":100}"#,
            ][..],
        ),
        (
            "next",
            r#"{"customer_id":9007199254740993}"#,
            &[
                r#"{"customer_id":9007199254740992}"#,
                r#"{"customer_id":9007199254740993.0}"#,
            ][..],
        ),
        (
            "long",
            r#"{"rate":0.1000000000000000000001}"#,
            &[r#"{"rate":0.1}"#][..],
        ),
    ] {
        let before = calls.load(Ordering::SeqCst);
        let first = send(&app, post_req("/v1/orders", "acct_a", Some(key), body)).await;
        assert_eq!(first.status, StatusCode::CREATED, "{body}: {first:?}");
        assert_eq!(calls.load(Ordering::SeqCst), before + 1, "{body}");
        // The handler saw the digits as sent.
        let digits = body.split([':', ',', '}']).nth(1).unwrap();
        assert!(
            String::from_utf8_lossy(&first.body).contains(digits),
            "{body}"
        );
        let retry = send(&app, post_req("/v1/orders", "acct_a", Some(key), body)).await;
        assert!(retry.replayed(), "{body}");
        assert_eq!(retry.body, first.body);
        let spaced = body.replace(':', " : ").replace(',', " ,\n ");
        let retry = send(&app, post_req("/v1/orders", "acct_a", Some(key), &spaced)).await;
        assert!(retry.replayed(), "{spaced}");
        for other in others {
            let got = send(&app, post_req("/v1/orders", "acct_a", Some(key), other)).await;
            assert_eq!(got.status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
            assert_eq!(got.code(), "idempotency_key_mismatch", "{other}");
            assert!(!got.replayed());
        }
        assert_eq!(calls.load(Ordering::SeqCst), before + 1, "{body}");
    }
    let m = layer.metrics().snapshot();
    assert_eq!(
        (
            m.claims,
            m.replays,
            m.mismatches,
            m.body_not_canonicalizable
        ),
        (3, 6, 6, 0)
    );
}

#[tokio::test]
async fn same_key_in_two_scopes_runs_twice_independently() {
    // docs/DESIGN.md, "Keys shared across tenants".
    let (app, calls, _, _) = setup();
    let a = send(
        &app,
        post_req(
            "/v1/orders",
            "tenant_a",
            Some("chat:123:1"),
            r#"{"who":"A"}"#,
        ),
    )
    .await;
    let b = send(
        &app,
        post_req(
            "/v1/orders",
            "tenant_b",
            Some("chat:123:1"),
            r#"{"who":"B"}"#,
        ),
    )
    .await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "two independent executions"
    );
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!b.replayed());
    assert_eq!(
        &b.body[..],
        br#"{"scope":"tenant_b","request":{"who":"B"},"call":2}"#
    );
    assert!(!String::from_utf8_lossy(&b.body).contains("tenant_a"));
    // Each scope replays its own response.
    let a2 = send(
        &app,
        post_req(
            "/v1/orders",
            "tenant_a",
            Some("chat:123:1"),
            r#"{"who":"A"}"#,
        ),
    )
    .await;
    let b2 = send(
        &app,
        post_req(
            "/v1/orders",
            "tenant_b",
            Some("chat:123:1"),
            r#"{"who":"B"}"#,
        ),
    )
    .await;
    assert_eq!((a2.body.clone(), b2.body.clone()), (a.body, b.body));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn missing_and_malformed_keys_are_400_and_nothing_runs() {
    let (app, calls, _, layer) = setup();
    let missing = send(&app, post_req("/v1/orders", "acct_a", None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.code(), "idempotency_key_missing");
    assert_eq!(missing.json()["retryable"], false);

    let mut repeated = post_req("/v1/orders", "acct_a", Some("k1"), "{}");
    repeated
        .headers_mut()
        .append("idempotency-key", "k1".parse().unwrap());
    let long = "k".repeat(256);
    let mut non_ascii = post_req("/v1/orders", "acct_a", None, "{}");
    non_ascii.headers_mut().insert(
        "idempotency-key",
        http::HeaderValue::from_bytes("caf\u{e9}".as_bytes()).unwrap(),
    );
    for req in [
        repeated,
        post_req("/v1/orders", "acct_a", Some(""), "{}"),
        post_req("/v1/orders", "acct_a", Some(&long), "{}"),
        post_req("/v1/orders", "acct_a", Some("a b"), "{}"),
        post_req("/v1/orders", "acct_a", Some("\"unbalanced"), "{}"),
        non_ascii,
    ] {
        let got = send(&app, req).await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST);
        assert_eq!(got.code(), "idempotency_key_invalid");
    }
    // The quoted structured-field form is accepted and unquoted: "k2" and k2 are one key.
    let quoted = send(&app, post_req("/v1/orders", "acct_a", Some("\"k2\""), "{}")).await;
    let bare = send(&app, post_req("/v1/orders", "acct_a", Some("k2"), "{}")).await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    assert!(bare.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let m = layer.metrics().snapshot();
    assert_eq!((m.key_missing, m.key_invalid), (1, 6));
}

#[tokio::test]
async fn every_status_profile_maps_the_codes() {
    for (profile, mismatch) in [
        (StatusProfile::Ietf, 422),
        (StatusProfile::Stripe, 400),
        (StatusProfile::Resend, 409),
    ] {
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
            .with_policy(Policy::default().with_profile(profile));
        let app = app(layer, counting_routes(calls));
        send(&app, post_req("/v1/orders", "a", Some("k"), r#"{"n":1}"#)).await;
        let m = send(&app, post_req("/v1/orders", "a", Some("k"), r#"{"n":2}"#)).await;
        assert_eq!(m.status.as_u16(), mismatch, "{profile:?}");
        assert_eq!(m.code(), "idempotency_key_mismatch");
        let missing = send(&app, post_req("/v1/orders", "a", None, "{}")).await;
        assert_eq!(missing.status.as_u16(), 400);
        assert_eq!(missing.code(), "idempotency_key_missing");
        let noscope = send(
            &app,
            http::Request::post("/v1/orders")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(noscope.status.as_u16(), 401);
        assert_eq!(noscope.code(), "idempotency_scope_missing");

        let failing = IdempotencyLayer::new(Arc::new(FaultStore::new(
            MemoryStore::new(),
            Fault::FailAll,
        )))
        .with_policy(Policy::default().with_profile(profile));
        let down = app_with(failing);
        let got = send(&down, post_req("/v1/orders", "a", Some("k"), "{}")).await;
        assert_eq!(got.status.as_u16(), 503);
        assert_eq!(got.code(), "idempotency_store_unavailable");
    }
}

fn app_with(layer: IdempotencyLayer) -> Router {
    app(layer, counting_routes(Arc::new(AtomicUsize::new(0))))
}

#[tokio::test]
async fn safe_methods_pass_through_untouched_and_optional_keys_are_optional() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c1 = calls.clone();
    let c2 = calls.clone();
    let routes = Router::new()
        .route(
            "/v1/things",
            get(move |ctx: Option<IdempotencyContext>| {
                let c = c1.clone();
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    format!("get claimed={}", ctx.is_some())
                }
            }),
        )
        .route(
            "/v1/things/1",
            put(move |ctx: Option<IdempotencyContext>| {
                let c = c2.clone();
                async move {
                    let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                    format!("put claimed={} call={n}", ctx.is_some())
                }
            }),
        );
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
    let metrics = layer.metrics();
    let app = app(layer, routes);
    let get_req = |key: Option<&str>| {
        let mut b = http::Request::get("/v1/things").header("x-account", "a");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(Body::empty()).unwrap()
    };
    // GET ignores keys, even malformed or repeated ones, and even without a scope.
    for _ in 0..2 {
        let g = send(&app, get_req(Some("k"))).await;
        assert_eq!(&g.body[..], b"get claimed=false");
        assert!(!g.replayed());
    }
    let g = send(&app, get_req(Some(""))).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let put_req = |key: Option<&str>| {
        let mut b = http::Request::put("/v1/things/1").header("x-account", "a");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(Body::empty()).unwrap()
    };
    let p1 = send(&app, put_req(None)).await;
    let p2 = send(&app, put_req(None)).await;
    assert_eq!(&p1.body[..], b"put claimed=false call=4");
    assert_eq!(&p2.body[..], b"put claimed=false call=5");
    let p3 = send(&app, put_req(Some("pk"))).await;
    let p4 = send(&app, put_req(Some("pk"))).await;
    assert_eq!(&p3.body[..], b"put claimed=true call=6");
    assert!(p4.replayed());
    assert_eq!(p4.body, p3.body);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    assert_eq!(metrics.snapshot().claims, 1);
}

#[tokio::test]
async fn oversized_request_bodies_are_413_and_nothing_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
        .with_policy(Policy::default().with_max_request_bytes(16));
    let metrics = layer.metrics();
    let app = app(layer, counting_routes(calls.clone()));
    // Declared length.
    let got = send(
        &app,
        post_req("/v1/orders", "a", Some("k"), &"x".repeat(17)),
    )
    .await;
    assert_eq!(got.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(got.code(), "idempotency_request_too_large");
    // A stream with no declared length.
    let chunks = futures::stream::iter(
        ["0123456789", "0123456789"]
            .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c.as_bytes()))),
    );
    let req = http::Request::post("/v1/orders")
        .header("x-account", "a")
        .header("idempotency-key", "k")
        .body(Body::from_stream(chunks))
        .unwrap();
    let got = send(&app, req).await;
    assert_eq!(got.code(), "idempotency_request_too_large");
    // Exactly at the limit is fine (a JSON string of 16 bytes).
    let ok = send(
        &app,
        post_req(
            "/v1/orders",
            "a",
            Some("k"),
            &format!("\"{}\"", "a".repeat(14)),
        ),
    )
    .await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(metrics.snapshot().claims, 1);
}

#[tokio::test]
async fn credentials_never_enter_the_fingerprint_but_configured_headers_do() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(store.clone()).with_fingerprint_headers(vec![
        http::HeaderName::from_static("x-api-version"),
        http::header::AUTHORIZATION, // ignored: credentials never take part
    ]);
    // The handler reads its own record while it runs: the stored request lives only while the
    // record is in flight (completion drops it).
    let seen = Arc::new(std::sync::Mutex::new(None));
    let (c, s) = (calls.clone(), seen.clone());
    let routes = Router::new().route(
        "/v1/orders",
        post(move |ctx: IdempotencyContext| {
            let (c, s) = (c.clone(), s.clone());
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                let rec = ctx.claim().store().get(ctx.id()).await.unwrap().unwrap();
                *s.lock().unwrap() = rec.request;
                (StatusCode::CREATED, "created")
            }
        }),
    );
    let app = app(layer, routes);
    let req = |auth: &str, version: &str| {
        let mut r = post_req("/v1/orders?expand=items", "a", Some("k"), r#"{"x":1}"#);
        r.headers_mut()
            .insert("authorization", auth.parse().unwrap());
        r.headers_mut()
            .insert("x-api-version", version.parse().unwrap());
        r
    };
    send(&app, req("Bearer old", "2024-01-01")).await;
    // A rotated credential is the same request.
    let rotated = send(&app, req("Bearer new", "2024-01-01")).await;
    assert!(rotated.replayed());
    // A different configured header is not.
    let other = send(&app, req("Bearer new", "2025-01-01")).await;
    assert_eq!(other.code(), "idempotency_key_mismatch");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The stored request, for the completer: never the credential.
    let stored = seen.lock().unwrap().take().expect("stored while in flight");
    assert_eq!(stored.method, "POST");
    assert_eq!(stored.uri, "/v1/orders?expand=items");
    assert_eq!(stored.body, br#"{"x":1}"#.to_vec());
    assert_eq!(
        stored.headers,
        vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("x-api-version".to_owned(), b"2024-01-01".to_vec()),
        ]
    );
    // Once complete, the record keeps no request.
    let rec = store
        .get(&RecordKey::new(
            Scope::new("a"),
            IdempotencyKey::new("k").unwrap(),
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((rec.state_name(), rec.request), ("complete", None));
}

#[tokio::test]
async fn not_executed_is_returned_unstored_and_releases_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let routes = Router::new().route(
        "/v1/orders",
        post(move |body: String| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                if body.contains("invalid") {
                    (
                        StatusCode::BAD_REQUEST,
                        Extension(HandlerOutcome::NotExecuted),
                        "fix the amount",
                    )
                        .into_response()
                } else {
                    (StatusCode::CREATED, "created").into_response()
                }
            }
        }),
    );
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
    let metrics = layer.metrics();
    let app = app(layer, routes);
    let bad = send(
        &app,
        post_req("/v1/orders", "a", Some("k"), r#"{"amount":"invalid"}"#),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(&bad.body[..], b"fix the amount");
    // The corrected request, same key, executes (no mismatch: nothing was stored).
    let good = send(
        &app,
        post_req("/v1/orders", "a", Some("k"), r#"{"amount":100}"#),
    )
    .await;
    assert_eq!(good.status, StatusCode::CREATED);
    assert!(!good.replayed());
    let again = send(
        &app,
        post_req("/v1/orders", "a", Some("k"), r#"{"amount":100}"#),
    )
    .await;
    assert!(again.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let m = metrics.snapshot();
    assert_eq!((m.claims, m.released, m.replays), (2, 1, 1));
}

#[tokio::test]
async fn suspended_keeps_the_recovery_point_and_the_next_retry_resumes_at_once() {
    // An outside system failed after a committed phase: the first attempt checkpoints and
    // suspends; the immediate retry takes the key over and sees the recovery point.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let routes = Router::new().route(
        "/v1/orders",
        post(move |ctx: IdempotencyContext| {
            let s = s.clone();
            async move {
                s.lock()
                    .unwrap()
                    .push((ctx.kind(), ctx.resume_from::<String>().unwrap()));
                if ctx.recovery_point().is_none() {
                    ctx.checkpoint(&"charged").await.unwrap();
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        Extension(HandlerOutcome::Suspended),
                        "the mailer is down",
                    )
                        .into_response()
                } else {
                    (StatusCode::CREATED, "done").into_response()
                }
            }
        }),
    );
    let store = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(store.clone());
    let metrics = layer.metrics();
    let app = app(layer, routes);
    let first = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!first.replayed());
    // Not released, not stored: in flight with its recovery point and a lapsed lease.
    let id = oncely_core::RecordKey::new(
        oncely_core::Scope::new("a"),
        oncely_core::IdempotencyKey::new("k").unwrap(),
    );
    let rec = store.get(&id).await.unwrap().unwrap();
    // Steps are stored as JSON (here a JSON string).
    assert_eq!(rec.recovery_point(), Some(r#""charged""#));
    // The lease was cut to 1 ms.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let retry = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    let again = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert!(again.replayed());
    assert_eq!(&again.body[..], b"done");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (ClaimKind::New, None),
            (ClaimKind::Takeover, Some("charged".to_owned()))
        ]
    );
    let m = metrics.snapshot();
    assert_eq!((m.claims, m.lease_takeovers, m.released), (2, 1, 0));
}

#[tokio::test]
async fn store_policy_releases_retry_later_statuses_and_stores_5xx() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let routes = Router::new().route(
        "/v1/orders",
        post(move |body: String| {
            let c = c.clone();
            async move {
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                let status = if body.contains("throttle") {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                (status, format!("call {n}"))
            }
        }),
    );
    let app = app(IdempotencyLayer::new(Arc::new(MemoryStore::new())), routes);
    let t1 = send(
        &app,
        post_req("/v1/orders", "a", Some("t"), r#""throttle""#),
    )
    .await;
    let t2 = send(
        &app,
        post_req("/v1/orders", "a", Some("t"), r#""throttle""#),
    )
    .await;
    assert_eq!(
        (&t1.body[..], &t2.body[..]),
        (&b"call 1"[..], &b"call 2"[..])
    );
    assert!(!t2.replayed(), "429 released the key");
    let e1 = send(&app, post_req("/v1/orders", "a", Some("e"), r#""boom""#)).await;
    let e2 = send(&app, post_req("/v1/orders", "a", Some("e"), r#""boom""#)).await;
    assert_eq!(e1.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        e2.replayed(),
        "a non-transactional 500 may have had effects: replayed"
    );
    assert_eq!(e2.body, e1.body);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_failing_store_fails_closed_with_503_and_the_handler_never_runs() {
    // docs/DESIGN.md, "Store slow or failing".
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(FaultStore::new(
        MemoryStore::new(),
        Fault::FailAll,
    )));
    let metrics = layer.metrics();
    let app = app(layer, counting_routes(calls.clone()));
    for _ in 0..3 {
        let got = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
        assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(got.code(), "idempotency_store_unavailable");
        assert_eq!(got.json()["retryable"], true);
        assert_eq!(got.headers["retry-after"], "1");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(metrics.snapshot().store_errors, 3);
}

#[tokio::test]
async fn a_store_that_fails_after_the_claim_still_returns_the_response() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(FaultStore::new(MemoryStore::new(), Fault::FailComplete));
    let layer = IdempotencyLayer::new(store.clone());
    let app = app(layer, counting_routes(calls.clone()));
    let got = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert_eq!(got.status, StatusCode::CREATED, "the side effect happened");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The key stays in flight until its lease lapses: a retry now is a 409.
    let retry = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert_eq!(retry.code(), "idempotency_request_in_flight");
    let rec = store
        .inner
        .get(&RecordKey::new(
            Scope::new("a"),
            IdempotencyKey::new("k").unwrap(),
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state_name(), "in_flight");
}

/// A handler streaming `chunks` as separate frames.
fn streaming_routes(calls: Arc<AtomicUsize>, chunks: &'static [&'static [u8]]) -> Router {
    Router::new().route(
        "/v1/exports",
        post(move || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let stream = futures::stream::iter(
                    chunks
                        .iter()
                        .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c))),
                );
                (
                    [("content-type", "text/csv"), ("x-export", "1")],
                    Body::from_stream(stream),
                )
                    .into_response()
            }
        }),
    )
}

#[tokio::test]
async fn streaming_response_over_the_cap_is_delivered_whole_then_not_retained() {
    // docs/DESIGN.md, "Streaming responses": never an empty or partial body presented as the original.
    const CHUNKS: &[&[u8]] = &[b"id,amount\n", b"1,100\n2,200\n", b"3,300\n"];
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(store.clone())
        .with_policy(Policy::default().with_max_response_bytes(16));
    let metrics = layer.metrics();
    let app = app(layer, streaming_routes(calls.clone(), CHUNKS));
    let first = send(&app, post_req("/v1/exports", "a", Some("k"), "{}")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        &first.body[..],
        b"id,amount\n1,100\n2,200\n3,300\n",
        "every byte"
    );

    let replay = send(&app, post_req("/v1/exports", "a", Some("k"), "{}")).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never re-executed");
    assert_eq!(replay.status, StatusCode::CONFLICT);
    assert_eq!(replay.code(), "idempotency_response_not_retained");
    assert!(replay.replayed());
    let v = replay.json();
    assert_eq!(v["retryable"], false);
    assert!(v["detail"].as_str().unwrap().contains("status 200"), "{v}");

    // The record keeps status and headers, and says the body was not retained.
    let rec = store
        .get(&RecordKey::new(
            Scope::new("a"),
            IdempotencyKey::new("k").unwrap(),
        ))
        .await
        .unwrap()
        .unwrap();
    let RecordState::Complete { response, .. } = rec.state else {
        panic!("not complete")
    };
    assert_eq!(response.status, 200);
    assert!(!response.body_retained);
    assert!(response.body.is_empty());
    assert!(
        response
            .headers
            .contains(&("x-export".to_owned(), b"1".to_vec()))
    );
    let m = metrics.snapshot();
    assert_eq!((m.not_retained, m.replays), (1, 1));
}

#[tokio::test]
async fn streaming_response_under_the_cap_replays_byte_identical() {
    const CHUNKS: &[&[u8]] = &[b"id,amount\n", b"1,100\n2,200\n", b"3,300\n"];
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        IdempotencyLayer::new(Arc::new(MemoryStore::new())),
        streaming_routes(calls.clone(), CHUNKS),
    );
    let first = send(&app, post_req("/v1/exports", "a", Some("k"), "{}")).await;
    let replay = send(&app, post_req("/v1/exports", "a", Some("k"), "{}")).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(&replay.body[..], b"id,amount\n1,100\n2,200\n3,300\n");
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.status, first.status);
    assert_eq!(
        comparable_headers(&replay.headers),
        comparable_headers(&first.headers)
    );
    assert!(replay.replayed());
}

#[tokio::test]
async fn a_body_exactly_at_the_cap_is_retained() {
    let calls = Arc::new(AtomicUsize::new(0));
    const CHUNKS: &[&[u8]] = &[b"12345678", b"abcdefgh"];
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
        .with_policy(Policy::default().with_max_response_bytes(16));
    let app = app(layer, streaming_routes(calls, CHUNKS));
    send(&app, post_req("/v1/exports", "a", Some("k"), "{}")).await;
    let replay = send(&app, post_req("/v1/exports", "a", Some("k"), "{}")).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert_eq!(&replay.body[..], b"12345678abcdefgh");
}

#[tokio::test]
async fn every_claim_outcome_is_mapped() {
    // docs/DESIGN.md, "Unique violation surfaced as 500" is a store matter (a lost insert race is the "record exists" path); here the
    // layer's side: each outcome a store can answer becomes the right response, never a 500.
    async fn run(
        outcome: ClaimOutcome,
    ) -> (
        Got,
        usize,
        Vec<&'static str>,
        Option<(ClaimKind, Option<String>)>,
    ) {
        let store = Arc::new(ScriptedStore::new(outcome));
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(std::sync::Mutex::new(None));
        let (c, s) = (calls.clone(), seen.clone());
        let routes = Router::new().route(
            "/v1/orders",
            post(move |ctx: IdempotencyContext| {
                let (c, s) = (c.clone(), s.clone());
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    *s.lock().unwrap() = Some((ctx.kind(), ctx.recovery_point().clone()));
                    (StatusCode::CREATED, "ran")
                }
            }),
        );
        let app = app(IdempotencyLayer::new(store.clone()), routes);
        let got = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
        let seen = seen.lock().unwrap().clone();
        (got, calls.load(Ordering::SeqCst), store.writes(), seen)
    }
    let claim = |kind, rp: Option<&str>| {
        ClaimOutcome::Claimed(
            Claim::new(FencingToken(7), 0, kind).with_recovery_point(rp.map(str::to_owned)),
        )
    };

    let (got, calls, writes, seen) = run(claim(ClaimKind::New, None)).await;
    assert_eq!((got.status, calls), (StatusCode::CREATED, 1));
    assert_eq!(writes, vec!["claim", "complete"]);
    assert_eq!(seen, Some((ClaimKind::New, None)));

    let (_, calls, _, seen) = run(claim(ClaimKind::Takeover, Some("charged"))).await;
    assert_eq!(calls, 1);
    assert_eq!(
        seen,
        Some((ClaimKind::Takeover, Some("charged".to_owned())))
    );

    let (_, calls, _, seen) = run(claim(ClaimKind::AfterReplayWindow, None)).await;
    assert_eq!(calls, 1);
    assert_eq!(seen, Some((ClaimKind::AfterReplayWindow, None)));

    let (got, calls, writes, _) = run(ClaimOutcome::InFlight {
        lease_expires_at: 0,
    })
    .await;
    assert_eq!((got.status, calls), (StatusCode::CONFLICT, 0));
    assert_eq!(got.code(), "idempotency_request_in_flight");
    assert_eq!(got.headers["retry-after"], "1");
    assert_eq!(got.json()["retryable"], true);
    assert_eq!(writes, vec!["claim"]);

    let stored = StoredResponse::new(
        201,
        vec![("x-a".into(), b"1".to_vec()), ("x-a".into(), b"2".to_vec())],
        b"stored".to_vec(),
    );
    let (got, calls, _, _) = run(ClaimOutcome::Replay {
        response: stored.clone(),
        completed_at: 0,
    })
    .await;
    assert_eq!(
        (got.status, calls, &got.body[..]),
        (StatusCode::CREATED, 0, &b"stored"[..])
    );
    assert!(got.replayed());
    assert_eq!(
        got.headers.get_all("x-a").iter().collect::<Vec<_>>(),
        vec!["1", "2"]
    );

    let (got, calls, _, _) = run(ClaimOutcome::Replay {
        response: stored.with_body_retained(false),
        completed_at: 0,
    })
    .await;
    assert_eq!((got.status, calls), (StatusCode::CONFLICT, 0));
    assert_eq!(got.code(), "idempotency_response_not_retained");

    let (got, calls, _, _) = run(ClaimOutcome::Mismatch).await;
    assert_eq!((got.status, calls), (StatusCode::UNPROCESSABLE_ENTITY, 0));
    assert_eq!(got.code(), "idempotency_key_mismatch");

    // Marked for a person by the completer: never executed, never retryable.
    let (got, calls, writes, _) = run(ClaimOutcome::NeedsAttention {
        marked_at: 1_700_000_000_000,
        attempts: 5,
        recovery_point: Some("charge_created".into()),
    })
    .await;
    assert_eq!((got.status, calls), (StatusCode::CONFLICT, 0));
    assert_eq!(got.code(), "idempotency_request_needs_attention");
    assert_eq!(got.json()["retryable"], false);
    assert_eq!(got.headers["x-should-retry"], "false");
    assert!(got.headers.get("retry-after").is_none());
    let detail = got.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("\"charge_created\"") && detail.contains("5 re-drive"),
        "{detail}"
    );
    assert_eq!(writes, vec!["claim"], "nothing written, nothing released");
}

#[tokio::test]
async fn works_as_a_route_layer_and_leaves_unmatched_routes_alone() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
    let app = counting_routes(calls.clone())
        .route_layer(layer)
        .layer(axum::middleware::from_fn(authenticate));
    let first = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    let retry = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(retry.replayed());
    let missing = send(&app, post_req("/nowhere", "a", None, "{}")).await;
    assert_eq!(
        missing.status,
        StatusCode::NOT_FOUND,
        "not a 400: route_layer skips 404s"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A method the route does not serve is answered `405` by the router, before the layer: no
/// claim, no `400 idempotency_key_missing` for a `PATCH` without a key, no stored `405`
/// replayed (and a key burnt for the `POST` it was meant for). That holds when the layer is put
/// on the route's method router (`post(handler).route_layer(layer)`), as the docs teach:
/// `Router::route_layer` also wraps each route's `405` answer.
#[tokio::test]
async fn a_method_not_allowed_is_answered_before_the_layer() {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(store.clone());
    let handler = {
        let calls = calls.clone();
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        }
    };
    let app = Router::new()
        .route("/v1/orders", post(handler).route_layer(layer))
        .layer(axum::middleware::from_fn(authenticate));
    for method in ["PATCH", "PUT", "DELETE"] {
        for key in [Some("k"), None] {
            let mut req = post_req("/v1/orders", "a", key, "{}");
            *req.method_mut() = method.parse().unwrap();
            let got = send(&app, req).await;
            assert_eq!(
                got.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {key:?}"
            );
            assert_eq!(got.headers["allow"], "POST", "{method} {key:?}");
        }
    }
    let id = RecordKey::new(Scope::new("a"), IdempotencyKey::new("k").unwrap());
    assert!(
        store.get(&id).await.unwrap().is_none(),
        "a 405 claimed the key"
    );
    // The key is still the POST's to use.
    let first = send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn nested_routers_do_not_share_records_through_a_common_suffix() {
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = counting_routes(calls.clone());
    let app = app(
        IdempotencyLayer::new(Arc::new(MemoryStore::new())),
        Router::new().nest("/a", inner.clone()).nest("/b", inner),
    );
    send(&app, post_req("/a/v1/orders", "s", Some("k"), "{}")).await;
    let other = send(&app, post_req("/b/v1/orders", "s", Some("k"), "{}")).await;
    assert_eq!(other.code(), "idempotency_key_mismatch");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_extractor_rejects_with_a_500_problem_without_the_layer() {
    let app = Router::new().route("/x", post(|_: IdempotencyContext| async { "unreachable" }));
    let got = send(&app, post_req("/x", "a", Some("k"), "{}")).await;
    assert_eq!(got.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(got.code(), "idempotency_layer_missing");
}

#[tokio::test]
async fn works_on_a_plain_tower_service_with_any_body() {
    use tower::{ServiceBuilder, ServiceExt};
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(Arc::new(MemoryStore::new())))
        .service_fn(|req: http::Request<oncely_tower::Body>| async move {
            let claimed = req.extensions().get::<IdempotencyContext>().is_some();
            Ok::<_, std::convert::Infallible>(Response::new(Body::from(format!(
                "claimed={claimed}"
            ))))
        });
    let mut req = http::Request::post("/x")
        .header("idempotency-key", "k")
        .body(http_body_util::Full::new(Bytes::from_static(b"hi")))
        .unwrap();
    req.extensions_mut().insert(Scope::new("a"));
    let res = svc.clone().oneshot(req).await.unwrap();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"claimed=true");
    let _ = Frame::data(Bytes::new());
}

#[tokio::test]
async fn the_counters_reach_the_metrics_facade_with_route_and_store() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The test runtime runs on this thread alone: every increment goes to this recorder.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (app, _, _, layer) = setup();
    layer.metrics().set_store_label("memory");
    send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    send(&app, post_req("/v1/orders", "a", Some("k"), "{}")).await;
    send(&app, post_req("/v1/orders", "a", Some("k"), r#"{"x":1}"#)).await;
    let seen: std::collections::HashMap<(String, Vec<String>), DebugValue> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            ((key.key().name().to_owned(), labels), value)
        })
        .collect();
    let labels = vec!["route=/v1/orders".to_owned(), "store=memory".to_owned()];
    for name in [
        "oncely_claims_total",
        "oncely_replays_total",
        "oncely_mismatches_total",
    ] {
        assert_eq!(
            seen.get(&(name.to_owned(), labels.clone())),
            Some(&DebugValue::Counter(1)),
            "{name} in {seen:?}"
        );
    }
    // The in-process reading counts the same increments.
    let m = layer.metrics().snapshot();
    assert_eq!((m.claims, m.replays, m.mismatches), (1, 1, 1));
}
