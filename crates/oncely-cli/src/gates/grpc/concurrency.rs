//! The concurrency gate over gRPC: N concurrent identical `CreatePayment` calls with one key
//! (spread over the API servers) -> exactly one payment, one charge and one receipt; every other
//! answer is `ABORTED` `IDEMPOTENCY_REQUEST_IN_FLIGHT` with `RetryInfo`, or the replay of the
//! one reply.

use super::{Call, channel, create, until_reply};
use crate::gates::env::Env;
use crate::gates::http::payments_of;
use crate::gates::{Gate, GateResult, GatesConfig};
use anyhow::Result;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

/// Runs the gate with `cfg.concurrency` calls.
pub async fn run(env: &Env, cfg: &GatesConfig) -> Result<GateResult> {
    let n = cfg.concurrency;
    let mut apis = Vec::new();
    for i in 0..env.instances {
        env.step(format!(
            "grpc concurrency: starting API server {}/{}",
            i + 1,
            env.instances
        ));
        apis.push(env.start_api(&[]).await?);
    }
    let channels = apis
        .iter()
        .map(|a| channel(&a.url))
        .collect::<Result<Vec<_>>>()?;
    let account = format!("acct_grpc_{}", uuid::Uuid::new_v4().simple());
    let key = "gate-grpc-concurrency-1";
    env.step(format!("grpc concurrency: {n} identical calls at once"));
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (ch, account, barrier) = (
            channels[i % channels.len()].clone(),
            account.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            create(&ch, &account, key, 4200).await
        }));
    }
    let mut seen: Vec<Call> = Vec::new();
    for t in tasks {
        seen.push(t.await?);
    }
    let (last, _) = until_reply(&channels[0], &account, key, 4200, Duration::from_secs(30)).await?;
    let replies: Vec<&Call> = seen.iter().filter(|c| c.code == Code::Ok).collect();
    let in_flight = seen
        .iter()
        .filter(|c| {
            c.code == Code::Aborted
                && c.reason.as_deref() == Some("IDEMPOTENCY_REQUEST_IN_FLIGHT")
                && c.retry_delay.is_some()
        })
        .count();
    let other: Vec<String> = seen
        .iter()
        .filter(|c| c.code != Code::Ok && !(c.code == Code::Aborted && c.retry_delay.is_some()))
        .map(|c| format!("{:?} {}", c.code, c.message))
        .collect();
    let identical = replies.iter().all(|c| c.payment == last.payment);
    let charges = env.ledger("charges").await?;
    let emails = env.ledger("emails").await?;
    let who = (account.clone(), key.to_owned());
    let charge = charges.get(&who).copied().unwrap_or((0, 0));
    let email = emails.get(&who).copied().unwrap_or((0, 0));
    let payments = payments_of(&env.http, &apis[0].url, &account).await?;
    let same_payment = payments.len() == 1
        && last.payment.as_ref().map(|p| p.id.as_str()) == payments[0]["id"].as_str();
    let passed = same_payment
        && charge.1 == 1
        && email.1 == 1
        && other.is_empty()
        && identical
        && last.replayed
        && replies.len() + in_flight == n;
    for a in apis {
        a.kill().await?;
    }
    Ok(GateResult {
        name: Gate::GrpcConcurrency.title().into(),
        passed,
        summary: format!(
            "{n} concurrent gRPC calls, one key, {} server(s): {} payment, {} charge, {} receipt; {} x OK (the original and {} replays, identical: {identical}), {in_flight} x ABORTED in flight, {} other",
            env.instances,
            payments.len(),
            charge.1,
            email.1,
            replies.len(),
            replies.len().saturating_sub(1),
            other.len()
        ),
        details: json!({
            "calls": n, "servers": env.instances, "payments": payments.len(),
            "charge_executions": charge.1, "charge_calls": charge.0, "receipt_executions": email.1,
            "ok": replies.len(), "aborted_in_flight": in_flight, "other": other,
            "replays_identical": identical, "final_replayed": last.replayed,
        }),
    })
}
