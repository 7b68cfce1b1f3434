//! Server hardening, against a real `oncely serve` process: slow clients cannot exhaust it,
//! SIGTERM drains without leaving keys locked, it starts while its store is down, and the
//! smaller HTTP faults (auth scheme case, key-state endpoint, status URL mode).
//!
//! No timed assertions: every wait is a generous bound on something that must happen.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// A running `oncely serve` whose standard error is kept (for the log assertions).
struct Proc {
    child: Child,
    url: String,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
    fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_owned()
    }
}

/// Starts `oncely serve <args…> --addr 127.0.0.1:0` (through `sh -c` when `ulimit_n` is given)
/// and waits for its address.
fn spawn(args: &[&str], ulimit_n: Option<u32>) -> Proc {
    let bin = env!("CARGO_BIN_EXE_oncely");
    let mut cmd = match ulimit_n {
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = cmd
        .arg("serve")
        .args(args)
        .args(["--addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oncely");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().unwrap();
    let sink = stderr.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            eprint!("{text}");
            sink.lock().unwrap().push_str(&text);
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(u) = line.strip_prefix("oncely: listening on ") {
                    break u.trim().to_owned();
                }
            }
            _ => panic!("oncely exited before listening: {}", stderr.lock().unwrap()),
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Proc { child, url, stderr }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn pay(url: &str, key: &str) -> reqwest::Result<(u16, reqwest::header::HeaderMap, Value)> {
    pay_json(
        url,
        key,
        &json!({"amount": 700, "currency": "EUR", "source": "tok_visa"}),
    )
    .await
}

async fn pay_json(
    url: &str,
    key: &str,
    body: &Value,
) -> reqwest::Result<(u16, reqwest::header::HeaderMap, Value)> {
    let r = client()
        .post(format!("{url}/v1/payments"))
        .bearer_auth("acct_h")
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await?;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    Ok((status, headers, r.json().await.unwrap_or(Value::Null)))
}

/// Waits (up to 60 s) until `cond` holds.
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_and_new_clients_are_still_served() {
    // 150 connections send half a request head, more than the server can hold: its open-file
    // limit (160) caps the connection limit (1000 asked) at 96. It keeps serving a new client,
    // closes every half-sent connection after the header-read timeout, and never spins on
    // accept errors.
    let s = spawn(
        &[
            "--store",
            "memory",
            "--header-read-timeout-secs",
            "2",
            "--max-connections",
            "1000",
        ],
        Some(160),
    );
    let mut slow = Vec::new();
    for _ in 0..150 {
        let mut c = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
        c.write_all(b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nContent-Ty")
            .await
            .unwrap();
        slow.push(c);
    }
    let health = client()
        .get(format!("{}/healthz", s.url))
        .send()
        .await
        .expect("a new client is served while the half-sent connections are held");
    assert_eq!(health.status(), 200);
    for (i, mut c) in slow.into_iter().enumerate() {
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut buf)).await;
        assert!(
            closed.is_ok(),
            "half-sent connection {i} was still open after 60 s"
        );
    }
    let log = s.log();
    assert!(log.contains("--max-connections lowered to 96"), "{log}");
    assert!(log.contains("connection limit reached"), "{log}");
    assert!(
        log.matches("accept error").count() <= 2,
        "accept errors repeated: {log}"
    );
}

/// An outside card processor and mailer for the shutdown tests: `/charges` can be held until
/// released, and every call is counted.
#[derive(Clone, Default)]
struct Outside {
    hold: Arc<AtomicBool>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
    charges: Arc<AtomicUsize>,
}

async fn charge(State(o): State<Outside>) -> impl IntoResponse {
    let n = o.charges.fetch_add(1, Ordering::SeqCst) + 1;
    o.entered.notify_one();
    if o.hold.load(Ordering::SeqCst) {
        o.release.notified().await;
    }
    (
        StatusCode::CREATED,
        axum::Json(json!({"id": format!("ch_{n}"), "status": "succeeded"})),
    )
}

async fn start_outside(o: Outside) -> String {
    serve_outside(Router::new().route("/charges", post(charge)).with_state(o)).await
}

/// Serves `charges` (a router with the `/charges` route) plus a mailer on a free port.
async fn serve_outside(charges: Router) -> String {
    let app = charges.route(
        "/emails",
        post(|| async { (StatusCode::ACCEPTED, axum::Json(json!({"id": "em_1"}))) }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

fn sigterm(p: &Proc) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits (generously) for the process to exit; its exit status.
fn wait_exit(p: &mut Proc) -> std::process::ExitStatus {
    for _ in 0..600 {
        if let Some(st) = p.child.try_wait().unwrap() {
            return st;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("oncely did not exit within 60 s of SIGTERM: {}", p.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_running_request_finish_and_its_retry_replays_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("drain.sqlite3");
    let outside = Outside::default();
    outside.hold.store(true, Ordering::SeqCst);
    let outside_url = start_outside(outside.clone()).await;
    let args = [
        "--store",
        db.to_str().unwrap(),
        "--processor-url",
        &outside_url,
    ];
    let mut s = spawn(&args, None);

    let url = s.url.clone();
    let first = tokio::spawn(async move { pay(&url, "deploy-1").await });
    outside.entered.notified().await;
    sigterm(&s);
    // It stops accepting at once...
    let addr = s.addr();
    eventually("the listener closed", async || {
        tokio::net::TcpStream::connect(&addr).await.is_err()
    })
    .await;
    // ... while the running request finishes.
    outside.release.notify_one();
    let (status, _, body) = first
        .await
        .unwrap()
        .expect("the running request got its answer");
    assert_eq!(status, 201, "{body}");
    assert!(wait_exit(&mut s).success(), "{}", s.log());

    // Restarted: the retry replays at once (no lease to wait for), nothing runs again.
    let s = spawn(&args, None);
    let (status, headers, again) = pay(&s.url, "deploy-1").await.unwrap();
    assert_eq!(status, 201, "{again}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, body);
    assert_eq!(outside.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_still_running_at_the_shutdown_bound_is_suspended_and_resumed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bound.sqlite3");
    let outside = Outside::default();
    outside.hold.store(true, Ordering::SeqCst);
    let outside_url = start_outside(outside.clone()).await;
    let mut args = vec![
        "--store",
        db.to_str().unwrap(),
        "--processor-url",
        &outside_url,
    ];
    args.extend(["--shutdown-grace-secs", "1"]);
    let mut s = spawn(&args, None);

    let url = s.url.clone();
    let first = tokio::spawn(async move { pay(&url, "stuck-1").await });
    outside.entered.notified().await;
    sigterm(&s);
    assert!(wait_exit(&mut s).success(), "{}", s.log());
    assert!(s.log().contains("suspended"), "{}", s.log());
    let _ = first.await;

    // The processor answers again; the retry right after the restart resumes the request
    // (its lease of 30 s was cut short), it is not told to wait.
    outside.hold.store(false, Ordering::SeqCst);
    let s = spawn(&args, None);
    let state: Value = client()
        .get(format!("{}/v1/idempotency-keys/stuck-1", s.url))
        .bearer_auth("acct_h")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["state"], "in_flight", "{state}");
    assert_eq!(state["suspended"], true, "{state}");
    let (status, headers, body) = pay(&s.url, "stuck-1").await.unwrap();
    assert_eq!(status, 201, "{body}");
    assert!(headers.get("idempotent-replayed").is_none());
    let (_, headers, again) = pay(&s.url, "stuck-1").await.unwrap();
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, body);
}

async fn get(url: &str, path: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client()
        .get(format!("{url}{path}"))
        .bearer_auth("acct_h")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

/// While the store is down: alive, not ready, keyed writes fail closed with a retryable 503.
async fn assert_down(url: &str) {
    let live = client().get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let (status, headers, body) = get(url, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "not_ready");
    assert_eq!(headers["content-type"], "application/problem+json");
    let (status, headers, body) = pay(url, "while-down").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "idempotency_store_unavailable");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(headers["x-should-retry"], "true");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_starts_while_redis_is_down_and_serves_once_redis_answers() {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: redis-server is not installed");
        return;
    }
    let port = 7140;
    let dir = tempfile::tempdir().unwrap();
    let business = dir.path().join("business.sqlite3");
    let store = format!("redis://127.0.0.1:{port}/0");
    let s = spawn(
        &[
            "--store",
            &store,
            "--business-db",
            business.to_str().unwrap(),
        ],
        None,
    );
    assert_down(&s.url).await;

    // Redis comes up (persisting, as a key store must).
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--dir", dir.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _redis = Kill(&mut redis);
    let url = s.url.clone();
    eventually("/readyz turned ready", async || {
        get(&url, "/readyz").await.0 == 200
    })
    .await;
    let (status, _, body) = pay(&s.url, "after-up").await.unwrap();
    assert_eq!(status, 201, "{body}");
    let (_, headers, again) = pay(&s.url, "after-up").await.unwrap();
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_starts_while_postgres_is_down_and_answers_503_and_not_ready() {
    // Nothing listens on this port: the PostgreSQL store is "down" for the whole test.
    let store = format!("postgres://postgres@127.0.0.1:{}/oncely", free_port());
    let s = spawn(&["--store", &store], None);
    assert_down(&s.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_starts_while_mysql_is_down_and_answers_503_and_not_ready() {
    // Nothing listens on this port: the MySQL store is "down" for the whole test.
    let store = format!("mysql://root@127.0.0.1:{}/oncely", free_port());
    let s = spawn(&["--store", &store], None);
    assert_down(&s.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_faults_bearer_case_key_state_and_the_openapi_statuses() {
    let s = spawn(&["--store", "memory", "--in-flight-accepted"], None);
    // The auth scheme is case-insensitive (RFC 9110 section 11.1).
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = client()
            .get(format!("{}/v1/payments", s.url))
            .header("authorization", format!("{scheme} acct_h"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    let r = client()
        .get(format!("{}/v1/payments", s.url))
        .header("authorization", "Basic acct_h")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["x-should-retry"], "false");

    // A key with spaces is invalid in the path, never trimmed into another key.
    let (status, _, body) = pay(&s.url, "spaced").await.unwrap();
    assert_eq!(status, 201, "{body}");
    for path in [
        "/v1/idempotency-keys/%20spaced",
        "/v1/idempotency-keys/spaced%20",
    ] {
        let (status, headers, body) = get(&s.url, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["code"], "idempotency_key_invalid");
        assert_eq!(headers["x-should-retry"], "false");
    }
    let (status, _, body) = get(&s.url, "/v1/idempotency-keys/spaced").await;
    assert_eq!((status, body["state"].as_str()), (200, Some("complete")));

    // The document lists what the writes can answer.
    let (_, _, doc) = get(&s.url, "/openapi.json").await;
    let responses = &doc["paths"]["/v1/payments"]["post"]["responses"];
    for code in [
        "201", "202", "400", "401", "402", "409", "413", "415", "422", "503",
    ] {
        assert!(responses.get(code).is_some(), "{code} missing");
    }
    assert!(doc["paths"]["/readyz"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_refused_and_an_idle_connection_is_closed() {
    let s = spawn(
        &[
            "--store",
            "memory",
            "--body-read-timeout-secs",
            "1",
            "--idle-timeout-secs",
            "1",
            "--header-read-timeout-secs",
            "30",
        ],
        None,
    );
    // Whole head, 10 of 100 body bytes, then nothing: nothing runs, the client is told.
    let mut c = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(
        b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acct_h\r\n\
          Idempotency-Key: stalled-1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"amount\":",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "a stalled body held the connection for 60 s");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(
        text.contains("idempotency_request_body_unreadable"),
        "{text}"
    );
    let (_, _, state) = get(&s.url, "/v1/idempotency-keys/stalled-1").await;
    assert_eq!(state["state"], "absent", "nothing was claimed: {state}");

    // One request on a kept-alive connection, then silence: closed after the idle timeout
    // (well before the 30 s header-read timeout).
    let mut c = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 512];
    let n = c.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the idle connection was kept open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_problem_and_its_replay_say_not_to_retry() {
    let s = spawn(&["--store", "memory"], None);
    let decline = || {
        client()
            .post(format!("{}/v1/payments", s.url))
            .bearer_auth("acct_h")
            .header("idempotency-key", "declined-1")
            .json(&json!({"amount": 10, "currency": "EUR", "source": "tok_decline"}))
            .send()
    };
    let first = decline().await.unwrap();
    assert_eq!(first.status(), 402);
    assert_eq!(first.headers()["x-should-retry"], "false");
    let replay = decline().await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["x-should-retry"], "false");
    let body: Value = replay.json().await.unwrap();
    assert_eq!(body["code"], "card_declined");
}

#[test]
fn the_memory_and_redis_stores_leave_no_file_in_the_working_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let redis = format!("redis://127.0.0.1:{}/0", free_port());
    for store in ["memory", redis.as_str()] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
            .args(["serve", "--store", store, "--addr", "127.0.0.1:0"])
            .current_dir(cwd.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let listening = lines.any(|l| l.is_ok_and(|l| l.starts_with("oncely: listening on")));
        let _ = child.kill();
        let _ = child.wait();
        assert!(listening, "{store}: did not start");
        let files: Vec<_> = std::fs::read_dir(cwd.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            files.is_empty(),
            "{store} left {files:?} in the working directory"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_url_mode_answers_202_and_the_url_tells_the_state() {
    let outside = Outside::default();
    outside.hold.store(true, Ordering::SeqCst);
    let outside_url = start_outside(outside.clone()).await;
    let s = spawn(
        &[
            "--store",
            "memory",
            "--in-flight-accepted",
            "--processor-url",
            &outside_url,
        ],
        None,
    );
    let url = s.url.clone();
    let first = tokio::spawn(async move { pay(&url, "sdk/1").await });
    outside.entered.notified().await;
    let (status, headers, body) = pay(&s.url, "sdk/1").await.unwrap();
    assert_eq!(status, 202, "{body}");
    assert_eq!(headers["location"], "/v1/idempotency-keys/sdk%2F1");
    assert!(headers.contains_key("retry-after"));
    let (status, _, state) = get(&s.url, headers["location"].to_str().unwrap()).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["state"], "in_flight");
    assert_eq!(state["suspended"], false);
    outside.release.notify_one();
    let (status, _, paid) = first.await.unwrap().unwrap();
    assert_eq!(status, 201, "{paid}");
    let (_, _, state) = get(&s.url, "/v1/idempotency-keys/sdk%2F1").await;
    assert_eq!(state["state"], "complete", "{state}");
    assert_eq!(outside.charges.load(Ordering::SeqCst), 1);
}

/// An outside card processor for the completer tests, by the payment's `source`: `tok_fail`
/// always answers `503` (a system that stays down), `tok_once` answers `503` to its first call
/// only (a system that comes back), `tok_hold` waits until released, anything else succeeds.
/// Counts every charge call per source.
#[derive(Clone, Default)]
struct Flaky {
    calls: Arc<Mutex<std::collections::BTreeMap<String, usize>>>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl Flaky {
    fn calls(&self, source: &str) -> usize {
        self.calls.lock().unwrap().get(source).copied().unwrap_or(0)
    }
}

async fn flaky_charge(
    State(f): State<Flaky>,
    axum::Json(req): axum::Json<Value>,
) -> impl IntoResponse {
    let source = req["source"].as_str().unwrap_or_default().to_owned();
    let n = {
        let mut calls = f.calls.lock().unwrap();
        let n = calls.entry(source.clone()).or_default();
        *n += 1;
        *n
    };
    match source.as_str() {
        "tok_fail" => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": "processor_down"})),
        ),
        "tok_once" if n == 1 => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": "processor_down"})),
        ),
        "tok_hold" => {
            f.entered.notify_one();
            f.release.notified().await;
            (
                StatusCode::CREATED,
                axum::Json(json!({"id": format!("ch_hold_{n}"), "status": "succeeded"})),
            )
        }
        _ => (
            StatusCode::CREATED,
            axum::Json(json!({"id": format!("ch_{source}_{n}"), "status": "succeeded"})),
        ),
    }
}

async fn start_flaky(f: Flaky) -> String {
    serve_outside(
        Router::new()
            .route("/charges", post(flaky_charge))
            .with_state(f),
    )
    .await
}

async fn pay_from(url: &str, key: &str, source: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    pay_json(
        url,
        key,
        &json!({"amount": 900, "currency": "EUR", "source": source}),
    )
    .await
    .unwrap()
}

async fn metric(url: &str, name: &str) -> Option<u64> {
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The series summed over its label sets (the exporter labels the layer's counters by
    // route and store); `None` when the series is not there at all.
    let values: Vec<u64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.trim().parse().ok()))
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// docs/DESIGN.md, "Every request ends", at the level a user meets it: a payment whose card
/// processor stays down is suspended, re-driven by the in-process completer a bounded number of
/// times with backoff (the count is in the store: a restart in the middle does not reset it), then
/// marked for a person. The key-state endpoint says so, a client retry gets
/// `409 idempotency_request_needs_attention` and runs nothing, `/metrics` counts it, and the reaper
/// logs the record on every pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completer_gives_up_and_marks_the_payment_for_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("giveup.sqlite3");
    let flaky = Flaky::default();
    let outside = start_flaky(flaky.clone()).await;
    let args = [
        "--store",
        db.to_str().unwrap(),
        "--processor-url",
        &outside,
        "--completer-grace-ms",
        "0",
        "--completer-every-ms",
        "200",
        "--completer-max-attempts",
        "2",
        "--completer-backoff-secs",
        "3",
        "--completer-backoff-cap-secs",
        "3",
        "--reap-every-secs",
        "1",
    ];
    let mut s = spawn(&args, None);
    let (status, _, body) = pay_from(&s.url, "giveup-1", "tok_fail").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "upstream_unavailable");
    let state = async |url: &str| get(url, "/v1/idempotency-keys/giveup-1").await.2;
    let url = s.url.clone();
    eventually("the completer's first attempt", async || {
        state(&url).await["redrive_attempts"] == 1
    })
    .await;
    // A restart (deploy) in the middle: the count lives in the store.
    sigterm(&s);
    assert!(wait_exit(&mut s).success(), "{}", s.log());
    let s = spawn(&args, None);
    let url = s.url.clone();
    eventually("the payment marked for a person", async || {
        state(&url).await["needs_attention"] == true
    })
    .await;
    let st = state(&s.url).await;
    assert_eq!(st["state"], "in_flight", "{st}");
    assert_eq!(st["redrive_attempts"], 2, "{st}");
    assert!(st["marked_at"].as_i64().is_some(), "{st}");
    assert!(
        st["recovery_point"]
            .as_str()
            .is_some_and(|rp| rp.contains("recorded")),
        "{st}"
    );
    // The first attempt and exactly two re-drives reached the processor, across the restart.
    assert_eq!(flaky.calls("tok_fail"), 3);

    let (status, headers, body) = pay_from(&s.url, "giveup-1", "tok_fail").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "idempotency_request_needs_attention");
    assert_eq!(body["retryable"], false);
    assert_eq!(headers["x-should-retry"], "false");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(
        flaky.calls("tok_fail"),
        3,
        "a marked payment is never run again"
    );
    // Another body under the key is still a mismatch, never a hint about the first one.
    let (status, _, body) = pay_from(&s.url, "giveup-1", "tok_visa").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_mismatch"))
    );

    let url = s.url.clone();
    eventually("the metrics count the record", async || {
        metric(&url, "oncely_records_marked").await == Some(1)
    })
    .await;
    assert_eq!(
        metric(&s.url, "oncely_needs_attention_total").await,
        Some(1)
    );
    assert_eq!(
        metric(&s.url, "oncely_completer_marked_total").await,
        Some(1)
    );
    // The reaper repeats its line for the record on every pass.
    let log_lines = || {
        s.log()
            .lines()
            .filter(|l| {
                l.contains("marked for a person: the completer gave up") && l.contains("giveup-1")
            })
            .count()
    };
    eventually("the reaper logged the record twice", async || {
        log_lines() >= 2
    })
    .await;
}

/// The completer re-drives a suspended gRPC call, not only a REST one: a `CreatePayment` whose
/// charge failed is suspended at its recovery point (`UNAVAILABLE upstream_unavailable`); the
/// in-process completer re-drives the stored call, the charge is made once, and the record
/// completes with the call's gRPC answer, which a retry gets replayed (the `Payment` message,
/// `grpc-status: 0`, `idempotent-replayed: true`) without another charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completer_finishes_a_suspended_grpc_payment_with_its_grpc_answer() {
    use oncely_grpc::payments::v1::CreatePaymentRequest;
    use oncely_grpc::payments::v1::payments_client::PaymentsClient;
    use tonic_types::StatusExt as _;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("grpc-redrive.sqlite3");
    let flaky = Flaky::default();
    let outside = start_flaky(flaky.clone()).await;
    let s = spawn(
        &[
            "--store",
            db.to_str().unwrap(),
            "--processor-url",
            &outside,
            "--completer-grace-ms",
            "0",
            "--completer-every-ms",
            "200",
        ],
        None,
    );
    let call = || {
        let mut req = tonic::Request::new(CreatePaymentRequest {
            amount: 900,
            currency: "EUR".into(),
            source: "tok_once".into(),
            description: None,
        });
        let m = req.metadata_mut();
        m.insert("authorization", "Bearer acct_h".parse().unwrap());
        m.insert("idempotency-key", "grpc-redrive-1".parse().unwrap());
        req
    };
    let mut grpc = PaymentsClient::connect(s.url.clone()).await.unwrap();
    let e = grpc.create_payment(call()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(
        e.get_error_details().error_info().unwrap().reason,
        "UPSTREAM_UNAVAILABLE"
    );
    let url = s.url.clone();
    eventually("the completer finished the payment", async || {
        get(&url, "/v1/idempotency-keys/grpc-redrive-1").await.2["state"] == "complete"
    })
    .await;
    let state = get(&s.url, "/v1/idempotency-keys/grpc-redrive-1").await.2;
    assert_eq!(state["status"], 200, "{state}");
    // The refused first call, then the re-drive's one charge.
    assert_eq!(flaky.calls("tok_once"), 2);
    assert_eq!(
        metric(&s.url, "oncely_completer_completed_total").await,
        Some(1)
    );

    let replay = grpc.create_payment(call()).await.unwrap();
    assert_eq!(
        replay.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    let p = replay.into_inner();
    assert_eq!((p.amount, p.status.as_str()), (900, "succeeded"), "{p:?}");
    assert_eq!(p.charge_id.as_deref(), Some("ch_tok_once_2"));
    assert_eq!(flaky.calls("tok_once"), 2, "the replay made no charge");
    // The same payment through REST.
    let (status, _, rest) = get(&s.url, &format!("/v1/payments/{}", p.id)).await;
    assert_eq!(status, 200, "{rest}");
    assert_eq!(rest["charge_id"], "ch_tok_once_2");
}

/// docs/DESIGN.md, "Operating the server": a SIGTERM drain stops the in-process completer: while a
/// running request finishes, an abandoned record whose re-drive comes due is not re-driven through
/// the server that is shutting down (no attempt counted, no call, no failure logged); the next
/// process does it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_drain_stops_the_in_process_completer() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("drain-completer.sqlite3");
    let flaky = Flaky::default();
    let outside = start_flaky(flaky.clone()).await;
    let args = [
        "--store",
        db.to_str().unwrap(),
        "--processor-url",
        &outside,
        "--completer-grace-ms",
        "1500",
        "--completer-every-ms",
        "100",
        "--shutdown-grace-secs",
        "10",
    ];
    let mut s = spawn(&args, None);
    // Abandoned: its re-drive comes due 1.5 s after its lease was cut short.
    let (status, _, body) = pay_from(&s.url, "abandoned-1", "tok_fail").await;
    assert_eq!(status, 503, "{body}");
    // A request that keeps the drain going for longer than that.
    let url = s.url.clone();
    let held = tokio::spawn(async move { pay_from(&url, "held-1", "tok_hold").await });
    flaky.entered.notified().await;
    sigterm(&s);
    tokio::time::sleep(Duration::from_secs(3)).await;
    flaky.release.notify_one();
    let (status, _, body) = held.await.unwrap();
    assert_eq!(status, 201, "{body}");
    assert!(wait_exit(&mut s).success(), "{}", s.log());
    let log = s.log();
    assert!(!log.contains("re-drive"), "{log}");
    assert_eq!(flaky.calls("tok_fail"), 1, "no re-drive during the drain");
    assert!(log.contains("completer stopped"), "{log}");

    // The next process does it (its first attempt: none was counted during the drain).
    let s = spawn(&args, None);
    let url = s.url.clone();
    eventually("the next process re-drives it", async || {
        get(&url, "/v1/idempotency-keys/abandoned-1").await.2["redrive_attempts"] == 1
    })
    .await;
    eventually("its call reached the processor", async || {
        flaky.calls("tok_fail") == 2
    })
    .await;
}
