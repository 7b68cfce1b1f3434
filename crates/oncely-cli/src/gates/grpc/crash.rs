//! The crash-recovery gate over gRPC: the API server kills itself with SIGKILL right after each
//! phase of a `CreatePayment` commits (`--crash-after`), is restarted, and the client retries
//! the call with the same key -> zero repeated outside calls, one payment, and a final reply
//! that replays identically.

use super::{channel, create, until_reply};
use crate::gates::crash::POINTS;
use crate::gates::env::Env;
use crate::gates::http::payments_of;
use crate::gates::{Gate, GateResult, GatesConfig};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::time::Duration;
use tonic::Code;

/// Runs the gate: a crash after each of the crash gate's recovery points.
pub async fn run(env: &Env, _cfg: &GatesConfig) -> Result<GateResult> {
    let mut runs = Vec::new();
    for point in POINTS {
        env.step(format!(
            "grpc crash recovery: SIGKILL after {point}, restart, retry"
        ));
        runs.push(crash_once(env, point).await?);
    }
    let passed = runs.iter().all(|r| r["passed"] == true);
    let repeated: u64 = runs
        .iter()
        .map(|r| {
            r["charge_calls"].as_u64().unwrap_or(0).saturating_sub(1)
                + r["receipt_calls"].as_u64().unwrap_or(0).saturating_sub(1)
        })
        .sum();
    Ok(GateResult {
        name: Gate::GrpcCrash.title().into(),
        passed,
        summary: format!(
            "{} crashes (after each phase), retried over gRPC: {repeated} repeated outside calls, {} consistent final replies",
            runs.len(),
            runs.iter().filter(|r| r["passed"] == true).count()
        ),
        details: json!({ "runs": runs, "repeated_outside_calls": repeated }),
    })
}

async fn crash_once(env: &Env, point: &str) -> Result<Value> {
    let account = format!("acct_grpc_crash_{}", uuid::Uuid::new_v4().simple());
    let key = format!("gate-grpc-crash-{point}");
    let mut api = env.start_api(&["--crash-after", point]).await?;
    let first = create(&channel(&api.url)?, &account, &key, 1999).await;
    if !api.wait_exit(Duration::from_secs(10)).await {
        bail!("the API server did not die after {point}");
    }
    let first_outcome = if first.code == Code::Ok {
        "OK (unexpected: the server should have died first)".to_owned()
    } else {
        format!("{:?} (the connection dropped)", first.code)
    };
    let api = env.start_api(&["--no-completer"]).await?;
    let ch = channel(&api.url)?;
    let (last, tries) = until_reply(&ch, &account, &key, 1999, Duration::from_secs(30)).await?;
    let replay = create(&ch, &account, &key, 1999).await;
    let charges = env.ledger("charges").await?;
    let emails = env.ledger("emails").await?;
    let who = (account.clone(), key.clone());
    let charge = charges.get(&who).copied().unwrap_or((0, 0));
    let email = emails.get(&who).copied().unwrap_or((0, 0));
    let payments = payments_of(&env.http, &api.url, &account).await?;
    let consistent = replay.code == Code::Ok
        && replay.payment == last.payment
        && replay.replayed
        && payments.len() == 1
        && last.payment.as_ref().map(|p| p.id.as_str()) == payments[0]["id"].as_str();
    let passed = consistent && charge == (1, 1) && email == (1, 1);
    api.kill().await?;
    Ok(json!({
        "recovery_point": point, "passed": passed, "first_attempt": first_outcome,
        "client_tries_after_restart": tries,
        "charge_calls": charge.0, "charge_executions": charge.1,
        "receipt_calls": email.0, "receipt_executions": email.1,
        "payments": payments.len(), "replay_identical": replay.payment == last.payment,
    }))
}
