//! Gate 3, fleet: retrying clients (the Oncely SDK) through a proxy that drops responses after
//! the side effect and answers `503` with `Retry-After`, while the API server is killed and
//! restarted mid-run -> the number of duplicate side effects, which must be 0.
//!
//! The pieces every fleet run shares (the SDK's settings, the clients, the settling and the
//! count of side effects) are here too; the [`rolling`](super::rolling) gate uses them.

use super::env::Env;
use super::http::{payment_body, payments_of, until_final};
use super::proxy;
use super::{Gate, GateResult, GatesConfig};
use anyhow::Result;
use oncely_client::{IdempotencyKeyExt, OncelyRetry, RetryPolicy};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The SDK as the fleet gates run it: generous bounds for gates that inject faults on purpose
/// (10 attempts, a 60-second deadline, 10 seconds per attempt, full jitter from 100 ms to 2 s);
/// the SDK's own defaults stay 3 attempts.
pub(super) fn sdk() -> OncelyRetry {
    OncelyRetry::new(
        RetryPolicy::new()
            .with_max_attempts(10)
            .with_deadline(Duration::from_secs(60))
            .with_attempt_timeout(Duration::from_secs(10))
            .with_full_jitter(Duration::from_millis(100), Duration::from_secs(2)),
    )
}

/// One logical payment of a fleet client.
pub(super) struct Call {
    /// Its `Idempotency-Key`.
    key: String,
    /// Its amount (the body is [`payment_body`] of it).
    amount: i64,
    /// Whether the SDK's call ended in `201`.
    ok: bool,
    /// How long the SDK's call took, retries included.
    took: Duration,
}

impl Call {
    /// A call an external client reported ([`super::external`]).
    pub(super) fn reported(key: String, amount: i64, ok: bool, took: Duration) -> Self {
        Self {
            key,
            amount,
            ok,
            took,
        }
    }
}

/// Starts `clients` fleet clients through `retry`: client `c` sends `calls` payments one after
/// the other, with keys `{tag}-{c}-{n}`, to `bases[c % bases.len()]`, as `account`; `done`
/// counts finished calls. Each task returns its calls.
pub(super) fn spawn_clients(
    env: &Env,
    retry: &OncelyRetry,
    bases: &[String],
    account: &str,
    tag: &'static str,
    (clients, calls): (usize, usize),
    done: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<Vec<Call>>> {
    let client = retry.clone().wrap(reqwest::Client::new());
    let total = clients * calls;
    (0..clients)
        .map(|c| {
            let (client, base, account, done, progress) = (
                client.clone(),
                bases[c % bases.len()].clone(),
                account.to_owned(),
                done.clone(),
                env.progress.clone(),
            );
            tokio::spawn(async move {
                let mut out = Vec::new();
                for n in 0..calls {
                    let key = format!("{tag}-{c}-{n}");
                    let amount = 100 + n as i64;
                    let started = Instant::now();
                    let r = client
                        .post(format!("{base}/v1/payments"))
                        .bearer_auth(&account)
                        .idempotency_key(key.clone())
                        .header("content-type", "application/json")
                        .body(payment_body(amount).to_string())
                        .send()
                        .await;
                    let ok = matches!(&r, Ok(resp) if resp.status().as_u16() == 201);
                    out.push(Call {
                        key,
                        amount,
                        ok,
                        took: started.elapsed(),
                    });
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    progress.set_message(format!("{tag}: {d}/{total} logical payments"));
                }
                out
            })
        })
        .collect()
}

/// What a fleet run left, once every call the SDK did not finish got one patient retry by hand.
pub(super) struct Tally {
    /// Calls the SDK finished with `201` by itself.
    pub sdk_successes: usize,
    /// Calls still without a `201` after the patient retry.
    pub unresolved: usize,
    /// Charges executed more than once for one key.
    pub duplicates: u64,
    /// Keys charged at least once.
    pub charged: usize,
    /// Payments the account has.
    pub payments: usize,
    /// The slowest SDK call (retries included).
    pub slowest: Duration,
}

impl Tally {
    /// Every payment made once, none lost.
    pub fn exact(&self, total: usize) -> bool {
        self.duplicates == 0
            && self.unresolved == 0
            && self.payments == total
            && self.charged == total
    }
}

/// Settles `calls` against the API at `base` and counts their side effects at the processor.
pub(super) async fn settle(env: &Env, base: &str, account: &str, calls: &[Call]) -> Result<Tally> {
    let mut unresolved = 0;
    for call in calls.iter().filter(|c| !c.ok) {
        match until_final(
            &env.http,
            base,
            account,
            &call.key,
            &payment_body(call.amount),
            Duration::from_secs(30),
        )
        .await
        {
            Ok((s, _)) if s.status == 201 => {}
            _ => unresolved += 1,
        }
    }
    let charges = env.ledger("charges").await?;
    let (mut duplicates, mut charged) = (0, 0);
    for call in calls {
        let (_, executions) = charges
            .get(&(account.to_owned(), call.key.clone()))
            .copied()
            .unwrap_or((0, 0));
        duplicates += executions.saturating_sub(1);
        charged += usize::from(executions > 0);
    }
    Ok(Tally {
        sdk_successes: calls.iter().filter(|c| c.ok).count(),
        unresolved,
        duplicates,
        charged,
        payments: payments_of(&env.http, base, account).await?.len(),
        slowest: calls.iter().map(|c| c.took).max().unwrap_or_default(),
    })
}

/// The SDK's counters, for a gate's details.
pub(super) fn sdk_metrics(retry: &OncelyRetry) -> Value {
    let m = retry.metrics().snapshot();
    json!({
        "calls": m.calls, "attempts": m.attempts, "retries": m.retries,
        "retry_after_waits": m.retry_after_waits, "keys_minted": m.keys_minted,
        "budget_exhausted": m.budget_exhausted, "deadline_exhausted": m.deadline_exhausted,
        "attempts_exhausted": m.attempts_exhausted, "outcome_unknown": m.outcome_unknown,
        "gave_up": m.gave_up,
    })
}

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
