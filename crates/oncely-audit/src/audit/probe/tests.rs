//! The probe's unit tests: evidence lines, response readers, cookie jars, count shapes and the
//! request budget.

use super::cookies::store_cookie;
use super::count::{count_in, ids_in};
use super::evidence::{describe_request, truncate_body};
use super::exchange::{describe_response, is_significant};
use super::prober::{ProbeError, Prober};
use super::request::{Cred, Dest, Key, Probe};
use super::*;
use crate::audit::config::{AuditConfig, KeyPlacement};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use reqwest::Url;
use std::time::Instant;

fn ex(status: u16, headers: &[(&str, &str)], body: &str) -> Exchange {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    let now = Instant::now();
    Exchange {
        request: String::new(),
        status: StatusCode::from_u16(status).unwrap(),
        headers: h,
        body: Bytes::from(body.to_owned()),
        started: now,
        finished: now,
    }
}

#[test]
fn reads_ids_codes_and_retry_after() {
    assert_eq!(
        ex(201, &[], r#"{"id":"pay_1"}"#).id().as_deref(),
        Some("pay_1")
    );
    assert_eq!(
        ex(201, &[], r#"{"data":{"id":7}}"#).id().as_deref(),
        Some("7")
    );
    assert_eq!(ex(201, &[], r#"[1]"#).id(), None);
    let e = ex(
        409,
        &[
            ("content-type", "application/problem+json"),
            ("retry-after", "1"),
        ],
        r#"{"type":"about:blank","code":"idempotency_request_in_flight"}"#,
    );
    assert_eq!(
        e.error_code().as_deref(),
        Some("idempotency_request_in_flight")
    );
    assert!(e.is_problem());
    assert_eq!(e.retry_after(), Some(("1".to_owned(), true)));
    let e = ex(
        409,
        &[("retry-after", "soon")],
        r#"{"error":{"type":"idempotency_error"}}"#,
    );
    assert_eq!(e.error_code().as_deref(), Some("idempotency_error"));
    assert_eq!(e.retry_after(), Some(("soon".to_owned(), false)));
    let e = ex(
        409,
        &[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")],
        "busy",
    );
    assert!(e.retry_after().unwrap().1);
    assert_eq!(e.error_code(), None);
    assert!(!e.is_problem());
}

#[test]
fn recognises_replay_marker_variants() {
    for m in [
        "Idempotent-Replayed",
        "Idempotency-Replayed",
        "X-Idempotent-Replayed",
    ] {
        let e = ex(200, &[(m, "true")], "{}");
        assert_eq!(
            e.replay_marker().map(str::to_owned),
            Some(m.to_ascii_lowercase())
        );
        assert!(e.marked_replay(), "{m}");
        assert!(!is_significant(
            &HeaderName::from_bytes(m.as_bytes()).unwrap()
        ));
    }
    assert!(ex(200, &[("Idempotency-Replayed", "1")], "{}").marked_replay());
    assert!(!ex(200, &[("Idempotent-Replayed", "false")], "{}").marked_replay());
    assert!(!ex(200, &[("Replayed", "true")], "{}").marked_replay());
}

#[test]
fn cookie_jar_keeps_names_and_values_and_deletes() {
    let mut jar = Vec::new();
    store_cookie(&mut jar, b"sid=abc; Path=/; HttpOnly");
    store_cookie(&mut jar, b"theme=dark");
    store_cookie(&mut jar, b"sid=def; Max-Age=60");
    assert_eq!(
        jar,
        vec![
            ("theme".to_owned(), "dark".to_owned()),
            ("sid".to_owned(), "def".to_owned())
        ]
    );
    store_cookie(&mut jar, b"theme=x; Max-Age=0");
    store_cookie(&mut jar, b"garbage");
    assert_eq!(jar, vec![("sid".to_owned(), "def".to_owned())]);
    assert_eq!(
        ex(200, &[("set-cookie", "sid=1; Path=/")], "").set_cookie_names(),
        vec!["sid".to_owned()]
    );
}

#[test]
fn counts_common_list_shapes() {
    use serde_json::json;
    assert_eq!(count_in(&json!([1, 2, 3])), Some(3));
    assert_eq!(count_in(&json!({"total_count": 4, "data": []})), Some(4));
    assert_eq!(count_in(&json!({"data": [1, 2]})), Some(2));
    assert_eq!(count_in(&json!({"nothing": 1})), None);
    assert_eq!(
        ids_in(&json!({"data": [{"id": "a"}, {"id": 2}, {}]})),
        vec!["a".to_owned(), "2".to_owned()]
    );
}

#[test]
fn evidence_lines_hide_credentials_and_truncate() {
    let url = Url::parse("http://127.0.0.1:1/v1/p?x=1").unwrap();
    let mut p = Probe {
        method: Method::POST,
        dest: Dest::Url(url.clone()),
        key: Key::One(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()),
        body: Some(Bytes::from_static(b"{\"a\":1}")),
        cred: Cred::Second,
        cookies_of: Cred::Second,
        extra: Vec::new(),
    };
    assert_eq!(
        describe_request(&p, &url, false, &KeyPlacement::default(), p.body.as_ref()),
        r#"> POST /v1/p?x=1 Idempotency-Key: "caf\xc3\xa9" Authorization: <second credential> body: {"a":1}"#
    );
    p.cookies_of = Cred::First;
    p.extra = vec![(
        HeaderName::from_static("x-idempotency-replay"),
        HeaderValue::from_static("true"),
    )];
    p.body = None;
    assert_eq!(
        describe_request(&p, &url, true, &KeyPlacement::default(), p.body.as_ref()),
        r#"> POST 127.0.0.1:1/v1/p?x=1 Idempotency-Key: "caf\xc3\xa9" Authorization: <second credential> Cookie: <the first credential's cookies> x-idempotency-replay: true"#
    );
    let long = "x".repeat(300);
    let t = truncate_body(long.as_bytes());
    assert_eq!(t.len(), 203);
    let e = ex(
        201,
        &[
            ("location", "/v1/p/1"),
            ("date", "today"),
            ("x-request-id", "r1"),
        ],
        "{}",
    );
    assert_eq!(
        describe_response(&e),
        "< 201 Created location: /v1/p/1 body: {} (2 bytes, 0 ms)"
    );
}

#[tokio::test]
async fn the_budget_is_a_hard_bound() {
    // Nothing listens on this port (bound, then released): every send that is allowed fails
    // at connect, the one over the budget is not attempted at all.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = AuditConfig::new(
        Url::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
        Method::POST,
        "/v1/p",
        serde_json::json!({"a": 1}),
    );
    cfg.max_requests = 2;
    let targets = cfg.targets_unchecked_for_tests();
    let p = Prober::new(&cfg, targets).unwrap();
    for _ in 0..2 {
        assert!(matches!(
            p.send(&p.probe(Key::fresh())).await,
            Err(ProbeError::Transport(_))
        ));
    }
    assert_eq!(
        p.send(&p.probe(Key::fresh())).await.unwrap_err(),
        ProbeError::Budget
    );
    assert_eq!(
        p.count().await.map(|r| r.is_err()),
        None,
        "no count URL configured"
    );
    assert_eq!(p.sent(), 2);
}

#[test]
fn significant_headers() {
    for n in ["location", "content-type", "x-payment-status", "etag"] {
        assert!(is_significant(&HeaderName::from_static(n)), "{n}");
    }
    for n in [
        "date",
        "x-request-id",
        "x-ratelimit-remaining",
        "server",
        "content-length",
    ] {
        assert!(!is_significant(&HeaderName::from_static(n)), "{n}");
    }
}
