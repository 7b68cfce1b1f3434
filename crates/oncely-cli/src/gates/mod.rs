//! `oncely gates`: the binary gates of the guarantee, end to end, on real processes.
//!
//! 1. **Concurrency**: N concurrent identical requests with one key -> exactly one payment,
//!    one charge and one receipt; every other answer is `409 idempotency_request_in_flight` with
//!    `Retry-After` or a byte-identical replay.
//! 2. **Crash recovery**: the API server kills itself with SIGKILL right after each phase commits
//!    (`--crash-after`), restarted, and the client retries with the same key -> zero repeated
//!    outside calls and one consistent final response. Then once more with no client retry at
//!    all: the in-process completer finishes the request.
//! 3. **Fleet**: retrying clients (the Oncely SDK) through a proxy that drops responses after
//!    the side effect and answers `503` with `Retry-After`, while the API server is killed and
//!    restarted mid-run -> the number of duplicate side effects, which must be 0.
//!
//! Everything runs on this machine: the processor and the API servers are child processes on
//! free loopback ports, and the store is a fresh embedded SQLite file unless `--store` says
//! otherwise (PostgreSQL then runs the API as 3 processes sharing it).

mod child;
mod proxy;

use crate::serve::StoreUrl;
use anyhow::{Context as _, Result, bail};
use child::Proc;
use indicatif::{ProgressBar, ProgressStyle};
use oncely_client::{IdempotencyKeyExt, OncelyRetry, RetryPolicy};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How to run the gates.
#[derive(Debug, Clone)]
pub struct GatesConfig {
    /// The key store; `None` = a fresh SQLite file in a temporary directory.
    pub store: Option<StoreUrl>,
    /// Concurrent identical requests in the concurrency gate (default 200).
    pub concurrency: usize,
    /// API server processes sharing the store (default 1 for SQLite, 3 for PostgreSQL).
    pub instances: Option<usize>,
    /// Clients in the fleet gate (default 20), each making `fleet_calls` logical payments.
    pub fleet_clients: usize,
    /// Logical payments per fleet client (default 10).
    pub fleet_calls: usize,
    /// Print JSON instead of a table.
    pub json: bool,
    /// Run only these gates (`concurrency`, `crash`, `fleet`); empty = all.
    pub only: Vec<String>,
}

impl Default for GatesConfig {
    fn default() -> Self {
        Self {
            store: None,
            concurrency: 200,
            instances: None,
            fleet_clients: 20,
            fleet_calls: 10,
            json: false,
            only: Vec::new(),
        }
    }
}

/// One gate's verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GateResult {
    /// The gate's name.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// One line of what was measured.
    pub summary: String,
    /// The measurements.
    pub details: Value,
}

/// The lease the gates give API servers (2 seconds), so that a crashed owner's claim lapses
/// quickly; the heartbeat renews it every 500 milliseconds while a handler runs.
const GATE_LEASE_MS: u64 = 2000;

struct Env {
    store: StoreUrl,
    processor: Proc,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
    instances: usize,
    progress: ProgressBar,
    /// `--json`: nothing but the JSON document.
    quiet: bool,
}

impl Env {
    fn api_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--store".into(),
            self.store.to_string(),
            "--processor-url".into(),
            self.processor.url.clone(),
            "--lease-ms".into(),
            GATE_LEASE_MS.to_string(),
            "--business-db".into(),
            self._dir
                .path()
                .join("business.sqlite3")
                .display()
                .to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    async fn start_api(&self, extra: &[&str]) -> Result<Proc> {
        Proc::start("the API server", &self.api_args(extra)).await
    }

    /// The processor's ledger for charges or emails, summed per `(account, Idempotency-Key)` of
    /// the API request that caused them (from the metadata the API sends along):
    /// (calls, executions). One logical request must make exactly one execution.
    async fn ledger(&self, what: &str) -> Result<BTreeMap<(String, String), (u64, u64)>> {
        let v: Value = self
            .http
            .get(format!("{}/{what}", self.processor.url))
            .send()
            .await?
            .json()
            .await?;
        let mut out = BTreeMap::new();
        for e in v["entries"].as_array().cloned().unwrap_or_default() {
            let who = (
                e["metadata"]["account"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["metadata"]["idempotency_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            let sum = out.entry(who).or_insert((0, 0));
            sum.0 += e["calls"].as_u64().unwrap_or(0);
            sum.1 += e["executions"].as_u64().unwrap_or(0);
        }
        Ok(out)
    }

    fn step(&self, msg: impl Into<String>) {
        let msg = msg.into();
        // Not a terminal (CI, a pipe): the spinner is hidden, so say each step on its own line.
        if self.progress.is_hidden() && !self.quiet {
            eprintln!("oncely gates: {msg}");
        }
        self.progress.set_message(msg);
        self.progress.tick();
    }
}

fn payment_body(amount: i64) -> Value {
    json!({"amount": amount, "currency": "EUR", "source": "tok_visa", "description": "gate"})
}

/// A response reduced to what a replay must reproduce.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: u16,
    body: Vec<u8>,
    code: Option<String>,
    retry_after: bool,
    replayed: bool,
    location: Option<String>,
}

async fn post_payment(
    http: &reqwest::Client,
    base: &str,
    account: &str,
    key: &str,
    body: &Value,
) -> Result<Seen> {
    let resp = http
        .post(format!("{base}/v1/payments"))
        .bearer_auth(account)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let bytes = resp.bytes().await?.to_vec();
    let code = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned));
    Ok(Seen {
        status,
        body: bytes,
        code,
        retry_after: h.contains_key("retry-after"),
        replayed: h.get("idempotent-replayed").is_some_and(|v| v == "true"),
        location: h
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    })
}

/// Retries one request by hand (409 in flight -> wait) until it gets a final answer.
async fn until_final(
    http: &reqwest::Client,
    base: &str,
    account: &str,
    key: &str,
    body: &Value,
    limit: Duration,
) -> Result<(Seen, u32)> {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match post_payment(http, base, account, key, body).await {
            Ok(s)
                if s.status == 409
                    && s.code.as_deref() == Some("idempotency_request_in_flight") => {}
            Ok(s) if s.status == 503 => {}
            Ok(s) => return Ok((s, tries)),
            Err(_) => {}
        }
        if start.elapsed() > limit {
            bail!("no final answer for key {key} within {limit:?} ({tries} tries)");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn payments_of(http: &reqwest::Client, base: &str, account: &str) -> Result<Vec<Value>> {
    let v: Value = http
        .get(format!("{base}/v1/payments"))
        .bearer_auth(account)
        .send()
        .await?
        .json()
        .await?;
    Ok(v["data"].as_array().cloned().unwrap_or_default())
}

/// Gate 1.
async fn concurrency_gate(env: &Env, n: usize) -> Result<GateResult> {
    let mut apis = Vec::new();
    for i in 0..env.instances {
        env.step(format!(
            "concurrency: starting API server {}/{}",
            i + 1,
            env.instances
        ));
        apis.push(env.start_api(&[]).await?);
    }
    let account = format!("acct_gate_{}", uuid::Uuid::new_v4().simple());
    let key = "gate-concurrency-1";
    let body = payment_body(4200);
    env.step(format!("concurrency: {n} identical requests at once"));
    let urls: Vec<String> = apis.iter().map(|a| a.url.clone()).collect();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (http, url, account, body, barrier) = (
            env.http.clone(),
            urls[i % urls.len()].clone(),
            account.clone(),
            body.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            post_payment(&http, &url, &account, key, &body).await
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await??);
    }
    // Once the dust settles, one more retry must replay the one result.
    let (final_seen, _) = until_final(
        &env.http,
        &urls[0],
        &account,
        key,
        &body,
        Duration::from_secs(30),
    )
    .await?;
    let created: Vec<&Seen> = seen.iter().filter(|s| s.status == 201).collect();
    let in_flight = seen
        .iter()
        .filter(|s| {
            s.status == 409
                && s.code.as_deref() == Some("idempotency_request_in_flight")
                && s.retry_after
        })
        .count();
    let other: Vec<String> = seen
        .iter()
        .filter(|s| s.status != 201 && !(s.status == 409 && s.retry_after))
        .map(|s| format!("{} {}", s.status, String::from_utf8_lossy(&s.body)))
        .collect();
    let identical = created
        .iter()
        .all(|s| s.body == final_seen.body && s.location == final_seen.location);
    let charges = env.ledger("charges").await?;
    let emails = env.ledger("emails").await?;
    let charge = charges
        .get(&(account.clone(), key.to_string()))
        .copied()
        .unwrap_or((0, 0));
    let email = emails
        .get(&(account.clone(), key.to_string()))
        .copied()
        .unwrap_or((0, 0));
    let payments = payments_of(&env.http, &urls[0], &account).await?;
    let passed = payments.len() == 1
        && charge.1 == 1
        && email.1 == 1
        && other.is_empty()
        && identical
        && final_seen.status == 201
        && final_seen.replayed
        && created.len() + in_flight == n;
    for a in apis {
        a.kill().await?;
    }
    Ok(GateResult {
        name: "concurrency".into(),
        passed,
        summary: format!(
            "{n} concurrent requests, one key, {} server(s): {} payment, {} charge, {} receipt; {} x 201 (the original and {} replays, byte-identical: {identical}), {in_flight} x 409 in flight, {} other",
            env.instances,
            payments.len(),
            charge.1,
            email.1,
            created.len(),
            created.len().saturating_sub(1),
            other.len()
        ),
        details: json!({
            "requests": n, "servers": env.instances, "payments": payments.len(),
            "charge_executions": charge.1, "charge_calls": charge.0, "receipt_executions": email.1,
            "created_201": created.len(), "in_flight_409": in_flight, "other": other,
            "replays_identical": identical, "final_replayed": final_seen.replayed,
        }),
    })
}

/// Gate 2, one recovery point: crash after it, restart, retry (or let the completer finish).
async fn crash_once(env: &Env, point: &str, completer: bool) -> Result<Value> {
    let account = format!("acct_crash_{}", uuid::Uuid::new_v4().simple());
    let key = format!("gate-crash-{point}");
    let body = payment_body(1999);
    let mut api = env.start_api(&["--crash-after", point]).await?;
    let first = post_payment(&env.http, &api.url, &account, &key, &body).await;
    let exited = api.wait_exit(Duration::from_secs(10)).await;
    if !exited {
        bail!("the API server did not die after {point}");
    }
    let first_outcome = match &first {
        Ok(s) => format!(
            "{} (unexpected: the server should have died first)",
            s.status
        ),
        Err(_) => "connection dropped".to_owned(),
    };
    let extra: Vec<&str> = if completer {
        vec!["--completer-grace-ms", "0", "--completer-every-ms", "300"]
    } else {
        // The client retries by itself here: keep the completer out of the way.
        vec!["--no-completer"]
    };
    let api = env.start_api(&extra).await?;
    let (final_seen, tries) = if completer {
        // No client retry: watch the key's state until the completer has finished it.
        let start = Instant::now();
        loop {
            let v: Value = env
                .http
                .get(format!("{}/v1/idempotency-keys/{key}", api.url))
                .bearer_auth(&account)
                .send()
                .await?
                .json()
                .await?;
            if v["state"] == "complete" {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the completer did not finish {key} within 30 s (state {v})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let s = post_payment(&env.http, &api.url, &account, &key, &body).await?;
        (s, 0)
    } else {
        until_final(
            &env.http,
            &api.url,
            &account,
            &key,
            &body,
            Duration::from_secs(30),
        )
        .await?
    };
    let replay = post_payment(&env.http, &api.url, &account, &key, &body).await?;
    let charges = env.ledger("charges").await?;
    let emails = env.ledger("emails").await?;
    let charge = charges
        .get(&(account.clone(), key.to_string()))
        .copied()
        .unwrap_or((0, 0));
    let email = emails
        .get(&(account.clone(), key.to_string()))
        .copied()
        .unwrap_or((0, 0));
    let payments = payments_of(&env.http, &api.url, &account).await?;
    let stored_id = serde_json::from_slice::<Value>(&final_seen.body)
        .ok()
        .map(|v| v["id"].clone());
    let consistent = final_seen.status == 201
        && replay.status == 201
        && replay.body == final_seen.body
        && replay.replayed
        && payments.len() == 1
        && stored_id == Some(payments[0]["id"].clone());
    let passed = consistent && charge == (1, 1) && email == (1, 1);
    api.kill().await?;
    Ok(json!({
        "recovery_point": point, "completer": completer, "passed": passed,
        "first_attempt": first_outcome, "client_tries_after_restart": tries,
        "charge_calls": charge.0, "charge_executions": charge.1,
        "receipt_calls": email.0, "receipt_executions": email.1,
        "payments": payments.len(), "final_status": final_seen.status, "replay_identical": replay.body == final_seen.body,
    }))
}

/// Gate 2.
async fn crash_gate(env: &Env) -> Result<GateResult> {
    let mut runs = Vec::new();
    for point in [
        "payment_recorded",
        "charge_created",
        "receipt_sent",
        "response_stored",
    ] {
        env.step(format!(
            "crash recovery: SIGKILL after {point}, restart, retry"
        ));
        runs.push(crash_once(env, point, false).await?);
    }
    env.step("crash recovery: SIGKILL after charge_created, no client retry: the completer");
    runs.push(crash_once(env, "charge_created", true).await?);
    let passed = runs.iter().all(|r| r["passed"] == true);
    let repeated: u64 = runs
        .iter()
        .map(|r| {
            r["charge_calls"].as_u64().unwrap_or(0).saturating_sub(1)
                + r["receipt_calls"].as_u64().unwrap_or(0).saturating_sub(1)
        })
        .sum();
    Ok(GateResult {
        name: "crash recovery".into(),
        passed,
        summary: format!(
            "{} crashes (after each phase, and one finished by the completer): {repeated} repeated outside calls, {} consistent final responses",
            runs.len(),
            runs.iter().filter(|r| r["passed"] == true).count()
        ),
        details: json!({ "runs": runs, "repeated_outside_calls": repeated }),
    })
}

/// Gate 3.
async fn fleet_gate(env: &Env, clients: usize, calls: usize) -> Result<GateResult> {
    env.step("fleet: starting the API server and the fault proxy");
    let api = env.start_api(&[]).await?;
    let faults = proxy::Faults {
        drop_pct: 10,
        unavailable_pct: 5,
    };
    let proxy = proxy::Proxy::start(api.url.clone(), faults, 0x5eed).await?;
    let account = format!("acct_fleet_{}", uuid::Uuid::new_v4().simple());
    // Generous bounds for a gate that injects faults on purpose; the defaults stay 3 attempts.
    let retry = OncelyRetry::new(
        RetryPolicy::new()
            .with_max_attempts(10)
            .with_deadline(Duration::from_secs(60))
            .with_attempt_timeout(Duration::from_secs(10))
            .with_full_jitter(Duration::from_millis(100), Duration::from_secs(2)),
    );
    let client = retry.clone().wrap(reqwest::Client::new());
    let total = clients * calls;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (client, base, account, done, progress) = (
            client.clone(),
            proxy.url.clone(),
            account.clone(),
            done.clone(),
            env.progress.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for n in 0..calls {
                let key = format!("fleet-{c}-{n}");
                let r = client
                    .post(format!("{base}/v1/payments"))
                    .bearer_auth(&account)
                    .idempotency_key(key.clone())
                    .header("content-type", "application/json")
                    .body(payment_body(100 + n as i64).to_string())
                    .send()
                    .await;
                let ok = matches!(&r, Ok(resp) if resp.status().as_u16() == 201);
                outcomes.push((key, ok));
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress.set_message(format!(
                    "fleet: {d}/{total} logical payments through injected faults"
                ));
            }
            outcomes
        }));
    }
    // Kill the API server in the middle of the run and bring it back on a new port.
    while done.load(Ordering::Relaxed) < total / 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.step("fleet: killing the API server mid-run");
    api.kill().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api = env.start_api(&[]).await?;
    proxy.set_upstream(api.url.clone());
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.extend(t.await?);
    }
    // Settle: every logical call that did not finish gets one patient retry, by hand.
    let mut unresolved = 0;
    for (key, ok) in &outcomes {
        if !ok {
            let body_n: i64 = key
                .rsplit('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            match until_final(
                &env.http,
                &api.url,
                &account,
                key,
                &payment_body(100 + body_n),
                Duration::from_secs(30),
            )
            .await
            {
                Ok((s, _)) if s.status == 201 => {}
                _ => unresolved += 1,
            }
        }
    }
    let charges = env.ledger("charges").await?;
    let mut duplicates = 0;
    let mut charged = 0;
    for (key, _) in &outcomes {
        let (_, executions) = charges
            .get(&(account.clone(), key.to_string()))
            .copied()
            .unwrap_or((0, 0));
        duplicates += executions.saturating_sub(1);
        charged += executions.min(1);
    }
    let payments = payments_of(&env.http, &api.url, &account).await?;
    let first_try_ok = outcomes.iter().filter(|(_, ok)| *ok).count();
    let m = retry.metrics().snapshot();
    let stats = &proxy.stats;
    let passed =
        duplicates == 0 && payments.len() == total && unresolved == 0 && charged as usize == total;
    api.kill().await?;
    Ok(GateResult {
        name: "fleet".into(),
        passed,
        summary: format!(
            "{total} logical payments by {clients} SDK clients through {} dropped responses, {} injected 503s and a killed server: {duplicates} duplicate side effects, {} payments; {first_try_ok} finished within the SDK's own retries, the other {} stopped when the fleet-wide retry budget ran dry (as designed during an outage) and one later retry with the same key finished each",
            stats.dropped.load(Ordering::Relaxed),
            stats.unavailable.load(Ordering::Relaxed),
            payments.len(),
            total - first_try_ok
        ),
        details: json!({
            "logical_calls": total, "duplicate_side_effects": duplicates, "payments": payments.len(),
            "charged_keys": charged, "sdk_successes": first_try_ok, "unresolved": unresolved,
            "dropped_responses": stats.dropped.load(Ordering::Relaxed),
            "injected_503": stats.unavailable.load(Ordering::Relaxed),
            "upstream_down_502": stats.upstream_down.load(Ordering::Relaxed),
            "forwarded": stats.forwarded.load(Ordering::Relaxed),
            "sdk_metrics": {
                "calls": m.calls, "attempts": m.attempts, "retries": m.retries,
                "retry_after_waits": m.retry_after_waits, "keys_minted": m.keys_minted,
                "budget_exhausted": m.budget_exhausted, "deadline_exhausted": m.deadline_exhausted,
                "attempts_exhausted": m.attempts_exhausted, "outcome_unknown": m.outcome_unknown,
                "gave_up": m.gave_up,
            },
        }),
    })
}

/// Runs every gate; returns whether all passed.
pub async fn run(cfg: GatesConfig) -> Result<bool> {
    child::resolve_executable()?;
    let dir = tempfile::tempdir().context("make a temporary directory")?;
    let store = match &cfg.store {
        Some(s) => s.clone(),
        None => StoreUrl::Sqlite(dir.path().join("oncely.sqlite3").display().to_string()),
    };
    let instances = cfg.instances.unwrap_or(match store {
        StoreUrl::Postgres(_) => 3,
        _ => 1,
    });
    if let Some(bad) = cfg
        .only
        .iter()
        .find(|o| !["concurrency", "crash", "fleet"].contains(&o.as_str()))
    {
        bail!("unknown gate {bad:?}: expected concurrency, crash or fleet");
    }
    if cfg.concurrency == 0 {
        bail!("-n must be at least 1 (it is the number of concurrent identical requests)");
    }
    if matches!(store, StoreUrl::Postgres(_) | StoreUrl::Redis(_)) {
        // A store that cannot be reached is a setup error (exit 2), not a failed gate.
        crate::serve::open_store(&store)
            .await
            .with_context(|| format!("the key store {store} cannot be used"))?;
    }
    if store == StoreUrl::Memory {
        bail!(
            "the gates restart servers, so they need a store that outlives a process: use a file path, postgres://…, redis://… or redis+cluster://…"
        );
    }
    let progress = if cfg.json {
        ProgressBar::hidden()
    } else {
        let p = ProgressBar::new_spinner();
        p.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        p.enable_steady_tick(Duration::from_millis(120));
        p
    };
    progress.set_message("starting the outside card processor and mailer");
    let processor = Proc::start("the processor", &["processor".to_owned()]).await?;
    let env = Env {
        store: store.clone(),
        processor,
        _dir: dir,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build()?,
        instances,
        progress: progress.clone(),
        quiet: cfg.json,
    };
    let started = Instant::now();
    let mut results = Vec::new();
    for gate in 0..3 {
        let short = ["concurrency", "crash", "fleet"][gate];
        if !cfg.only.is_empty() && !cfg.only.iter().any(|o| o == short) {
            continue;
        }
        let t = Instant::now();
        let r = match gate {
            0 => concurrency_gate(&env, cfg.concurrency).await,
            1 => crash_gate(&env).await,
            _ => fleet_gate(&env, cfg.fleet_clients, cfg.fleet_calls).await,
        };
        let mut r = r.unwrap_or_else(|e| GateResult {
            name: ["concurrency", "crash recovery", "fleet"][gate].into(),
            passed: false,
            summary: format!("could not run: {e:#}"),
            details: json!({"error": format!("{e:#}")}),
        });
        r.details["seconds"] = json!(t.elapsed().as_secs_f64());
        if !cfg.json {
            let line = format!(
                "{} {}: {}",
                if r.passed { "PASS" } else { "FAIL" },
                r.name,
                r.summary
            );
            if progress.is_hidden() {
                eprintln!("{line}");
            } else {
                progress.println(line);
            }
        }
        results.push(r);
    }
    progress.finish_and_clear();
    let passed = results.iter().all(|r| r.passed);
    if cfg.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "store": store.to_string(), "passed": passed, "seconds": started.elapsed().as_secs_f64(), "gates": results,
            }))?
        );
    } else {
        println!();
        println!("{:<16} {:<6} measured", "gate", "result");
        println!("{:<16} {:<6} --------", "----", "------");
        for r in &results {
            println!(
                "{:<16} {:<6} {}",
                r.name,
                if r.passed { "PASS" } else { "FAIL" },
                r.summary
            );
        }
        println!();
        println!(
            "store: {store}; {} in {:.1} s",
            if passed {
                "all gates passed"
            } else {
                "SOME GATES FAILED"
            },
            started.elapsed().as_secs_f64()
        );
    }
    if !passed && !cfg.json {
        for r in results.iter().filter(|r| !r.passed) {
            eprintln!("{} details: {}", r.name, r.details);
        }
    }
    Ok(passed)
}
