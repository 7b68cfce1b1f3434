//! Gate 2, crash recovery: the API server kills itself with SIGKILL right after each phase
//! commits (`--crash-after`), is restarted, and the client retries with the same key -> zero
//! repeated outside calls and one consistent final response. Then once more with no client
//! retry at all: the in-process completer finishes the request.

use super::env::Env;
use super::http::{payment_body, payments_of, post_payment, until_final};
use super::{Gate, GateResult, GatesConfig};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The recovery points the server is killed after, in the order a payment reaches them.
pub const POINTS: [&str; 4] = [
    "payment_recorded",
    "charge_created",
    "receipt_sent",
    "response_stored",
];

/// Runs the gate: a crash after each of [`POINTS`], then one finished by the completer.
pub async fn run(env: &Env, _cfg: &GatesConfig) -> Result<GateResult> {
    let mut runs = Vec::new();
    for point in POINTS {
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
        name: Gate::Crash.title().into(),
        passed,
        summary: format!(
            "{} crashes (after each phase, and one finished by the completer): {repeated} repeated outside calls, {} consistent final responses",
            runs.len(),
            runs.iter().filter(|r| r["passed"] == true).count()
        ),
        details: json!({ "runs": runs, "repeated_outside_calls": repeated }),
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
