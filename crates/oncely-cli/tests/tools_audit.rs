//! `oncely audit` as a real process: against `oncely serve` (SQLite, and three instances on one
//! PostgreSQL through three base URLs: every check PASS or N/A), against a
//! tiny API that ignores keys (one root cause and its consequences, exit status 1, and exactly the
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

const ORDER: &str = r#"{"items": [{"sku": "a", "quantity": 1}]}"#;

/// The checks of a full audit of `oncely serve`: everything passes but what needs a setting
/// `oncely serve` cannot give (a second token of one account; a session cookie) and expiry.
fn serve_verdicts() -> Vec<(String, String)> {
    pairs(&[
        ("concurrency", "pass"),
        ("replay-fidelity", "pass"),
        ("payload-mismatch", "pass"),
        ("canonical-json", "pass"),
        ("cross-endpoint", "pass"),
        ("cross-scope", "pass"),
        ("refreshed-credential", "n/a"),
        ("session-scope", "n/a"),
        ("client-bypass", "pass"),
        ("malformed-keys", "pass"),
        ("missing-key", "pass"),
        ("in-flight", "pass"),
        ("method-idempotency", "n/a"),
        ("expiry", "n/a"),
    ])
}

/// Runs a full audit (JSON) of `oncely serve` at `urls` as the accounts `a` and `b`, asserts
/// every check is PASS or N/A with no anti-pattern and no warning, and returns the report.
async fn full_audit_of_serve(urls: &[&str], a: &str, b: &str) -> Value {
    let auth_a = format!("Bearer {a}");
    let auth_b = format!("Bearer {b}");
    let mut args = vec!["audit"];
    args.extend_from_slice(urls);
    args.extend_from_slice(&[
        "--endpoint",
        "POST /v1/payments",
        "--body",
        PAYMENT,
        "--auth",
        &auth_a,
        "--second-auth",
        &auth_b,
        "--cookies",
        "--other-endpoint",
        "POST /v1/orders",
        "--other-body",
        ORDER,
        "--count-url",
        "/v1/payments",
        "--json",
    ]);
    let out = oncely(&args).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["passed"], true, "{stdout}");
    assert_eq!(statuses(&report), serve_verdicts(), "{stdout}");
    for c in report["checks"].as_array().unwrap() {
        assert_eq!(c["anti_pattern"], Value::Null, "{c}");
        assert_eq!(c["consequence_of"], Value::Null, "{c}");
    }
    assert_eq!(report["root_cause"], Value::Null, "{stdout}");
    assert_eq!(report["warnings"], json!([]), "{stdout}");
    assert_eq!(report["trials"]["trials"], 10, "{stdout}");
    assert_eq!(
        report["trials"]["executions"],
        json!(vec![1; 10]),
        "{stdout}"
    );
    let session = &report["checks"][7];
    assert_eq!(
        session["detail"],
        "the first caller's responses set no cookie, so there is no session to present"
    );
    report
}

/// The payments `account` has on the server at `url`.
async fn payments_of(url: &str, account: &str) -> usize {
    let list: Value = reqwest::Client::new()
        .get(format!("{url}/v1/payments"))
        .bearer_auth(account)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list["data"].as_array().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_oncely_serve_on_sqlite_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.sqlite3");
    let server = start(&["serve", "--store", db.to_str().unwrap()]);
    let report = full_audit_of_serve(&[&server.url], "acct_a", "acct_b").await;
    assert_eq!(report["target"], format!("POST {}/v1/payments", server.url));
    let concurrency = &report["checks"][0];
    assert!(
        concurrency["detail"].as_str().unwrap().starts_with(
            "1 execution from 20 identical requests with one key, in each of 10 burst(s)"
        ),
        "{concurrency}"
    );
    // 10 x 20 + 41 requests and 2 x 10 + 22 count-URL reads at most.
    let sent = report["requests_sent"].as_u64().unwrap();
    assert!((240..=283).contains(&sent), "{sent}");

    // The payments the audit created under the first caller, read back from the server: the
    // baseline, the client-bypass new key, one per burst, one per in-flight pair (1 to 3).
    let created = payments_of(&server.url, "acct_a").await;
    assert!((13..=15).contains(&created), "{created}");
}

/// Three `oncely serve` processes on one PostgreSQL, audited through their three base URLs
/// (no proxy): every burst and every retry is spread across the instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_three_oncely_serve_instances_on_postgres_passes_every_check() {
    let Ok(store) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_POSTGRES_URL is unset (e.g. postgres://postgres@127.0.0.1:5432/test)"
        );
        return;
    };
    audit_of_three_instances(&store).await;
}

/// The same on one MySQL / MariaDB database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_three_oncely_serve_instances_on_mysql_passes_every_check() {
    let Ok(store) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_MYSQL_URL is unset (e.g. mysql://root@127.0.0.1:3306/test)"
        );
        return;
    };
    audit_of_three_instances(&store).await;
}

/// Audits three `oncely serve --store STORE` processes through their three base URLs; every
/// check passes and every instance sees the same payments.
async fn audit_of_three_instances(store: &str) {
    let servers: Vec<_> = (0..3)
        .map(|_| start(&["serve", "--store", store]))
        .collect();
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    // Accounts of their own, so that earlier runs on the same database count for nothing.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (a, b) = (format!("acct_audit_a_{run}"), format!("acct_audit_b_{run}"));
    let report = full_audit_of_serve(&urls, &a, &b).await;
    assert!(
        report["target"]
            .as_str()
            .unwrap()
            .ends_with("/v1/payments (+2 instances)"),
        "{report}"
    );
    // The evidence shows requests on each instance.
    let evidence: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["evidence"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    for url in &urls {
        let host = url.trim_start_matches("http://");
        assert!(
            evidence
                .iter()
                .any(|e| e.contains(&format!(" {host}/v1/payments"))),
            "no request went to {host}"
        );
    }
    // Every instance sees the same payments: the baseline, the bypass key, one per burst, one
    // per in-flight pair.
    let created = payments_of(urls[1], &a).await;
    assert!((13..=15).contains(&created), "{created}");
    assert_eq!(payments_of(urls[2], &a).await, created);
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
        stdout.ends_with("summary: 8 PASS, 0 FAIL, 6 N/A, 0 INCONCLUSIVE\n"),
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
    assert_eq!(report["checks"][13]["name"], "expiry");
    (report["checks"][13].clone(), out.status.code().unwrap())
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
    // One root cause (the key is ignored), reported once; what it explains is FAIL without an
    // anti-pattern of its own; what needs working replays to say anything is N/A.
    let root = json!("key ignored (request executed again)");
    let expected: Vec<(String, String, Value)> = [
        ("concurrency", "fail", Value::Null),
        ("replay-fidelity", "fail", root.clone()),
        ("payload-mismatch", "fail", Value::Null),
        ("canonical-json", "fail", Value::Null),
        ("cross-endpoint", "n/a", Value::Null),
        ("cross-scope", "n/a", Value::Null),
        ("refreshed-credential", "n/a", Value::Null),
        ("session-scope", "n/a", Value::Null),
        ("client-bypass", "n/a", Value::Null),
        ("malformed-keys", "fail", Value::Null),
        ("missing-key", "fail", Value::Null),
        ("in-flight", "fail", Value::Null),
        ("method-idempotency", "n/a", Value::Null),
        ("expiry", "n/a", Value::Null),
    ]
    .into_iter()
    .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c))
    .collect();
    assert_eq!(verdicts, expected, "{stdout}");
    assert_eq!(report["root_cause"]["anti_pattern"], root, "{stdout}");
    assert_eq!(
        report["root_cause"]["consequences"],
        json!([
            "concurrency",
            "payload-mismatch",
            "canonical-json",
            "malformed-keys",
            "missing-key",
            "in-flight"
        ]),
        "{stdout}"
    );
    // The traffic bound: what the report says it sent is what the server received, and within
    // the plan (10 bursts of 10 + 41 without a count URL).
    let received = state.requests.load(Ordering::SeqCst);
    assert_eq!(report["requests_sent"].as_u64(), Some(received as u64));
    assert!(received <= 141, "{received}");
    assert_eq!(state.created.load(Ordering::SeqCst), received);

    // The text report names the root cause first, then each consequence under its check.
    let out = oncely(&[
        "audit",
        &url,
        "--endpoint",
        "POST /v1/payments",
        "--body",
        r#"{"amount": 1000}"#,
        "--concurrency",
        "5",
        "--trials",
        "2",
    ])
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "\nroot cause: key ignored (request executed again) (shown by replay-fidelity)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\nFAIL  concurrency: identical requests with one key, sent at once, execute at most once (in every burst)\n      consequence of the root cause: key ignored (request executed again)\n"),
        "{text}"
    );
    assert!(
        text.ends_with("summary: 0 PASS, 7 FAIL, 7 N/A, 0 INCONCLUSIVE\n"),
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
    let cases: [(Vec<&str>, &str); 12] = [
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
            "max_requests is 10 but this audit needs up to 246 requests",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--trials", "0"],
            "trials must be between 1 and 100, got 0",
        ),
        (
            vec![
                "--endpoint",
                "POST /v1/payments",
                "--auth",
                "Bearer x",
                "--same-account-auth",
                "Bearer x",
            ],
            "the same-account credential must be another token of the first caller's account",
        ),
        (
            vec!["--endpoint", "POST /v1/payments", "--other-body", "{}"],
            "--other-endpoint",
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
    let out = oncely(&[
        "audit",
        url.as_str(),
        "https://127.0.0.1:1",
        "--endpoint",
        "POST /v1/p",
    ])
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("built without TLS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}

/// `oncely audit` of `oncely serve`'s own webhook receiver, every request signed as the
/// processor signs it and keyed by `webhook-id`: every check PASS or N/A. Unsigned, the receiver
/// refuses everything with `401` (nothing to compare: not a PASS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_oncely_serve_s_webhook_receiver_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("webhooks.sqlite3");
    let server = start(&["serve", "--store", db.to_str().unwrap()]);
    // The reference pair's documented test secret (`oncely serve`'s default).
    let secret = "whsec_b25jZWx5LXJlZmVyZW5jZS1wcm9jZXNzb3ItZGV2LXNlY3JldA==";
    let event = r#"{"type": "charge.succeeded", "data": {"object": {"id": "ch_audit", "object": "charge"}}}"#;
    let args = |signed: bool| {
        let mut a = vec![
            "audit",
            server.url.as_str(),
            "--endpoint",
            "POST /webhooks/processor",
            "--body",
            event,
            "--key-header",
            "webhook-id",
            "--trials",
            "3",
            "--json",
        ];
        if signed {
            a.extend_from_slice(&["--webhook-secret", secret]);
        }
        a
    };
    let out = oncely(&args(true)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let verdicts: std::collections::BTreeMap<String, String> =
        statuses(&report).into_iter().collect();
    for name in [
        "concurrency",
        "replay-fidelity",
        "payload-mismatch",
        "canonical-json",
        "client-bypass",
        "malformed-keys",
        "missing-key",
        "in-flight",
    ] {
        assert_eq!(verdicts[name], "pass", "{name}: {stdout}");
    }
    assert_eq!(verdicts["method-idempotency"], "n/a");

    let out = oncely(&args(false)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["checks"][1]["name"], "replay-fidelity");
    assert_eq!(report["checks"][1]["status"], "inconclusive", "{stdout}");
    assert!(stdout.contains("webhook_signature_invalid"), "{stdout}");
}
