//! Gate 3, fleet: retrying clients (the Oncely SDK) through a proxy that drops responses after
//! the side effect and answers `503` with `Retry-After`, while the API server is killed and
//! restarted mid-run -> the number of duplicate side effects, which must be 0.

use super::env::Env;
use super::http::{payment_body, payments_of, until_final};
use super::proxy;
use super::{Gate, GateResult, GatesConfig};
use anyhow::Result;
use oncely_client::{IdempotencyKeyExt, OncelyRetry, RetryPolicy};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs the gate: `cfg.fleet_clients` clients making `cfg.fleet_calls` payments each.
pub async fn run(env: &Env, cfg: &GatesConfig) -> Result<GateResult> {
    let (clients, calls) = (cfg.fleet_clients, cfg.fleet_calls);
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
        name: Gate::Fleet.title().into(),
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
