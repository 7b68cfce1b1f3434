//! `oncely records` end to end: a payment whose card processor stays down past the
//! completer's attempts is marked for a person (`409 idempotency_request_needs_attention`);
//! `oncely records resolve` completes it with the answer a person decided, and the client's
//! retry gets that answer replayed; another one is re-driven once more by `oncely records
//! retry`, then forgotten by `oncely records release` (its next request executes anew). On
//! SQLite; on PostgreSQL when `ONCELY_TEST_POSTGRES_URL` is set; on Redis
//! (`ONCELY_TEST_REDIS_URL`) and Redis Cluster (`ONCELY_TEST_REDIS_CLUSTER_URL`, e.g. from
//! `.ci/redis-cluster.sh start`), each in a namespace of its own.

mod common;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A card processor that is down: every charge answers `503`, counted.
async fn processor_down(charges: Arc<AtomicUsize>) -> String {
    let app = Router::new()
        .route(
            "/charges",
            post(move || async move {
                charges.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(json!({"error": "processor_down"})),
                )
            }),
        )
        .route(
            "/emails",
            post(|| async { (StatusCode::ACCEPTED, axum::Json(json!({"id": "em_1"}))) }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

async fn pay(url: &str, key: &str) -> (u16, reqwest::header::HeaderMap, String) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/payments"))
        .bearer_auth("acct_records")
        .header("idempotency-key", key)
        .json(&json!({"amount": 900, "currency": "EUR", "source": "tok_visa"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap())
}

async fn key_state(url: &str, key: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{url}/v1/idempotency-keys/{key}"))
        .bearer_auth("acct_records")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or(Value::Null)
}

/// Waits (up to 60 s) until the completer marked the payment with `key` for a person.
async fn wait_marked(url: &str, key: &str) {
    for _ in 0..600 {
        if key_state(url, key).await["needs_attention"] == true {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the completer never marked the payment {key}");
}

/// `oncely records --store STORE ARGS…`, standard input closed (not a terminal).
fn records(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["records", "--store", store])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run oncely records")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn marked_then_resolved(store: &str) {
    let charges = Arc::new(AtomicUsize::new(0));
    let outside = processor_down(charges.clone()).await;
    let server = common::start(&[
        "serve",
        "--store",
        store,
        "--processor-url",
        &outside,
        "--completer-grace-ms",
        "0",
        "--completer-every-ms",
        "200",
        "--completer-max-attempts",
        "1",
        "--completer-backoff-secs",
        "1",
        "--completer-backoff-cap-secs",
        "1",
        "--reap-every-secs",
        "0",
    ]);
    let key = format!("records-{}", uuid::Uuid::new_v4());
    let (status, _, body) = pay(&server.url, &key).await;
    assert_eq!(status, 503, "{body}");
    wait_marked(&server.url, &key).await;
    let (status, _, body) = pay(&server.url, &key).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("idempotency_request_needs_attention"),
        "{body}"
    );
    let charged = charges.load(Ordering::SeqCst);
    assert_eq!(charged, 2, "the first attempt and one re-drive");

    // The operator finds it.
    let listed = records(
        store,
        &["list", "--marked", "--scope", "acct_records", "--json"],
    );
    assert!(listed.status.success(), "{}", text(&listed));
    let page: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let found = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key.as_str())
        .unwrap_or_else(|| panic!("the marked record is listed: {page}"))
        .clone();
    assert_eq!(found["state"], "in_flight");
    assert!(found["redrives"]["marked_at"].is_i64(), "{found}");
    let scope = found["scope"].as_str().unwrap().to_owned();
    let table = records(store, &["list", "--marked", "--scope", &scope]);
    assert!(table.status.success(), "{}", text(&table));
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.starts_with("SCOPE"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains(&key) && l.contains("marked for a person")),
        "{table}"
    );

    let dir = tempfile::tempdir().unwrap();
    let body_file = dir.path().join("answer.json");
    let decided = r#"{"id":"pay_decided","status":"failed","note":"refunded by hand"}"#;
    std::fs::write(&body_file, decided).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "resolve",
            &scope,
            &key,
            "--status",
            "402",
            "--body",
            body_file.to_str().unwrap(),
            "--header",
            "Content-Type: application/json",
            "--reason",
            "TICKET-7: the processor says the charge never happened",
            "--operator",
            "alice",
            "--audit-log",
            audit.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        records(store, &args)
    };
    // Not a terminal and no --yes: refused, nothing changed.
    let refused = resolve(&[]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not a terminal; pass --yes"),
        "{}",
        text(&refused)
    );
    let (status, _, _) = pay(&server.url, &key).await;
    assert_eq!(status, 409, "still marked");
    // Bad input is refused with its reason.
    let bad = records(
        store,
        &[
            "resolve", &scope, &key, "--status", "42", "--reason", "x", "--yes",
        ],
    );
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("200 to 599"),
        "{}",
        text(&bad)
    );
    let unknown = records(
        store,
        &["release", &scope, "no-such-key", "--reason", "x", "--yes"],
    );
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no record"),
        "{}",
        text(&unknown)
    );

    let done = resolve(&["--yes"]);
    assert!(done.status.success(), "{}", text(&done));
    assert!(
        String::from_utf8_lossy(&done.stdout).contains("complete 402"),
        "{}",
        text(&done)
    );
    // The audit trail: who, why, what it was and what it became.
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&audit)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(line["operator"], "alice");
    assert!(line["reason"].as_str().unwrap().starts_with("TICKET-7"));
    assert_eq!(line["key"], key.as_str());
    assert_eq!(line["before"]["state"], "in_flight");
    assert!(line["before"]["marked_at"].is_i64());
    assert_eq!(line["after"]["state"], "complete");
    assert!(
        String::from_utf8_lossy(&done.stderr).contains("operator change"),
        "the audit log line: {}",
        text(&done)
    );

    // The client's retry gets the decided answer, replayed; nothing is charged again.
    let (status, headers, body) = pay(&server.url, &key).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(body, decided);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(charges.load(Ordering::SeqCst), charged);

    let show = records(store, &["show", &scope, &key, "--body"]);
    assert!(show.status.success(), "{}", text(&show));
    let shown = String::from_utf8_lossy(&show.stdout).into_owned();
    for want in [
        "complete 402",
        "content-type: application/json",
        "pay_decided",
    ] {
        assert!(shown.contains(want), "{want:?} in {shown}");
    }

    retried_then_released(store, &server.url, &charges, &scope).await;
}

/// Another payment marked the same way: `retry` lifts the mark and the completer re-drives it
/// once more (the processor still down: one more charge, marked again); `release` forgets it,
/// and the next request with its key executes anew instead of answering 409.
async fn retried_then_released(store: &str, url: &str, charges: &AtomicUsize, scope: &str) {
    let key = format!("records-retry-{}", uuid::Uuid::new_v4());
    let (status, _, body) = pay(url, &key).await;
    assert_eq!(status, 503, "{body}");
    wait_marked(url, &key).await;
    let charged = charges.load(Ordering::SeqCst);
    let change = |what: &str, extra: &[&str]| {
        let mut args = vec![what, scope, &key, "--reason", "TICKET-8", "--yes"];
        args.extend_from_slice(extra);
        let out = records(store, &args);
        assert!(out.status.success(), "{what}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("{what}: done")),
            "{what}: {}",
            text(&out)
        );
    };
    // The server's --completer-max-attempts: the record is left one attempt under it.
    change("retry", &["--completer-max-attempts", "1"]);
    for _ in 0..600 {
        if charges.load(Ordering::SeqCst) > charged {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        charged + 1,
        "one more re-drive"
    );
    wait_marked(url, &key).await;
    let show = records(store, &["show", scope, &key, "--json"]);
    assert!(show.status.success(), "{}", text(&show));
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["state"], "in_flight", "{shown}");
    assert!(shown["redrives"]["marked_at"].is_i64(), "{shown}");

    change("release", &[]);
    let (status, _, body) = pay(url, &key).await;
    assert_eq!(status, 503, "executed anew: {body}");
    assert_eq!(charges.load(Ordering::SeqCst), charged + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_payment_resolved_by_a_person_replays_the_decided_answer_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("records.sqlite3");
    marked_then_resolved(db.to_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_payment_resolved_by_a_person_replays_the_decided_answer_on_postgres() {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipped: ONCELY_TEST_POSTGRES_URL is unset");
        return;
    };
    // A database of its own: the server's completer re-drives (and marks) every abandoned
    // record it finds, so on a database shared with other tests it would change theirs.
    use sqlx::Connection as _;
    let name = format!("oncely_records_e2e_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let own = format!(
        "{}/{name}{}",
        base.rsplit_once('/').unwrap().0,
        if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        }
    );
    marked_then_resolved(&own).await;
    // The server is gone (killed when its handle dropped): the database can go.
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await;
}

/// `ONCELY_TEST_…` `var`'s Redis URL in a namespace of this test's own (the server's completer
/// re-drives every abandoned record of its namespace, so a shared one would change other
/// tests' records), accepting a Redis that persists nothing; `None` when unset.
fn redis_store(var: &str) -> Option<String> {
    let Some(url) = std::env::var(var).ok().filter(|u| !u.is_empty()) else {
        eprintln!("skipped: {var} is unset");
        return None;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{url}{sep}namespace=oncely-records-e2e-{}&accept_volatile=true",
        uuid::Uuid::new_v4().simple()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_payment_resolved_by_a_person_replays_the_decided_answer_on_redis() {
    if let Some(store) = redis_store("ONCELY_TEST_REDIS_URL") {
        marked_then_resolved(&store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_payment_resolved_by_a_person_replays_the_decided_answer_on_redis_cluster() {
    if let Some(store) = redis_store("ONCELY_TEST_REDIS_CLUSTER_URL") {
        marked_then_resolved(&store).await;
    }
}
