//! Gate 4, rolling restart: retrying SDK clients keep sending payments while every API process
//! in turn is stopped the way a deploy stops it (SIGTERM: it drains and exits 0) and started
//! again -> zero duplicate side effects, zero lost payments, a clean exit for every restart, and
//! no retry ever waits on a lease.
//!
//! How "no retry waits on a lease" is measured: the servers run with the default 30-second
//! lease (not the gates' short one), so a key a restart left locked would answer its retries
//! `409 idempotency_request_in_flight` until that lease lapsed. The proxies in front of the
//! servers count every such answer: there must be none. (Requests that were running when the
//! drain began finish, or are suspended at their recovery point with their lease cut short;
//! requests that arrive during the drain are refused `503 server_shutting_down` before they
//! claim anything; either way the retry is answered at once.) The slowest call is reported too.

use super::clients::{sdk, sdk_metrics, settle, spawn_clients};
use super::env::Env;
use super::proxy;
use super::{Gate, GateResult, GatesConfig};
use anyhow::Result;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The lease the servers of this gate run with: the server's default, 30 seconds.
const LEASE_MS: u64 = 30_000;

/// How long each server may drain after SIGTERM (`--shutdown-grace-secs`): running payments
/// finish well inside it; anything slower is suspended at its recovery point.
const SHUTDOWN_GRACE_SECS: &str = "2";

/// Runs the gate: `cfg.fleet_clients` clients making `cfg.fleet_calls` payments each, spread
/// over the API processes (at least 2, so one always serves while another restarts), each
/// restarted once in turn.
pub async fn run(env: &Env, cfg: &GatesConfig) -> Result<GateResult> {
    let (clients, calls) = (cfg.fleet_clients, cfg.fleet_calls);
    let n = env.instances.max(2);
    let extra = ["--shutdown-grace-secs", SHUTDOWN_GRACE_SECS];
    let mut apis = Vec::new();
    let mut proxies = Vec::new();
    for i in 0..n {
        env.step(format!(
            "rolling restart: starting API server {}/{n}",
            i + 1
        ));
        let api = env.start_api_leased(LEASE_MS, &extra).await?;
        let none = proxy::Faults {
            drop_pct: 0,
            unavailable_pct: 0,
        };
        proxies.push(proxy::Proxy::start(api.url.clone(), none, 0x5eed + i as u64).await?);
        apis.push(Some(api));
    }
    let account = format!("acct_rolling_{}", uuid::Uuid::new_v4().simple());
    let retry = sdk();
    let total = clients * calls;
    let done = Arc::new(AtomicUsize::new(0));
    let bases: Vec<String> = proxies.iter().map(|p| p.url.clone()).collect();
    let tasks = spawn_clients(
        env,
        &retry,
        &bases,
        &account,
        "rolling",
        (clients, calls),
        &done,
    );
    // Restart the servers one by one, spread over the run: server i once (i + 1) / (n + 1) of
    // the payments are done.
    let mut exits = Vec::new();
    for i in 0..n {
        while done.load(Ordering::Relaxed) < total * (i + 1) / (n + 1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        env.step(format!(
            "rolling restart: SIGTERM to API server {}/{n}, then a new one",
            i + 1
        ));
        if let Some(api) = apis[i].take() {
            let status = api.terminate(Duration::from_secs(60)).await?;
            exits.push(status.code());
        }
        let api = env.start_api_leased(LEASE_MS, &extra).await?;
        proxies[i].set_upstream(api.url.clone());
        apis[i] = Some(api);
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.extend(t.await?);
    }
    let base = apis[0].as_ref().map(|a| a.url.clone()).unwrap_or_default();
    let tally = settle(env, &base, &account, &outcomes).await?;
    let sum = |f: fn(&proxy::ProxyStats) -> &std::sync::atomic::AtomicU64| -> u64 {
        proxies
            .iter()
            .map(|p| f(&p.stats).load(Ordering::Relaxed))
            .sum()
    };
    let in_flight = sum(|s| &s.in_flight);
    let shutting_down = sum(|s| &s.shutting_down);
    let upstream_down = sum(|s| &s.upstream_down);
    let clean_exits = exits.iter().filter(|c| **c == Some(0)).count();
    let passed = tally.exact(total) && clean_exits == n && in_flight == 0;
    for api in apis.into_iter().flatten() {
        api.kill().await?;
    }
    Ok(GateResult {
        name: Gate::Rolling.title().into(),
        passed,
        summary: format!(
            "{total} logical payments by {clients} SDK clients while {n} servers (30 s lease) were restarted one by one with SIGTERM ({clean_exits}/{n} exited 0): {} duplicate side effects, {} payments, {} lost; {in_flight} retries answered `409 in flight` (none may wait on a lease), {shutting_down} refused by a draining server and retried at once; slowest call {:.1} s",
            tally.duplicates,
            tally.payments,
            tally.unresolved,
            tally.slowest.as_secs_f64()
        ),
        details: json!({
            "logical_calls": total, "servers": n, "exit_codes": exits,
            "duplicate_side_effects": tally.duplicates, "payments": tally.payments,
            "charged_keys": tally.charged, "sdk_successes": tally.sdk_successes,
            "unresolved": tally.unresolved, "in_flight_409": in_flight,
            "shutting_down_503": shutting_down, "upstream_down_502": upstream_down,
            "slowest_call_seconds": tally.slowest.as_secs_f64(),
            "lease_ms": LEASE_MS, "shutdown_grace_secs": SHUTDOWN_GRACE_SECS,
            "sdk_metrics": sdk_metrics(&retry),
        }),
    })
}
