//! Gate 7, webhook: the processor's signed `charge.succeeded` events, delivered at least once,
//! must each be applied once (one application per event id) by `POST /webhooks/processor` (counted as rows of the applied
//! events: one per application).
//!
//! 1. A payment is created; its charge emits an event, which the processor delivers by itself.
//! 2. A new event about the payment, never delivered yet, is delivered [`COPIES`] times at once,
//!    spread over the API servers: its first deliveries race each other.
//! 3. The API servers are killed (SIGKILL) and one is started with `--crash-after
//!    webhook_applied`: it applies a third event, commits, and kills itself before it answers.
//!    The processor sees no answer and redelivers; the servers are started again, the
//!    processor's retries reach them, and the event is delivered [`COPIES`] more times at once
//!    (and the first one a few more).
//!
//! Pass: each of the three events was applied once (one row each, three rows for the
//! payment), every delivery ended with a `2xx`, and the crash happened.

use super::child::Proc;
use super::env::Env;
use super::http::{payment_body, until_final};
use super::{Gate, GateResult, GatesConfig};
use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Concurrent deliveries of one event, per round.
pub const COPIES: usize = 50;

/// How long the gate waits for something the processor does by itself (a delivery).
const PATIENCE: Duration = Duration::from_secs(60);

/// Runs the gate.
pub async fn run(env: &Env, _cfg: &GatesConfig) -> Result<GateResult> {
    let p = env.processor_url().to_owned();
    env.http
        .delete(format!("{p}/webhook-endpoints"))
        .send()
        .await?;
    let apis = start_receivers(env, &[]).await?;
    let account = format!("acct_webhook_{}", uuid::Uuid::new_v4().simple());
    let key = "gate-webhook-1";
    env.step("webhook: a payment, and its charge.succeeded event");
    let (created, _) = until_final(
        &env.http,
        &apis[0].url,
        &account,
        key,
        &payment_body(3100),
        Duration::from_secs(30),
    )
    .await?;
    if created.status != 201 {
        bail!(
            "the payment was not created: {} {}",
            created.status,
            String::from_utf8_lossy(&created.body)
        );
    }
    let payment: Value = serde_json::from_slice(&created.body)?;
    let payment_id = payment["id"].as_str().context("payment id")?.to_owned();
    let charge_id = payment["charge_id"].as_str().unwrap_or_default().to_owned();
    let first = delivered_event(env, &p, |e| e["payment"] == payment_id.as_str()).await?;
    let event_about = |deliver: bool| {
        json!({"type": "charge.succeeded", "deliver": deliver, "data": {"object": {
            "id": charge_id, "object": "charge", "status": "succeeded",
            "metadata": {"account": account, "idempotency_key": key, "payment": payment_id},
        }}})
    };
    let racing = emit(env, &p, &event_about(false)).await?;
    env.step(format!(
        "webhook: {COPIES} concurrent first deliveries of {racing}"
    ));
    let round1 = deliver(env, &p, &racing, COPIES).await?;

    env.step("webhook: SIGKILL of the receivers; one that dies right after it applies an event");
    for a in apis {
        a.kill().await?;
    }
    env.http
        .delete(format!("{p}/webhook-endpoints"))
        .send()
        .await?;
    let mut crashing = start_receivers(env, &["--crash-after", "webhook_applied"])
        .await?
        .remove(0);
    let second = emit(env, &p, &event_about(true)).await?;
    let crashed = crashing.wait_exit(Duration::from_secs(30)).await;
    env.http
        .delete(format!("{p}/webhook-endpoints"))
        .send()
        .await?;
    env.step("webhook: receivers restarted; the processor's retries, then concurrent redeliveries");
    let apis = start_receivers(env, &[]).await?;
    delivered_event(env, &p, |e| e["id"] == second.as_str()).await?;
    let round2 = deliver(env, &p, &second, COPIES).await?;
    let round3 = deliver(env, &p, &first, COPIES / 5).await?;

    let rows: Value = env
        .http
        .get(format!("{}/v1/payments/{payment_id}/events", apis[0].url))
        .bearer_auth(&account)
        .send()
        .await?
        .json()
        .await?;
    let rows = rows["data"].as_array().cloned().unwrap_or_default();
    let applied = |id: &str| rows.iter().filter(|r| r["event_id"] == id).count();
    let (a0, a1, a2) = (applied(&first), applied(&racing), applied(&second));
    let attempts = events_attempts(env, &p, &[&first, &racing, &second]).await?;
    for a in apis {
        a.kill().await?;
    }
    let all_delivered = [&round1, &round2, &round3]
        .iter()
        .all(|r| r["delivered"] == r["copies"]);
    let passed = a0 == 1 && a1 == 1 && a2 == 1 && rows.len() == 3 && crashed && all_delivered;
    Ok(GateResult {
        name: Gate::Webhook.title().into(),
        passed,
        summary: format!(
            "3 events, {} delivery attempts ({COPIES} first deliveries at once, {COPIES} redeliveries after a receiver was SIGKILLed right after applying, {} server(s)): applied {a0}, {a1} and {a2} time(s); every delivery acknowledged: {all_delivered}",
            attempts.iter().map(|(_, n)| n).sum::<u64>(),
            env.instances,
        ),
        details: json!({
            "servers": env.instances, "payment": payment_id,
            "events": {
                first.clone(): {"applied": a0, "how": "delivered by the processor after the charge"},
                racing.clone(): {"applied": a1, "how": "first delivered 50 times at once"},
                second.clone(): {"applied": a2, "how": "applied by a receiver SIGKILLed before it answered, then redelivered"},
            },
            "rows_for_payment": rows.len(), "receiver_crashed": crashed,
            "concurrent_round": round1, "after_crash_round": round2, "late_round": round3,
            "attempts_per_event": attempts.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        }),
    })
}

/// Starts the API servers (`env.instances`, or one with `--crash-after`) and waits until the
/// processor lists each as a receiver.
async fn start_receivers(env: &Env, extra: &[&str]) -> Result<Vec<Proc>> {
    let n = if extra.is_empty() { env.instances } else { 1 };
    let mut apis = Vec::new();
    for i in 0..n {
        env.step(format!("webhook: starting API server {}/{n}", i + 1));
        apis.push(env.start_api(extra).await?);
    }
    let start = Instant::now();
    loop {
        let v: Value = env
            .http
            .get(format!("{}/webhook-endpoints", env.processor_url()))
            .send()
            .await?
            .json()
            .await?;
        let listed = v["endpoints"].as_array().cloned().unwrap_or_default();
        if apis.iter().all(|a| {
            listed
                .iter()
                .any(|e| e.as_str().is_some_and(|e| e.starts_with(&a.url)))
        }) {
            return Ok(apis);
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the API servers did not register with the processor within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the processor has an event matching `which` that a receiver acknowledged;
/// returns its id.
async fn delivered_event(env: &Env, p: &str, which: impl Fn(&Value) -> bool) -> Result<String> {
    let start = Instant::now();
    loop {
        let v = events(env, p).await?;
        let found = v["events"]
            .as_array()
            .and_then(|es| es.iter().find(|e| which(e)).cloned());
        if let Some(e) = &found
            && e["delivered"] == true
        {
            return Ok(e["id"].as_str().unwrap_or_default().to_owned());
        }
        if start.elapsed() > PATIENCE {
            bail!(
                "no acknowledged delivery within {} s (event: {})",
                PATIENCE.as_secs(),
                found.unwrap_or(Value::Null)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Emits an event (`POST /events`); its id.
async fn emit(env: &Env, p: &str, event: &Value) -> Result<String> {
    let v: Value = env
        .http
        .post(format!("{p}/events"))
        .json(event)
        .send()
        .await?
        .json()
        .await?;
    Ok(v["id"].as_str().context("event id")?.to_owned())
}

/// Delivers event `id` `copies` times at once; the processor's summary.
async fn deliver(env: &Env, p: &str, id: &str, copies: usize) -> Result<Value> {
    let mut v: Value = env
        .http
        .post(format!("{p}/events/{id}/deliver"))
        .json(&json!({"copies": copies}))
        .timeout(Duration::from_secs(180))
        .send()
        .await?
        .json()
        .await?;
    // The statuses, counted: `{"200": 48, "409": 2}`.
    let mut by_status = std::collections::BTreeMap::<String, u64>::new();
    for s in v["first_statuses"].as_array().cloned().unwrap_or_default() {
        *by_status.entry(s.to_string()).or_default() += 1;
    }
    v["first_statuses"] = json!(by_status);
    Ok(v)
}

/// The processor's events and their deliveries (`GET /events`).
async fn events(env: &Env, p: &str) -> Result<Value> {
    Ok(env
        .http
        .get(format!("{p}/events"))
        .send()
        .await?
        .json()
        .await?)
}

/// How many delivery attempts the processor made for each of `ids`.
async fn events_attempts(env: &Env, p: &str, ids: &[&str]) -> Result<Vec<(String, u64)>> {
    let v = events(env, p).await?;
    Ok(ids
        .iter()
        .map(|id| {
            let n = v["events"]
                .as_array()
                .and_then(|es| es.iter().find(|e| e["id"] == *id))
                .and_then(|e| e["attempts"].as_u64())
                .unwrap_or(0);
            ((*id).to_owned(), n)
        })
        .collect())
}
