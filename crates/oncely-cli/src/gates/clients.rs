//! The retrying clients of the fleet runs (the fleet and rolling gates, and the fleet gate's
//! external clients): the SDK's settings, the clients, the settling of calls the SDK gave up
//! on, and the count of side effects at the processor.

use super::env::Env;
use super::http::{payment_body, payments_of, until_final};
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
    /// A call an external client reported (`--client-command`).
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
