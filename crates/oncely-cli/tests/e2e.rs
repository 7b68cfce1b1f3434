//! End to end: `oncely serve` as a real process, driven over HTTP like the README's tour.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;
use common::start;

struct Resp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn post(url: &str, path: &str, account: &str, key: Option<&str>, body: &str) -> Resp {
    let mut req = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .bearer_auth(account)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let r = req.send().await.expect("request");
    Resp {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        body: r.bytes().await.unwrap().to_vec(),
    }
}

async fn get_json(url: &str, account: &str) -> Value {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(account)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn scrape(url: &str) -> String {
    reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of every series of the counter `name` (over its labels); 0 when it has none yet
/// (the exporter shows a series from its first increment on).
async fn metric(url: &str, name: &str) -> u64 {
    let text = scrape(url).await;
    text.lines()
        .filter(|l| {
            l.starts_with(name)
                && (l[name.len()..].starts_with(' ') || l[name.len()..].starts_with('{'))
        })
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("bad sample {l:?} in:\n{text}"))
        })
        .sum()
}

/// The value of the one sample line that starts with `series` (name and labels, in the
/// exporter's order), or `None`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `/metrics` is the exporter's: after a claim, a replay and a mismatch on one route, the
/// labelled counters, the outcome series and the claim-latency histogram say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_labelled_by_route_outcome_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.sqlite3");
    let s = start(&["serve", "--store", db.to_str().unwrap()]);
    let pay = r#"{"amount": 1999, "currency": "EUR", "source": "tok_visa"}"#;
    let other = r#"{"amount": 5000, "currency": "EUR", "source": "tok_visa"}"#;
    assert_eq!(
        post(&s.url, "/v1/payments", "acct_m", Some("m-1"), pay)
            .await
            .status,
        201
    );
    assert_eq!(
        post(&s.url, "/v1/payments", "acct_m", Some("m-1"), pay)
            .await
            .status,
        201
    );
    assert_eq!(
        post(&s.url, "/v1/payments", "acct_m", Some("m-1"), other)
            .await
            .status,
        422
    );
    let text = scrape(&s.url).await;
    let route = r#"route="/v1/payments""#;
    for (series, want) in [
        (
            format!("oncely_claims_total{{{route},store=\"sqlite\"}}"),
            1.0,
        ),
        (
            format!("oncely_replays_total{{{route},store=\"sqlite\"}}"),
            1.0,
        ),
        (
            format!("oncely_mismatches_total{{{route},store=\"sqlite\"}}"),
            1.0,
        ),
        (
            format!("oncely_requests_total{{{route},outcome=\"claimed\",store=\"sqlite\"}}"),
            1.0,
        ),
        (
            format!("oncely_requests_total{{{route},outcome=\"replayed\",store=\"sqlite\"}}"),
            1.0,
        ),
        (
            format!("oncely_requests_total{{{route},outcome=\"mismatch\",store=\"sqlite\"}}"),
            1.0,
        ),
        (
            format!(
                "oncely_claim_duration_seconds_count{{{route},outcome=\"claimed\",store=\"sqlite\"}}"
            ),
            1.0,
        ),
        (
            format!(
                "oncely_claim_duration_seconds_bucket{{{route},outcome=\"replayed\",store=\"sqlite\",le=\"+Inf\"}}"
            ),
            1.0,
        ),
        ("oncely_payments_created_total".to_owned(), 1.0),
        ("oncely_payments".to_owned(), 1.0),
    ] {
        assert_eq!(sample(&text, &series), Some(want), "{series} in:\n{text}");
    }
    assert!(
        text.contains("# TYPE oncely_claim_duration_seconds histogram"),
        "{text}"
    );
    // The layer's help texts reach the exporter (`Metrics::describe`, called at install).
    assert!(
        text.contains("# HELP oncely_claims_total Claims granted (the request executed).\n"),
        "{text}"
    );
    // Every store call the layer made is timed: at least the three claims.
    let ops: f64 = ["ok", "error"]
        .iter()
        .filter_map(|o| {
            sample(
                &text,
                &format!("oncely_store_operation_duration_seconds_count{{store=\"sqlite\",outcome=\"{o}\"}}"),
            )
        })
        .sum();
    assert!(ops >= 3.0, "{ops} store operations in:\n{text}");
}

/// A payment body that repeats `amount`, sent with the key of a payment that had one of its
/// values, gets `400 idempotency_body_not_canonicalizable` (before any claim), never the stored
/// payment: a first-wins reader would charge 1, a last-wins reader 5000
/// (docs/DESIGN.md, "JSON bodies and the I-JSON rule").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_duplicate_member_names_and_never_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dup.sqlite3");
    let s = start(&["serve", "--store", db.to_str().unwrap()]);
    let pay = r#"{"amount": 5000, "currency": "EUR", "source": "tok_visa"}"#;
    let first = post(&s.url, "/v1/payments", "acct_1", Some("pay-dup"), pay).await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    // The charge's charge.succeeded event is delivered to the webhook receiver, which claims
    // it too (the layers share their metrics): wait until it is applied.
    let payment = first.json()["id"].as_str().unwrap().to_owned();
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let events: Value = http
            .get(format!("{}/v1/payments/{payment}/events", s.url))
            .bearer_auth("acct_1")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if events["data"].as_array().is_some_and(|d| d.len() == 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no event applied: {events}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for body in [
        r#"{"amount": 1, "amount": 5000, "currency": "EUR", "source": "tok_visa"}"#,
        r#"{"amount": 5000, "currency": "EUR", "source": "tok_visa", "amount": 1}"#,
    ] {
        let dup = post(&s.url, "/v1/payments", "acct_1", Some("pay-dup"), body).await;
        assert_eq!(dup.status, 400, "{}", String::from_utf8_lossy(&dup.body));
        assert_eq!(dup.headers["content-type"], "application/problem+json");
        assert_eq!(dup.json()["code"], "idempotency_body_not_canonicalizable");
        assert_eq!(dup.json()["retryable"], false);
        assert!(dup.headers.get("idempotent-replayed").is_none());
        assert_ne!(dup.body, first.body);
    }
    // A new key with the duplicate is refused too: nothing is charged.
    let fresh = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("pay-dup-2"),
        r#"{"amount": 1, "amount": 1, "currency": "EUR", "source": "tok_visa"}"#,
    )
    .await;
    assert_eq!(fresh.json()["code"], "idempotency_body_not_canonicalizable");
    assert_eq!(
        metric(&s.url, "oncely_body_not_canonicalizable_total").await,
        3
    );
    // The payment's claim and the webhook event's.
    assert_eq!(metric(&s.url, "oncely_claims_total").await, 2);
    assert_eq!(metric(&s.url, "oncely_replays_total").await, 0);
    // The original body still replays the original payment.
    let retry = post(&s.url, "/v1/payments", "acct_1", Some("pay-dup"), pay).await;
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(retry.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_tour_holds() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tour.sqlite3");
    let s = start(&["serve", "--store", db.to_str().unwrap()]);
    let pay = r#"{"amount": 1999, "currency": "EUR", "source": "tok_visa"}"#;

    // 1. A payment, then its retry with keys reordered: a byte-identical replay.
    let first = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("order-confirm-42"),
        pay,
    )
    .await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let p = first.json();
    assert_eq!(p["amount"], 1999);
    assert_eq!(p["currency"], "EUR");
    assert_eq!(p["status"], "succeeded");
    assert!(p["charge_id"].as_str().unwrap().starts_with("ch_"));
    assert!(first.headers.get("idempotent-replayed").is_none());
    let reordered = r#"{"currency":"EUR",  "amount":1999, "source":"tok_visa"}"#;
    let retry = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("order-confirm-42"),
        reordered,
    )
    .await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(retry.headers["location"], first.headers["location"]);
    assert_eq!(metric(&s.url, "oncely_replays_total").await, 1);

    // 2. The same key for another request: a mismatch, never a replay.
    let other = r#"{"amount": 5000, "currency": "EUR", "source": "tok_visa"}"#;
    let mismatch = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("order-confirm-42"),
        other,
    )
    .await;
    assert_eq!(mismatch.status, 422);
    assert_eq!(mismatch.headers["content-type"], "application/problem+json");
    assert_eq!(mismatch.json()["code"], "idempotency_key_mismatch");
    assert_eq!(mismatch.json()["retryable"], false);

    // 3. Two at once: one runs, the other sees it in flight (or, if the first already
    //    finished, gets the replay). Repeat until the conflict is observed.
    let mut saw_conflict = false;
    for i in 0..20 {
        let key = format!("order-confirm-concurrent-{i}");
        let body = r#"{"amount": 700, "currency": "EUR", "source": "tok_visa"}"#;
        let (a, b) = tokio::join!(
            post(&s.url, "/v1/payments", "acct_1", Some(&key), body),
            post(&s.url, "/v1/payments", "acct_1", Some(&key), body)
        );
        let mut statuses = [a.status, b.status];
        statuses.sort();
        assert!(
            statuses == [201, 201] || statuses == [201, 409],
            "{statuses:?}"
        );
        if statuses == [201, 409] {
            let conflict = if a.status == 409 { &a } else { &b };
            assert_eq!(conflict.json()["code"], "idempotency_request_in_flight");
            assert_eq!(conflict.json()["retryable"], true);
            assert!(conflict.headers.contains_key("retry-after"));
            saw_conflict = true;
            break;
        }
    }
    assert!(saw_conflict, "never saw an in-flight conflict in 20 tries");

    // The caller's payments: exactly the ones that ran.
    let list = get_json(&format!("{}/v1/payments", s.url), "acct_1").await;
    let n_before = list["data"].as_array().unwrap().len();

    // 4. A bad body stores nothing: the key is released and the corrected request runs.
    let bad = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("fix-me"),
        r#"{"amount": -5, "currency": "EUR", "source": "tok_visa"}"#,
    )
    .await;
    assert_eq!(bad.status, 422);
    assert_eq!(bad.json()["code"], "validation_failed");
    let state = get_json(&format!("{}/v1/idempotency-keys/fix-me", s.url), "acct_1").await;
    assert_eq!(state["state"], "absent");
    let list = get_json(&format!("{}/v1/payments", s.url), "acct_1").await;
    assert_eq!(list["data"].as_array().unwrap().len(), n_before);
    let fixed = post(&s.url, "/v1/payments", "acct_1", Some("fix-me"), pay).await;
    assert_eq!(fixed.status, 201);
    let state = get_json(&format!("{}/v1/idempotency-keys/fix-me", s.url), "acct_1").await;
    assert_eq!(state["state"], "complete");
    assert_eq!(state["status"], 201);

    // 5. Another account with the same key: its own execution, its own data.
    let b = post(
        &s.url,
        "/v1/payments",
        "acct_2",
        Some("order-confirm-42"),
        other,
    )
    .await;
    assert_eq!(b.status, 201);
    assert_eq!(b.json()["amount"], 5000);
    assert_ne!(b.json()["id"], p["id"]);

    // 6. Missing and malformed keys.
    let missing = post(&s.url, "/v1/payments", "acct_1", None, pay).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json()["code"], "idempotency_key_missing");
    let long = "k".repeat(256);
    let invalid = post(&s.url, "/v1/payments", "acct_1", Some(&long), pay).await;
    assert_eq!(invalid.status, 400);
    assert_eq!(invalid.json()["code"], "idempotency_key_invalid");

    // 7. A declined card: 402, stored and replayed.
    let decline = r#"{"amount": 10, "currency": "EUR", "source": "tok_decline"}"#;
    let d1 = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("declined-1"),
        decline,
    )
    .await;
    assert_eq!(d1.status, 402);
    let d2 = post(
        &s.url,
        "/v1/payments",
        "acct_1",
        Some("declined-1"),
        decline,
    )
    .await;
    assert_eq!(d2.status, 402);
    assert_eq!(d2.body, d1.body);
    assert_eq!(d2.headers["idempotent-replayed"], "true");

    // 8. Orders: one transactional phase, replayed.
    let order = r#"{"items": [{"sku": "A-1", "quantity": 2}]}"#;
    let o1 = post(&s.url, "/v1/orders", "acct_1", Some("order-1"), order).await;
    assert_eq!(o1.status, 201);
    let o2 = post(&s.url, "/v1/orders", "acct_1", Some("order-1"), order).await;
    assert_eq!(o2.body, o1.body);
    let orders = get_json(&format!("{}/v1/orders", s.url), "acct_1").await;
    assert_eq!(orders["data"].as_array().unwrap().len(), 1);
    let location = o1.headers["location"].to_str().unwrap().to_owned();
    let order = get_json(&format!("{}{location}", s.url), "acct_1").await;
    assert_eq!(order, o1.json());

    // 9. Unauthenticated writes are refused before anything else.
    let anon = reqwest::Client::new()
        .post(format!("{}/v1/payments", s.url))
        .header("idempotency-key", "x")
        .body(pay)
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 401);
}

#[tokio::test]
async fn openapi_documents_the_key_on_every_write() {
    let s = start(&["serve", "--store", "memory"]);
    let doc: Value = reqwest::get(format!("{}/openapi.json", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut writes = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if ["post", "patch", "put", "delete"].contains(&method.as_str()) {
                writes += 1;
                let params = op["parameters"].as_array().expect("parameters");
                if path.starts_with("/webhooks/") {
                    // A webhook receiver is keyed by the sender's event id.
                    assert_eq!(op["x-oncely-key-source"], "webhook-id", "{method} {path}");
                    assert!(
                        params.iter().any(|p| p["name"] == "webhook-id"),
                        "{method} {path} lacks the webhook-id parameter"
                    );
                    assert!(
                        op["responses"]["401"].is_object(),
                        "{method} {path} lacks 401"
                    );
                } else {
                    assert!(
                        params.iter().any(|p| p["name"] == "Idempotency-Key"
                            && p["in"] == "header"
                            && p["required"] == true),
                        "{method} {path} lacks the required Idempotency-Key header parameter"
                    );
                }
                for status in ["400", "409", "422", "503"] {
                    assert!(
                        op["responses"][status].is_object(),
                        "{method} {path} lacks {status}"
                    );
                }
            }
        }
    }
    assert_eq!(writes, 3);
    assert_eq!(
        doc["components"]["schemas"]["Problem"]["required"],
        serde_json::json!(["type", "title", "status", "code", "retryable"])
    );
}

#[test]
fn contract_command_prints_the_checked_in_contract() {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .arg("contract")
        .output()
        .unwrap();
    assert!(out.status.success());
    let on_disk = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/CONTRACT.md"
    ))
    .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), on_disk);
}

/// Runs `oncely gates --json <args…>` and returns its report, asserting the exit status agrees
/// with the report's verdict.
fn gates(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["gates", "--json"])
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gates printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(out.status.success(), report["passed"] == true, "{report:#}");
    report
}

/// The gates' key measurements: one payment and one charge for N concurrent identical
/// requests, no repeated outside call after crashes, no duplicate side effect in the fleet,
/// across a rolling SIGTERM restart no duplicate, no lost payment, clean exits and no retry
/// answered "in flight" (waiting on a lease); the first two over gRPC; and one application per
/// webhook event id.
fn assert_all_gates_pass(report: &Value) {
    assert_eq!(report["passed"], true, "{report:#}");
    let gates = report["gates"].as_array().unwrap();
    assert_eq!(gates.len(), 7);
    let rolling = &gates[3]["details"];
    assert_eq!(gates[3]["name"], "rolling restart");
    assert_eq!(rolling["duplicate_side_effects"], 0);
    assert_eq!(rolling["unresolved"], 0);
    assert_eq!(rolling["in_flight_409"], 0);
    assert_eq!(rolling["payments"], rolling["logical_calls"]);
    let exits = rolling["exit_codes"].as_array().unwrap();
    assert!(
        exits.len() >= 2 && exits.iter().all(|c| c == 0),
        "{rolling}"
    );
    assert_eq!(gates[4]["name"], "grpc concurrency");
    assert_eq!(gates[4]["details"]["charge_executions"], 1);
    assert_eq!(gates[4]["details"]["payments"], 1);
    assert_eq!(
        gates[4]["details"]["other"].as_array().map(Vec::len),
        Some(0)
    );
    assert_eq!(gates[5]["name"], "grpc crash recovery");
    assert_eq!(gates[5]["details"]["repeated_outside_calls"], 0);
    assert_eq!(gates[0]["details"]["charge_executions"], 1);
    assert_eq!(gates[0]["details"]["payments"], 1);
    assert_eq!(
        gates[0]["details"]["other"].as_array().map(Vec::len),
        Some(0)
    );
    assert_eq!(gates[1]["details"]["repeated_outside_calls"], 0);
    assert_eq!(gates[2]["details"]["duplicate_side_effects"], 0);
    assert_eq!(gates[6]["name"], "webhook");
    let webhook = &gates[6]["details"];
    let events = webhook["events"].as_object().unwrap();
    assert_eq!(events.len(), 3, "{webhook:#}");
    for (id, e) in events {
        assert_eq!(e["applied"], 1, "event {id}: {webhook:#}");
    }
    assert_eq!(webhook["rows_for_payment"], 3);
    assert_eq!(webhook["receiver_crashed"], true);
    assert_eq!(webhook["concurrent_round"]["delivered"], 50);
}

#[test]
fn gates_pass_on_the_embedded_default() {
    // The main job, smaller: fewer concurrent requests and fleet calls so the suite stays fast.
    let report = gates(&["-n", "50", "--fleet-clients", "8", "--fleet-calls", "5"]);
    assert_all_gates_pass(&report);
}

/// Every gate once on three API processes sharing `url` (the key store and the business
/// tables in one database), given `flags` as well; then `runs` times 300 concurrent identical
/// requests spread across them, zero failures.
fn gates_pass_with_three_servers(url: &str, runs: usize, flags: &[&str]) {
    let args = ["--store", url, "--fleet-clients", "4", "--fleet-calls", "5"];
    let report = gates(&[&args[..], flags].concat());
    assert_all_gates_pass(&report);
    assert_eq!(report["gates"][0]["details"]["servers"], 3);
    for run in 0..runs {
        let args = ["--store", url, "-n", "300", "--only", "concurrency"];
        let report = gates(&[&args[..], flags].concat());
        assert_eq!(report["passed"], true, "run {run}: {report:#}");
        let c = &report["gates"][0]["details"];
        assert_eq!(c["servers"], 3);
        assert_eq!(c["requests"], 300);
        assert_eq!(c["payments"], 1);
        assert_eq!(c["charge_executions"], 1);
        assert_eq!(c["other"].as_array().map(Vec::len), Some(0));
    }
}

#[test]
fn gates_pass_on_postgres_with_three_servers_on_both_paths() {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_POSTGRES_URL is unset (e.g. postgres://postgres@127.0.0.1:5432/test)"
        );
        return;
    };
    // The issue's acceptance: 300 concurrent identical requests across 3 API processes sharing
    // one PostgreSQL, 10 times.
    gates_pass_with_three_servers(&url, 10, &[]);
    // The same on the paths with the fewest round trips (`--pg-fewest-round-trips`: the claim
    // sent with the `BEGIN`, the completion with the `COMMIT`). After the other run, never
    // beside it: the crash gate's completer finishes any abandoned request of the database,
    // and one run's completer finishing the other's crashed request through its own processor
    // leaves the other's ledger without the receipt.
    gates_pass_with_three_servers(&url, 10, &["--pg-fewest-round-trips"]);
}

#[test]
fn gates_pass_on_mysql_with_three_servers() {
    let Ok(url) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_MYSQL_URL is unset (e.g. mysql://root@127.0.0.1:3306/test)"
        );
        return;
    };
    gates_pass_with_three_servers(&url, 3, &[]);
}

/// `url` with the query parameter `param` added.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

#[test]
fn gates_pass_on_redis() {
    let Ok(url) = std::env::var("ONCELY_TEST_REDIS_URL") else {
        eprintln!("skipped: ONCELY_TEST_REDIS_URL is unset (e.g. redis://127.0.0.1:6379)");
        return;
    };
    // The CI's Redis persists nothing on purpose: accepted explicitly.
    let url = with_param(&url, "accept_volatile=true");
    let report = gates(&[
        "--store",
        &url,
        "-n",
        "100",
        "--fleet-clients",
        "4",
        "--fleet-calls",
        "5",
    ]);
    assert_all_gates_pass(&report);
}

/// `url` (one Redis endpoint) pointed at database `db` instead of its own.
fn in_database(url: &str, db: u32) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (scheme, rest) = base.split_once("://").expect("a URL with a scheme");
    let host = rest.split('/').next().unwrap_or(rest);
    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
    format!("{scheme}://{host}/{db}{query}")
}

/// Another deployment on the same Redis, with its own business database and a completer that
/// re-drives every request whose lease lapsed at once, does not disturb a gates run: the gates
/// keep their records in a namespace of their own, so the other completer cannot take over the
/// requests of the fleet's killed server and answer them from its own database (before, that
/// gave the fleet `201`s with no payment behind them: 18 or 19 payments for 20 successes). The
/// two share a Redis database of this test's own (9), so the other deployment's eager completer
/// reaches no other test's records.
#[test]
fn gates_on_a_shared_redis_are_not_disturbed_by_another_deployment() {
    let Ok(url) = std::env::var("ONCELY_TEST_REDIS_URL") else {
        eprintln!("skipped: ONCELY_TEST_REDIS_URL is unset (e.g. redis://127.0.0.1:6379)");
        return;
    };
    let url = with_param(&in_database(&url, 9), "accept_volatile=true");
    let dir = tempfile::tempdir().unwrap();
    let business = dir.path().join("other-deployment.sqlite3");
    let _other = start(&[
        "serve",
        "--store",
        &url,
        "--business-db",
        business.to_str().unwrap(),
        "--completer-grace-ms",
        "0",
        "--completer-every-ms",
        "100",
    ]);
    let report = gates(&[
        "--store",
        &url,
        "--only",
        "fleet",
        "--fleet-clients",
        "4",
        "--fleet-calls",
        "5",
    ]);
    let fleet = &report["gates"][0]["details"];
    assert_eq!(fleet["logical_calls"], 20, "{report:#}");
    assert_eq!(
        fleet["payments"], 20,
        "a payment behind every 201: {report:#}"
    );
    assert_eq!(fleet["charged_keys"], 20, "{report:#}");
    assert_eq!(fleet["duplicate_side_effects"], 0, "{report:#}");
    assert_eq!(report["passed"], true, "{report:#}");
}

/// Runs `oncely ARGS` to its end (killed and failed after 60 s) and returns its exit code and
/// stderr.
fn run_to_end(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("oncely {args:?} was still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[test]
fn serve_and_gates_refuse_a_redis_that_keeps_nothing_unless_accepted() {
    // docs/DESIGN.md, "Redis and Redis Cluster": its own volatile Redis on 127.0.0.1:7122.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let Ok(redis) = Command::new("redis-server")
        .args([
            "--port",
            "7122",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        eprintln!("skipped: the redis-server binary is not installed");
        return;
    };
    let _redis = Killed(redis);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect("127.0.0.1:7122").is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let dir = tempfile::tempdir().unwrap();
    let biz = dir.path().join("biz.sqlite3");
    let url = "redis://127.0.0.1:7122";
    let (code, stderr) = run_to_end(&[
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--store",
        url,
        "--business-db",
        biz.to_str().unwrap(),
    ]);
    assert_ne!(code, Some(0), "{stderr}");
    for says in [
        "persists nothing",
        "accept_volatile=true",
        "executes the request again",
    ] {
        assert!(stderr.contains(says), "{says:?} missing from: {stderr}");
    }
    // The gates: a setup error (exit 2) with the same reason.
    let (code, stderr) = run_to_end(&["gates", "--json", "--store", url]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("persists nothing"), "{stderr}");
    // Accepted explicitly, the gates run (and pass) on it.
    let report = gates(&[
        "--store",
        &format!("{url}?accept_volatile=true"),
        "-n",
        "20",
        "--only",
        "concurrency",
    ]);
    assert_eq!(report["passed"], true, "{report:#}");
}

#[test]
fn serve_help_states_what_redis_must_keep() {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for says in [
        "persists nothing (appendonly no, save \"\") is refused",
        "?accept_volatile=true",
        "appendfsync everysec is accepted with a warning",
        "redis+cluster://HOST:PORT[,HOST:PORT…]",
        "503 idempotency_store_unavailable",
        "?wait_replicas=N&wait_timeout_ms=M",
    ] {
        assert!(
            help.contains(says),
            "{says:?} missing from serve --help:\n{help}"
        );
    }
}

#[test]
fn gates_pass_on_a_redis_cluster() {
    let Ok(url) = std::env::var("ONCELY_TEST_REDIS_CLUSTER_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_REDIS_CLUSTER_URL is unset (start a cluster with .ci/redis-cluster.sh)"
        );
        return;
    };
    // The cluster default: WAIT for 1 replica after every claim, recovery point and
    // completion.
    let report = gates(&[
        "--store",
        &url,
        "-n",
        "100",
        "--fleet-clients",
        "4",
        "--fleet-calls",
        "5",
    ]);
    assert_all_gates_pass(&report);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_outage_suspends_the_request_and_the_retry_resumes_it() {
    // The card processor is down when the request runs: the payment is recorded, the charge
    // fails, the request is suspended at its recovery point. Once the processor is back, the
    // client's retry with the same key resumes it: one payment, one charge.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("outage.sqlite3");
    let processor_url = format!("http://{addr}");
    let s = start(&[
        "serve",
        "--store",
        db.to_str().unwrap(),
        "--processor-url",
        &processor_url,
    ]);
    let pay = r#"{"amount": 2500, "currency": "EUR", "source": "tok_visa"}"#;

    let down = post(&s.url, "/v1/payments", "acct_o", Some("outage-1"), pay).await;
    assert_eq!(down.status, 503, "{}", String::from_utf8_lossy(&down.body));
    assert_eq!(down.json()["code"], "upstream_unavailable");
    assert_eq!(down.json()["retryable"], true);
    let state = get_json(&format!("{}/v1/idempotency-keys/outage-1", s.url), "acct_o").await;
    assert_eq!(state["state"], "in_flight", "{state}");
    // The typed recovery point: the payment step, with the payment's id.
    let rp: Value = serde_json::from_str(state["recovery_point"].as_str().unwrap()).unwrap();
    assert_eq!(rp["step"], "recorded", "{state}");
    assert!(
        rp["payment"].as_str().unwrap().starts_with("pay_"),
        "{state}"
    );

    // The processor comes back on the same address.
    let mut processor = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["processor", "--addr", &addr])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(processor.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().contains("listening on"));
    std::thread::spawn(move || for _ in lines {});

    let retry = post(&s.url, "/v1/payments", "acct_o", Some("outage-1"), pay).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(retry.headers.get("idempotent-replayed").is_none());
    let again = post(&s.url, "/v1/payments", "acct_o", Some("outage-1"), pay).await;
    assert_eq!(again.body, retry.body);
    let list = get_json(&format!("{}/v1/payments", s.url), "acct_o").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["data"][0]["id"], retry.json()["id"]);
    let charges: Value = reqwest::get(format!("{processor_url}/charges"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(charges["executions"], 1);
    assert_eq!(
        charges["entries"][0]["metadata"]["idempotency_key"],
        "outage-1"
    );
    let _ = processor.kill();
    let _ = processor.wait();
}

#[tokio::test]
async fn the_baseline_without_the_layer_serves_the_same_endpoints() {
    // `serve --idempotency off` is the benchmark baseline: the same handlers, no claim, so the
    // same key twice makes two orders (that is what the layer exists to prevent).
    let s = start(&["serve", "--store", "memory", "--idempotency", "off"]);
    let order = r#"{"items": [{"sku": "A-1", "quantity": 2}]}"#;
    let a = post(&s.url, "/v1/orders", "acct_b", Some("same"), order).await;
    let b = post(&s.url, "/v1/orders", "acct_b", Some("same"), order).await;
    assert_eq!(
        (a.status, b.status),
        (201, 201),
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    assert_ne!(a.json()["id"], b.json()["id"]);
    let pay = r#"{"amount": 100, "currency": "EUR", "source": "tok_visa"}"#;
    let p = post(&s.url, "/v1/payments", "acct_b", None, pay).await;
    assert_eq!(p.status, 201, "{}", String::from_utf8_lossy(&p.body));
    assert_eq!(p.json()["status"], "succeeded");
    let orders = get_json(&format!("{}/v1/orders", s.url), "acct_b").await;
    assert_eq!(orders["data"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn on_mysql_a_callers_rows_are_its_own_byte_for_byte() {
    // MySQL's and MariaDB's text collations fold case (`_ci`) or ignore trailing spaces (`PAD
    // SPACE`): a scope kept as text would let `ACCT_…` read `acct_…`'s payments. The business
    // tables keep the scope as bytes, as the key store does.
    let Ok(url) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_MYSQL_URL is unset (e.g. mysql://root@127.0.0.1:3306/test)"
        );
        return;
    };
    let s = start(&["serve", "--store", &url]);
    let account = format!("acct_mysql_{}", uuid::Uuid::new_v4().simple());
    let pay = r#"{"amount": 100, "currency": "EUR", "source": "tok_visa", "description": "é ü"}"#;
    let p = post(&s.url, "/v1/payments", &account, Some("k-1"), pay).await;
    assert_eq!(p.status, 201, "{}", String::from_utf8_lossy(&p.body));
    let id = p.json()["id"].as_str().unwrap().to_owned();
    let order = r#"{"items": [{"sku": "a", "quantity": 1}]}"#;
    let o = post(&s.url, "/v1/orders", &account, Some("k-2"), order).await;
    assert_eq!(o.status, 201, "{}", String::from_utf8_lossy(&o.body));
    let mine = get_json(&format!("{}/v1/payments", s.url), &account).await;
    assert_eq!(mine["data"].as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine["data"][0]["description"], "é ü");
    let upper = account.to_uppercase();
    for path in ["/v1/payments", "/v1/orders"] {
        let theirs = get_json(&format!("{}{path}", s.url), &upper).await;
        assert_eq!(
            theirs["data"].as_array().unwrap().len(),
            0,
            "{path}: {theirs}"
        );
    }
    let r = reqwest::Client::new()
        .get(format!("{}/v1/payments/{id}", s.url))
        .bearer_auth(&upper)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn a_value_the_database_refuses_ends_the_request_with_a_final_answer() {
    // docs/DESIGN.md, "Every request ends": PostgreSQL refuses U+0000 in text. That is a final
    // answer (422, not retryable), never a 503 "retry to resume" that leaves the key in flight for
    // ever: the phase rolled back with the claim, so the key is free and nothing stays in flight.
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!(
            "skipped: ONCELY_TEST_POSTGRES_URL is unset (e.g. postgres://postgres@127.0.0.1:5432/test)"
        );
        return;
    };
    let s = start(&["serve", "--store", &url]);
    let account = format!("acct_nul_{}", std::process::id());
    let pay =
        r#"{"amount": 100, "currency": "EUR", "source": "tok_visa", "description": "a\u0000b"}"#;
    for _ in 0..2 {
        let r = post(&s.url, "/v1/payments", &account, Some("nul-1"), pay).await;
        assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["code"], "database_refused");
        assert_eq!(r.json()["retryable"], false);
        let state = get_json(&format!("{}/v1/idempotency-keys/nul-1", s.url), &account).await;
        assert_eq!(state["state"], "absent", "{state}");
    }
    let list = get_json(&format!("{}/v1/payments", s.url), &account).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 0);
    // The same key, corrected, runs.
    let ok = r#"{"amount": 100, "currency": "EUR", "source": "tok_visa", "description": "ab"}"#;
    let r = post(&s.url, "/v1/payments", &account, Some("nul-1"), ok).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}
