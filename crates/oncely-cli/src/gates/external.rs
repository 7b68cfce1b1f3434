//! The fleet gate with clients in any language: `oncely gates --only fleet --client-command CMD`.
//!
//! The same run as the fleet gate with the Rust SDK (the API server behind the fault proxy that drops
//! responses after the side effect and answers `503` with `Retry-After`, the server killed and
//! restarted a third of the way in, then the processor's ledger counted per key), except that
//! the retrying clients are `--fleet-clients` processes started as `sh -c CMD`, each a program
//! built on the SDK under test. The interface (`conformance/README.md`, "The fleet run"):
//!
//! - environment: `ONCELY_FLEET_URL` (the proxy's base URL), `ONCELY_FLEET_ACCOUNT` (send
//!   `Authorization: Bearer <it>`), `ONCELY_FLEET_CLIENT` (this client's index),
//!   `ONCELY_FLEET_KEY_PREFIX` and `ONCELY_FLEET_CALLS`: make the calls `n = 0 .. CALLS-1`, one
//!   after the other, each a `POST {URL}/v1/payments` with `Idempotency-Key: {PREFIX}-{n}` and
//!   the JSON body `{"amount": 100 + n, "currency": "EUR", "source": "tok_visa",
//!   "description": "gate"}`, through the SDK configured with `ONCELY_FLEET_MAX_ATTEMPTS`,
//!   `ONCELY_FLEET_DEADLINE_MS`, `ONCELY_FLEET_ATTEMPT_TIMEOUT_MS`, `ONCELY_FLEET_BASE_MS` and
//!   `ONCELY_FLEET_CAP_MS`;
//! - standard output: one JSON line per call as it ends, `{"key": "...", "amount": 100,
//!   "status": 201, "error": null, "ms": 12.5}` (`status` `null` and `error` the SDK's error
//!   kind when the call raised); anything else on standard output is an error; standard error
//!   is passed through;
//! - exit status 0 once every call has been reported.
//!
//! The gate passes when every client exited 0 and reported each of its calls once, and the
//! ledger shows every key charged once (calls the SDK gave up on get one patient retry
//! with the same key by the gate, as in the Rust fleet run): zero duplicate side effects.

use super::clients::{Call, sdk, settle};
use super::env::Env;
use super::proxy;
use super::{Gate, GateResult, GatesConfig};
use anyhow::{Context as _, Result};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long the client processes may take in all before they are killed and the gate fails.
const CLIENT_LIMIT: Duration = Duration::from_secs(600);

/// One line a client prints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    key: String,
    amount: i64,
    status: Option<u16>,
    #[serde(default)]
    error: Option<String>,
    ms: f64,
}

/// What one client process left.
struct Client {
    lines: Vec<Line>,
    problems: Vec<String>,
    exit: Option<i32>,
}

fn spawn(command: &str, vars: &[(&str, String)]) -> Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(super::child::stderr_for("fleet client"))
        .kill_on_drop(true);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn()
        .with_context(|| format!("start the client command {command:?}"))
}

async fn drive(mut child: tokio::process::Child, done: Arc<AtomicUsize>) -> Client {
    let mut out = Client {
        lines: Vec::new(),
        problems: Vec::new(),
        exit: None,
    };
    let Some(stdout) = child.stdout.take() else {
        out.problems.push("no standard output".into());
        return out;
    };
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(text)) if text.trim().is_empty() => {}
            Ok(Some(text)) => match serde_json::from_str::<Line>(&text) {
                Ok(line) => {
                    out.lines.push(line);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => out
                    .problems
                    .push(format!("not a call line ({e}): {text:?}")),
            },
            Ok(None) => break,
            Err(e) => {
                out.problems.push(format!("reading standard output: {e}"));
                break;
            }
        }
    }
    match child.wait().await {
        Ok(status) => out.exit = status.code(),
        Err(e) => out.problems.push(format!("waiting for it: {e}")),
    }
    out
}

/// Runs the fleet gate with `command` as the clients.
pub async fn run(env: &Env, cfg: &GatesConfig, command: &str) -> Result<GateResult> {
    let (clients, calls) = (cfg.fleet_clients, cfg.fleet_calls);
    env.step("fleet (external clients): starting the API server and the fault proxy");
    let api = env.start_api(&[]).await?;
    let faults = proxy::Faults {
        drop_pct: 10,
        unavailable_pct: 5,
    };
    let proxy = proxy::Proxy::start(api.url.clone(), faults, 0x5eed).await?;
    let account = format!("acct_fleet_ext_{}", uuid::Uuid::new_v4().simple());
    let policy = *sdk().policy();
    let total = clients * calls;
    let done = Arc::new(AtomicUsize::new(0));
    let prefix = |c: usize| format!("fleet-ext-{c}");
    let mut tasks = Vec::new();
    for c in 0..clients {
        let vars = [
            ("ONCELY_FLEET_URL", proxy.url.clone()),
            ("ONCELY_FLEET_ACCOUNT", account.clone()),
            ("ONCELY_FLEET_CLIENT", c.to_string()),
            ("ONCELY_FLEET_KEY_PREFIX", prefix(c)),
            ("ONCELY_FLEET_CALLS", calls.to_string()),
            (
                "ONCELY_FLEET_MAX_ATTEMPTS",
                policy.max_attempts().to_string(),
            ),
            (
                "ONCELY_FLEET_DEADLINE_MS",
                policy.deadline().as_millis().to_string(),
            ),
            (
                "ONCELY_FLEET_ATTEMPT_TIMEOUT_MS",
                policy.attempt_timeout().as_millis().to_string(),
            ),
            (
                "ONCELY_FLEET_BASE_MS",
                policy.backoff().base().as_millis().to_string(),
            ),
            (
                "ONCELY_FLEET_CAP_MS",
                policy.backoff().cap().as_millis().to_string(),
            ),
        ];
        let child = spawn(command, &vars)?;
        tasks.push(tokio::spawn(drive(child, done.clone())));
    }
    // Kill the API server a third of the way in and bring it back on a new port.
    env.step(format!(
        "fleet (external clients): {clients} clients running {command:?}"
    ));
    let started = tokio::time::Instant::now();
    while done.load(Ordering::Relaxed) < total / 3
        && !tasks.iter().all(tokio::task::JoinHandle::is_finished)
        && started.elapsed() < CLIENT_LIMIT
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.step("fleet (external clients): killing the API server mid-run");
    api.kill().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api = env.start_api(&[]).await?;
    proxy.set_upstream(api.url.clone());

    let mut problems = Vec::new();
    let mut outcomes = Vec::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let remaining = CLIENT_LIMIT.saturating_sub(started.elapsed());
    let joined = tokio::time::timeout(remaining, futures::future::join_all(tasks)).await;
    let Ok(results) = joined else {
        anyhow::bail!(
            "the client processes did not finish within {} s",
            CLIENT_LIMIT.as_secs()
        );
    };
    for (c, result) in results.into_iter().enumerate() {
        let client = result.context("a client task panicked")?;
        for p in client.problems {
            problems.push(format!("client {c}: {p}"));
        }
        if client.exit != Some(0) {
            problems.push(format!("client {c}: exit status {:?}", client.exit));
        }
        let mut seen = vec![0usize; calls];
        for line in client.lines {
            let n = line
                .key
                .strip_prefix(&format!("{}-", prefix(c)))
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n < calls);
            let Some(n) = n else {
                problems.push(format!(
                    "client {c}: a call with an unexpected key {:?}",
                    line.key
                ));
                continue;
            };
            seen[n] += 1;
            if line.amount != 100 + n as i64 {
                problems.push(format!(
                    "client {c}: key {} reported amount {}, expected {}",
                    line.key,
                    line.amount,
                    100 + n
                ));
            }
            if let Some(kind) = &line.error {
                *errors.entry(kind.clone()).or_default() += 1;
            }
            outcomes.push(Call::reported(
                line.key,
                line.amount,
                line.status == Some(201),
                Duration::from_secs_f64(line.ms.max(0.0) / 1000.0),
            ));
        }
        for (n, count) in seen.iter().enumerate() {
            if *count != 1 {
                problems.push(format!("client {c}: call {n} reported {count} times"));
            }
        }
    }
    let tally = settle(env, &api.url, &account, &outcomes).await?;
    let stats = &proxy.stats;
    let passed = problems.is_empty() && outcomes.len() == total && tally.exact(total);
    api.kill().await?;
    Ok(GateResult {
        name: Gate::Fleet.title().into(),
        passed,
        summary: format!(
            "{total} logical payments by {clients} external clients ({command:?}) through {} dropped responses, {} injected 503s and a killed server: {} duplicate side effects, {} payments; {} finished within the SDK's own retries, the other {} finished with one later retry with the same key{}",
            stats.dropped.load(Ordering::Relaxed),
            stats.unavailable.load(Ordering::Relaxed),
            tally.duplicates,
            tally.payments,
            tally.sdk_successes,
            outcomes.len() - tally.sdk_successes,
            if problems.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} client problems: {}",
                    problems.len(),
                    problems.join("; ")
                )
            }
        ),
        details: json!({
            "client_command": command, "external_clients": clients,
            "logical_calls": total, "reported_calls": outcomes.len(),
            "duplicate_side_effects": tally.duplicates, "payments": tally.payments,
            "charged_keys": tally.charged, "sdk_successes": tally.sdk_successes,
            "unresolved": tally.unresolved, "client_errors": errors, "client_problems": problems,
            "dropped_responses": stats.dropped.load(Ordering::Relaxed),
            "injected_503": stats.unavailable.load(Ordering::Relaxed),
            "upstream_down_502": stats.upstream_down.load(Ordering::Relaxed),
            "forwarded": stats.forwarded.load(Ordering::Relaxed),
        }),
    })
}
