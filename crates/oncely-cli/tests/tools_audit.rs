//! `oncely audit` as a real process: against `oncely serve` (every check PASS or N/A), against a
//! tiny API that ignores keys (FAILs with their anti-patterns, exit status 1, and exactly the
//! requests the report claims), and with usage errors (exit status 2, nothing sent).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const PAYMENT: &str = r#"{"amount": 1000, "currency": "EUR", "source": "tok_visa"}"#;

mod common;
use common::start;

async fn oncely(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .output()
        .await
        .expect("run oncely")
}

fn statuses(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_oncely_serve_passes_every_check() {
    let server = start(&["serve", "--store", "memory"]);
    let out = oncely(&[
        "audit",
        &server.url,
        "--endpoint",
        "POST /v1/payments",
        "--body",
        PAYMENT,
        "--auth",
        "Bearer acct_a",
        "--second-auth",
        "Bearer acct_b",
        "--other-endpoint",
        "POST /v1/orders",
        "--count-url",
        "/v1/payments",
        "--json",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["passed"], true, "{stdout}");
    assert_eq!(
        report["target"],
        format!("POST {}/v1/payments", server.url),
        "{stdout}"
    );
    // Every check ran, in the contract's order; only expiry (no --window-secs) is N/A.
    assert_eq!(
        statuses(&report),
        pairs(&[
            ("concurrency", "pass"),
            ("replay-fidelity", "pass"),
            ("payload-mismatch", "pass"),
            ("canonical-json", "pass"),
            ("cross-endpoint", "pass"),
            ("cross-scope", "pass"),
            ("malformed-keys", "pass"),
            ("missing-key", "pass"),
            ("in-flight", "pass"),
            ("expiry", "n/a"),
        ]),
        "{stdout}"
    );
    for c in report["checks"].as_array().unwrap() {
        assert_eq!(c["anti_pattern"], Value::Null, "{c}");
    }
    let concurrency = &report["checks"][0];
    assert!(
        concurrency["detail"]
            .as_str()
            .unwrap()
            .starts_with("1 execution from 20 identical requests with one key"),
        "{concurrency}"
    );
    // 20 + 18 requests and 16 count-URL reads at most (the in-flight retries are conditional).
    let sent = report["requests_sent"].as_u64().unwrap();
    assert!((38..=54).contains(&sent), "{sent}");

    // The payments the audit created under the first caller, read back from the server: the
    // baseline, the concurrency winner, and one per in-flight pair (1 to 3), nothing else.
    let list: Value = reqwest::Client::new()
        .get(format!("{}/v1/payments", server.url))
        .bearer_auth("acct_a")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let created = list["data"].as_array().unwrap().len();
    assert!((3..=5).contains(&created), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_text_report_against_oncely_serve() {
    let server = start(&["serve", "--store", "memory"]);
    let out = oncely(&[
        "audit",
        &server.url,
        "--endpoint",
        "POST /v1/payments",
        "--body",
        PAYMENT,
        "--auth",
        "Bearer acct_a",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.starts_with(&format!(
            "oncely audit of POST {}/v1/payments (",
            server.url
        )),
        "{stdout}"
    );
    assert!(stdout.contains("\nPASS  concurrency: "), "{stdout}");
    assert!(stdout.contains("\nN/A   cross-scope: "), "{stdout}");
    assert!(stdout.contains("\nN/A   cross-endpoint: "), "{stdout}");
    assert!(
        stdout.ends_with("summary: 7 PASS, 0 FAIL, 3 N/A, 0 INCONCLUSIVE\n"),
        "{stdout}"
    );
    // Credentials are named in the evidence, never printed.
    assert!(!stdout.contains("acct_a"), "{stdout}");
}

/// Audits `endpoint` on a server whose replay window is 1 s, waiting it out; returns the expiry
/// check and the exit status.
async fn expiry_after_a_short_window(endpoint: &str, body: &str, count_url: &str) -> (Value, i32) {
    let server = start(&["serve", "--store", "memory", "--replay-window-secs", "1"]);
    let out = oncely(&[
        "audit",
        &server.url,
        "--endpoint",
        endpoint,
        "--body",
        body,
        "--auth",
        "Bearer acct_a",
        "--count-url",
        count_url,
        "--window-secs",
        "1",
        "--json",
    ])
    .await;
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["checks"][9]["name"], "expiry");
    (report["checks"][9].clone(), out.status.code().unwrap())
}

/// After the replay window a reused payment key is a brand-new payment (a regression test: the
/// server once found the old row by `(scope, idempotency_key)` and answered it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_of_a_payment_key_against_oncely_serve() {
    let (expiry, code) =
        expiry_after_a_short_window("POST /v1/payments", PAYMENT, "/v1/payments").await;
    assert_eq!(expiry["status"], "pass", "{expiry:#}");
    assert_eq!(code, 0);
}

/// After the replay window a reused order key stores a new order (a regression test: the
/// server once answered 201 for an order a conflicting insert had silently dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_of_an_order_key_against_oncely_serve() {
    let (expiry, code) = expiry_after_a_short_window(
        "POST /v1/orders",
        r#"{"items": [{"sku": "a", "quantity": 1}]}"#,
        "/v1/orders",
    )
    .await;
    assert_eq!(expiry["status"], "pass", "{expiry:#}");
    assert_eq!(code, 0);
}

/// An API that ignores `Idempotency-Key` altogether: every request creates a payment.
#[derive(Default)]
struct Careless {
    requests: AtomicUsize,
    created: AtomicUsize,
}

async fn careless_create(State(s): State<Arc<Careless>>) -> (StatusCode, axum::Json<Value>) {
    s.requests.fetch_add(1, Ordering::SeqCst);
    // The card processor call: a real in-flight period.
    tokio::time::sleep(Duration::from_millis(40)).await;
    let n = s.created.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        axum::Json(json!({"id": format!("pay_{n}"), "amount": 1000})),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_an_api_that_ignores_keys_fails_with_the_anti_patterns() {
    let state = Arc::new(Careless::default());
    let app = Router::new()
        .route("/v1/payments", post(careless_create))
        .route("/v1/orders", post(careless_create))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let out = oncely(&[
        "audit",
        &url,
        "--endpoint",
        "POST /v1/payments",
        "--body",
        r#"{"amount": 1000}"#,
        "--auth",
        "Bearer a",
        "--second-auth",
        "Bearer b",
        "--other-endpoint",
        "POST /v1/orders",
        "--concurrency",
        "10",
        "--json",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let report: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["passed"], false);
    let verdicts: Vec<(String, String, Value)> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
                c["anti_pattern"].clone(),
            )
        })
        .collect();
    let expected: Vec<(String, String, Value)> = [
        ("concurrency", "fail", json!("check-then-insert race")),
        (
            "replay-fidelity",
            "fail",
            json!("key ignored (request executed again)"),
        ),
        (
            "payload-mismatch",
            "fail",
            json!("different payload executed under a reused key"),
        ),
        (
            "canonical-json",
            "fail",
            json!("byte-level fingerprint (executed again)"),
        ),
        ("cross-endpoint", "pass", Value::Null),
        ("cross-scope", "pass", Value::Null),
        ("malformed-keys", "fail", json!("no key validation")),
        (
            "missing-key",
            "fail",
            json!("key optional on a state-changing endpoint"),
        ),
        (
            "in-flight",
            "fail",
            json!("binary key state (no in-flight state)"),
        ),
        ("expiry", "n/a", Value::Null),
    ]
    .into_iter()
    .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c))
    .collect();
    assert_eq!(verdicts, expected, "{stdout}");
    // The traffic bound: what the report says it sent is what the server received, and within
    // the plan (10 + 18 without a count URL).
    let received = state.requests.load(Ordering::SeqCst);
    assert_eq!(report["requests_sent"].as_u64(), Some(received as u64));
    assert!(received <= 28, "{received}");
    assert_eq!(state.created.load(Ordering::SeqCst), received);

    // The text report names the anti-pattern under the failing check.
    let out = oncely(&[
        "audit",
        &url,
        "--endpoint",
        "POST /v1/payments",
        "--body",
        r#"{"amount": 1000}"#,
        "--concurrency",
        "5",
    ])
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("\nFAIL  concurrency: identical requests with one key, sent at once, execute at most once\n      anti-pattern: check-then-insert race\n"),
        "{text}"
    );
    assert!(
        text.ends_with("summary: 0 PASS, 7 FAIL, 3 N/A, 0 INCONCLUSIVE\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_before_sending_anything() {
    // A listener that counts connections: none may arrive.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    let cases: [(Vec<&str>, &str); 9] = [
        (
            vec!["--endpoint", "/v1/payments"],
            "--endpoint must be 'METHOD /path'",
        ),
        (
            vec!["--endpoint", "POST v1/payments"],
            "the path must start with '/'",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--body", "{amount"],
            "--body is not valid JSON",
        ),
        (
            vec![
                "--endpoint",
                "POST /v1/payments",
                "--auth",
                "Bearer x",
                "--second-auth",
                "Bearer x",
            ],
            "the second credential must differ from the first",
        ),
        (
            vec![
                "--endpoint",
                "POST /v1/payments",
                "--count-url",
                "http://example.invalid/v1/payments",
            ],
            "count URL \"http://example.invalid/v1/payments\" must be a path starting with '/' under the base URL",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--concurrency", "1"],
            "concurrency must be between 2 and 1000, got 1",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--window-secs", "601"],
            "the replay window must be between 1 ms and 600 s",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--max-requests", "10"],
            "max_requests is 10 but this audit needs up to 38 requests",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--timeout-secs", "0"],
            "--timeout-secs must be a positive number of seconds",
        ),
    ];
    for (extra, message) in cases {
        let mut args = vec!["audit", url.as_str()];
        args.extend(extra.iter().copied());
        let out = oncely(&args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(message), "{extra:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{extra:?}");
    }
    let out = oncely(&["audit", "ftp://127.0.0.1/", "--endpoint", "POST /v1/p"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must be an http:// or https:// URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = oncely(&["audit", "https://127.0.0.1:1", "--endpoint", "POST /v1/p"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("built without TLS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}
