//! Gate 1, concurrency: N concurrent identical requests with one key (spread over the API
//! servers) -> exactly one payment, one charge and one receipt; every other answer is `409
//! idempotency_request_in_flight` with `Retry-After` or a byte-identical replay.

use super::env::Env;
use super::http::{Seen, payment_body, payments_of, post_payment, until_final};
use super::{Gate, GateResult, GatesConfig};
use anyhow::Result;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Runs the gate with `cfg.concurrency` requests.
pub async fn run(env: &Env, cfg: &GatesConfig) -> Result<GateResult> {
    let n = cfg.concurrency;
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
        name: Gate::Concurrency.title().into(),
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
