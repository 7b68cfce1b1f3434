//! `oncely serve` with a lease of 1 second and a card processor and mailer that each take 3
//! seconds to answer: one `POST /v1/payments`, a duplicate every 300 ms, on every store the
//! server runs on. While the payment runs, its key's lease (`GET /v1/idempotency-keys/{key}`)
//! stays in the future; every duplicate is answered in flight at once (or, once it is done,
//! replayed);
//! no key is taken over (`oncely_lease_takeovers_total` stays 0); the processor sees the charge
//! and the e-mail called once each.
//!
//! PostgreSQL, MySQL / MariaDB, Redis and Redis Cluster runs skip, printing why, when
//! `ONCELY_TEST_POSTGRES_URL`, `ONCELY_TEST_MYSQL_URL`, `ONCELY_TEST_REDIS_URL` or
//! `ONCELY_TEST_REDIS_CLUSTER_URL` is unset.

mod common;

use common::start;
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const PAY: &str = r#"{"amount": 4200, "currency": "EUR", "source": "tok_visa"}"#;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn post_pay(url: &str, key: &str) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{url}/v1/payments"))
        .bearer_auth("acct_slow")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(PAY)
        .send()
        .await
}

async fn pay(url: &str, key: &str) -> (u16, bool, String) {
    let r = post_pay(url, key).await.expect("POST /v1/payments");
    let status = r.status().as_u16();
    let replayed = r.headers().contains_key("idempotent-replayed");
    (status, replayed, r.text().await.unwrap())
}

/// The processor's ledger entry for the call whose metadata names `key`: `(calls, executions)`.
async fn ledger(processor: &str, path: &str, key: &str) -> (u64, u64) {
    let v: Value = reqwest::get(format!("{processor}/{path}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = v["entries"].as_array().expect("entries");
    let mine: Vec<&Value> = entries
        .iter()
        .filter(|e| e["metadata"]["idempotency_key"] == key)
        .collect();
    assert_eq!(mine.len(), 1, "one {path} key for {key}: {v}");
    (
        mine[0]["calls"].as_u64().unwrap(),
        mine[0]["executions"].as_u64().unwrap(),
    )
}

async fn takeovers(url: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("oncely_lease_takeovers_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn run(store: &str) {
    let processor = start(&[
        "processor",
        "--charge-delay-ms",
        "3000",
        "--email-delay-ms",
        "3000",
    ]);
    let server = start(&[
        "serve",
        "--store",
        store,
        "--processor-url",
        &processor.url,
        "--lease-ms",
        "1000",
        // The completer would re-drive other tests' abandoned records in a shared database
        // (each re-drive a takeover): this test watches its own request alone.
        "--no-completer",
    ]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = server.url.clone();
        let key = format!("slow-{}", uuid::Uuid::new_v4().simple());
        let first = {
            let (url, key) = (url.clone(), key.clone());
            tokio::spawn(async move { pay(&url, &key).await })
        };
        let mut duplicates = Vec::new();
        let mut leases_left = Vec::new();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut slowest = Duration::ZERO;
        while !first.is_finished() {
            let sent = std::time::Instant::now();
            duplicates.push(pay(&url, &key).await);
            slowest = slowest.max(sent.elapsed());
            let state: Value = reqwest::Client::new()
                .get(format!("{url}/v1/idempotency-keys/{key}"))
                .bearer_auth("acct_slow")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if state["state"] == "in_flight" {
                let left = state["lease_expires_at"].as_i64().expect("a lease") - now_ms();
                leases_left.push(left);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (status, replayed, body) = first.await.unwrap();
        assert_eq!(status, 201, "{body}");
        assert!(!replayed);
        assert!(
            leases_left.len() >= 10,
            "the key was seen in flight {} times",
            leases_left.len()
        );
        assert!(
            leases_left.iter().all(|left| *left > 0),
            "the lease lapsed while the payment ran: ms left {leases_left:?}"
        );
        for (s, replay, b) in &duplicates {
            let in_flight = *s == 409 && b.contains("idempotency_request_in_flight");
            let replay = *s == 201 && *replay && *b == body;
            assert!(in_flight || replay, "a duplicate got {s} {b}");
        }
        // Answered at once (a few milliseconds here), not after a wait for a phase held open
        // across an outside call (before the fix, on SQLite: 1.7 s, the rest of the 3 s call):
        // the bound is a third of the call, room for a busy machine.
        assert!(
            slowest < Duration::from_millis(1000),
            "a duplicate waited {slowest:?} for its answer"
        );
        assert_eq!(takeovers(&url).await, 0, "no key was taken over");
        assert_eq!(ledger(&processor.url, "charges", &key).await, (1, 1));
        assert_eq!(ledger(&processor.url, "emails", &key).await, (1, 1));
    });
}

#[test]
fn slow_outside_calls_keep_the_lease_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path().join("slow.sqlite3").to_str().unwrap());
}

#[test]
fn slow_outside_calls_keep_the_lease_on_postgres() {
    let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipped: ONCELY_TEST_POSTGRES_URL is unset");
        return;
    };
    run(&url);
}

#[test]
fn slow_outside_calls_keep_the_lease_on_mysql() {
    let Ok(url) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!("skipped: ONCELY_TEST_MYSQL_URL is unset");
        return;
    };
    run(&url);
}

#[test]
fn slow_outside_calls_keep_the_lease_on_redis() {
    let Ok(url) = std::env::var("ONCELY_TEST_REDIS_URL") else {
        eprintln!("skipped: ONCELY_TEST_REDIS_URL is unset");
        return;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    run(&format!("{url}{sep}accept_volatile=true"));
}

#[test]
fn slow_outside_calls_keep_the_lease_on_a_redis_cluster() {
    let Ok(url) = std::env::var("ONCELY_TEST_REDIS_CLUSTER_URL") else {
        eprintln!("skipped: ONCELY_TEST_REDIS_CLUSTER_URL is unset");
        return;
    };
    run(&url);
}

#[test]
fn a_shutdown_during_a_charge_does_not_hand_the_key_over_on_postgres() {
    let Ok(store) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
        eprintln!("skipped: ONCELY_TEST_POSTGRES_URL is unset");
        return;
    };
    shutdown_during_a_charge(&store);
}

#[test]
fn a_shutdown_during_a_charge_does_not_hand_the_key_over_on_mysql() {
    let Ok(store) = std::env::var("ONCELY_TEST_MYSQL_URL") else {
        eprintln!("skipped: ONCELY_TEST_MYSQL_URL is unset");
        return;
    };
    shutdown_during_a_charge(&store);
}

/// Two `oncely serve` on one database (`store`), and a charge that takes 6 s. Server `a`
/// (`--shutdown-grace-secs 1`) gets the payment and a SIGTERM 3 s into the charge; duplicates
/// go to server `b` every 300 ms. `a` does not hand the key over while its charge runs: it
/// keeps the lease until the charge returns, records it, and stops at that recovery point;
/// `b`'s retry then resumes after the charge. The processor sees the charge called once.
fn shutdown_during_a_charge(store: &str) {
    let processor = start(&["processor", "--charge-delay-ms", "6000"]);
    let serve = |grace: &str| {
        start(&[
            "serve",
            "--store",
            store,
            "--processor-url",
            &processor.url,
            "--shutdown-grace-secs",
            grace,
            "--no-completer",
        ])
    };
    let (mut a, b) = (serve("1"), serve("20"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let key = format!("term-{}", uuid::Uuid::new_v4().simple());
        let first = {
            let (url, key) = (a.url.clone(), key.clone());
            tokio::spawn(async move { post_pay(&url, &key).await.map(|r| r.status().as_u16()) })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let term = std::process::Command::new("kill")
            .args(["-TERM", &a.child.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        let mut answers = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let got = pay(&b.url, &key).await;
            let done = got.0 == 201;
            answers.push(got);
            if done || answers.len() > 200 {
                break;
            }
        }
        assert_eq!(
            ledger(&processor.url, "charges", &key).await,
            (1, 1),
            "the charge was called once"
        );
        // `a` answered its request 503 (stopped at its recovery point), or exited before the
        // answer reached the client, which then retries.
        if let Ok(status) = first.await.unwrap() {
            assert_eq!(status, 503, "the first request on the stopping server");
        }
        let (last, before) = answers.split_last().unwrap();
        assert_eq!(last.0, 201, "{}", last.2);
        assert!(before.len() >= 5, "{} duplicates", before.len());
        for (s, _, body) in before {
            assert!(
                *s == 409 && body.contains("idempotency_request_in_flight"),
                "a duplicate got {s} {body}"
            );
        }
        assert_eq!(ledger(&processor.url, "emails", &key).await, (1, 1));
    });
    let exited = (0..100).find_map(|_| {
        let s = a.child.try_wait().unwrap();
        if s.is_none() {
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    });
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
}
