//! Gate 3, fleet: retrying clients (the Oncely SDK) through a proxy that drops responses after
//! the side effect and answers `503` with `Retry-After`, while the API server is killed and
//! restarted mid-run -> the number of duplicate side effects, which must be 0.
//!
//! The clients, their settling and the count of side effects are in [`clients`](super::clients)
//! (the [`rolling`](super::rolling) gate and the external fleet run use them too).

use super::clients::{sdk, sdk_metrics, settle, spawn_clients};
use super::env::Env;
use super::proxy;
use super::{Gate, GateResult, GatesConfig};
use anyhow::Result;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Runs the gate: `cfg.fleet_clients` clients making `cfg.fleet_calls` payments each.
pub async fn run(env: &Env, cfg: &GatesConfig) -> Result<GateResult> {
    if let Some(command) = &cfg.client_command {
        return super::external::run(env, cfg, command).await;
    }
    let (clients, calls) = (cfg.fleet_clients, cfg.fleet_calls);
    env.step("fleet: starting the API server and the fault proxy");
    let api = env.start_api(&[]).await?;
    let faults = proxy::Faults {
        drop_pct: 10,
        unavailable_pct: 5,
    };
    let proxy = proxy::Proxy::start(api.url.clone(), faults, 0x5eed).await?;
    let account = format!("acct_fleet_{}", uuid::Uuid::new_v4().simple());
    let retry = sdk();
    let total = clients * calls;
    let done = Arc::new(AtomicUsize::new(0));
    let tasks = spawn_clients(
        env,
        &retry,
        std::slice::from_ref(&proxy.url),
        &account,
        "fleet",
        (clients, calls),
        &done,
    );
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
    let tally = settle(env, &api.url, &account, &outcomes).await?;
    let stats = &proxy.stats;
    let passed = tally.exact(total);
    api.kill().await?;
    Ok(GateResult {
        name: Gate::Fleet.title().into(),
        passed,
        summary: format!(
            "{total} logical payments by {clients} SDK clients through {} dropped responses, {} injected 503s and a killed server: {} duplicate side effects, {} payments; {} finished within the SDK's own retries, the other {} stopped when the fleet-wide retry budget ran dry (as designed during an outage) and one later retry with the same key finished each",
            stats.dropped.load(Ordering::Relaxed),
            stats.unavailable.load(Ordering::Relaxed),
            tally.duplicates,
            tally.payments,
            tally.sdk_successes,
            total - tally.sdk_successes
        ),
        details: json!({
            "logical_calls": total, "duplicate_side_effects": tally.duplicates, "payments": tally.payments,
            "charged_keys": tally.charged, "sdk_successes": tally.sdk_successes, "unresolved": tally.unresolved,
            "dropped_responses": stats.dropped.load(Ordering::Relaxed),
            "injected_503": stats.unavailable.load(Ordering::Relaxed),
            "upstream_down_502": stats.upstream_down.load(Ordering::Relaxed),
            "forwarded": stats.forwarded.load(Ordering::Relaxed),
            "sdk_metrics": sdk_metrics(&retry),
        }),
    })
}
