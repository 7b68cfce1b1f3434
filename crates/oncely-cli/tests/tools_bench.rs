//! `oncely bench` against a real `oncely serve --store memory` child process on loopback.

use serde_json::Value;
use std::process::Command;

mod common;

fn serve(extra: &[&str]) -> common::Server {
    let mut args = vec!["serve", "--store", "memory"];
    args.extend_from_slice(extra);
    common::start(&args)
}

/// Runs `oncely bench --json` with `args` and returns (exit success, the JSON record).
fn bench(url: &str, args: &[&str]) -> (bool, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args([
            "bench",
            "--url",
            url,
            "--auth",
            "Bearer acct_bench",
            "--json",
        ])
        .args(args)
        .output()
        .expect("run oncely bench");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        !stdout.is_empty(),
        "no output; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --json prints one record and nothing else on stdout.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let record: Value = serde_json::from_str(&stdout).expect("one JSON record");
    (out.status.success(), record)
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

fn ms(v: &Value, p: &str) -> f64 {
    v["latency_ms"][p]
        .as_f64()
        .unwrap_or_else(|| panic!("latency_ms.{p} in {v}"))
}

fn status_sum(v: &Value) -> u64 {
    v["status"]
        .as_object()
        .expect("status object")
        .values()
        .map(|c| c.as_u64().expect("a count"))
        .sum()
}

#[test]
fn unique_keys_first_executions_then_duplicates_replay() {
    let server = serve(&[]);
    let orders = format!("{}/v1/orders", server.url);

    let (ok, r) = bench(
        &orders,
        &[
            "--requests",
            "200",
            "--concurrency",
            "8",
            "--keys",
            "unique",
        ],
    );
    assert!(ok, "{r}");
    assert_eq!(n(&r, "requests"), 200, "{r}");
    assert_eq!(n(&r, "responses"), 200, "{r}");
    assert_eq!(status_sum(&r), 200, "{r}");
    assert_eq!(r["status"]["201"].as_u64(), Some(200), "{r}");
    assert!(r["errors"].as_object().expect("errors").is_empty(), "{r}");
    assert_eq!(n(&r, "replayed"), 0, "{r}");
    assert_eq!(n(&r, "keys_minted"), 200, "{r}");
    assert_eq!(n(&r, "keys_reused"), 0, "{r}");
    assert_eq!(r["keys"], "unique");
    assert_eq!(n(&r, "concurrency"), 8);
    let (p50, p90, p99, max) = (ms(&r, "p50"), ms(&r, "p90"), ms(&r, "p99"), ms(&r, "max"));
    assert!(p50 > 0.0 && p50 <= p90 && p90 <= p99 && p99 <= max, "{r}");
    assert!(r["requests_per_sec"].as_f64().expect("rps") > 0.0, "{r}");

    let (ok, r) = bench(
        &orders,
        &[
            "--requests",
            "200",
            "--concurrency",
            "8",
            "--keys",
            "duplicate=1.0",
        ],
    );
    assert!(ok, "{r}");
    assert_eq!(n(&r, "requests"), 200, "{r}");
    assert_eq!(status_sum(&r), 200, "{r}");
    // A replay of a 201 is the same 201.
    assert_eq!(r["status"]["201"].as_u64(), Some(200), "{r}");
    // Keys are minted only while no request has completed yet: at most one per worker.
    let minted = n(&r, "keys_minted");
    assert!((1..=8).contains(&minted), "{r}");
    assert_eq!(n(&r, "keys_reused"), 200 - minted, "{r}");
    // Only completed keys are reused, so every reuse is answered by a replay.
    assert_eq!(n(&r, "replayed"), 200 - minted, "{r}");
    assert_eq!(r["keys"], "duplicate=1");
}

#[test]
fn the_baseline_without_the_layer_serves_requests_without_keys() {
    let baseline = serve(&["--idempotency", "off"]);
    let (ok, r) = bench(
        &format!("{}/v1/orders", baseline.url),
        &["--requests", "20", "--concurrency", "2", "--keys", "none"],
    );
    assert!(ok, "{r}");
    assert_eq!(r["status"]["201"].as_u64(), Some(20), "{r}");
    assert_eq!(status_sum(&r), 20, "{r}");
    assert_eq!(n(&r, "replayed"), 0, "{r}");
}

#[test]
fn keys_none_is_rejected_by_the_layer() {
    let with_layer = serve(&[]);
    let (ok, r) = bench(
        &format!("{}/v1/orders", with_layer.url),
        &["--requests", "20", "--concurrency", "2", "--keys", "none"],
    );
    // Every answer is 400 idempotency_key_missing: nothing succeeded, so the run fails (its
    // figures would measure errors, not the endpoint).
    assert!(!ok, "{r}");
    assert_eq!(r["status"]["400"].as_u64(), Some(20), "{r}");
    assert_eq!(status_sum(&r), 20, "{r}");
    assert_eq!(n(&r, "keys_minted") + n(&r, "keys_reused"), 0, "{r}");
}

#[test]
fn bad_arguments_fail_before_sending() {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args([
            "bench",
            "--url",
            "http://127.0.0.1:9/v1/orders",
            "--requests",
            "20000000",
        ])
        .output()
        .expect("run oncely bench");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--requests must be 1 to 10000000"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args([
            "bench",
            "--url",
            "http://127.0.0.1:9/v1/orders",
            "--keys",
            "duplicate=2",
        ])
        .output()
        .expect("run oncely bench");
    assert!(!out.status.success());
}

#[test]
fn an_unreachable_server_is_counted_as_transport_errors_and_fails() {
    // Port 9 (discard) on loopback: nothing listens here in the test environment.
    let (ok, r) = bench(
        "http://127.0.0.1:9/v1/orders",
        &[
            "--requests",
            "5",
            "--concurrency",
            "1",
            "--timeout-ms",
            "2000",
        ],
    );
    assert!(!ok, "{r}");
    assert_eq!(n(&r, "requests"), 5, "{r}");
    assert_eq!(n(&r, "responses"), 0, "{r}");
    assert_eq!(r["errors"]["connect"].as_u64(), Some(5), "{r}");
}
