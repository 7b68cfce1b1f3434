//! The requests the gates make, and what they keep of a response.

use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A valid payment request's body for `amount` minor units.
pub fn payment_body(amount: i64) -> Value {
    json!({"amount": amount, "currency": "EUR", "source": "tok_visa", "description": "gate"})
}

/// A response reduced to what a replay must reproduce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The status code.
    pub status: u16,
    /// The body's bytes.
    pub body: Vec<u8>,
    /// The problem's `code`, if the body has one.
    pub code: Option<String>,
    /// Whether `Retry-After` was sent.
    pub retry_after: bool,
    /// Whether `Idempotent-Replayed: true` was sent.
    pub replayed: bool,
    /// The `Location` header.
    pub location: Option<String>,
}

/// `POST /v1/payments` as `account` with `key`.
pub async fn post_payment(
    http: &reqwest::Client,
    base: &str,
    account: &str,
    key: &str,
    body: &Value,
) -> Result<Seen> {
    let resp = http
        .post(format!("{base}/v1/payments"))
        .bearer_auth(account)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let bytes = resp.bytes().await?.to_vec();
    let code = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned));
    Ok(Seen {
        status,
        body: bytes,
        code,
        retry_after: h.contains_key("retry-after"),
        replayed: h.get("idempotent-replayed").is_some_and(|v| v == "true"),
        location: h
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    })
}

/// Retries one request by hand (409 in flight -> wait) until it gets a final answer.
pub async fn until_final(
    http: &reqwest::Client,
    base: &str,
    account: &str,
    key: &str,
    body: &Value,
    limit: Duration,
) -> Result<(Seen, u32)> {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match post_payment(http, base, account, key, body).await {
            Ok(s)
                if s.status == 409
                    && s.code.as_deref() == Some("idempotency_request_in_flight") => {}
            Ok(s) if s.status == 503 => {}
            Ok(s) => return Ok((s, tries)),
            Err(_) => {}
        }
        if start.elapsed() > limit {
            bail!("no final answer for key {key} within {limit:?} ({tries} tries)");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `account`'s payments (`GET /v1/payments`).
pub async fn payments_of(http: &reqwest::Client, base: &str, account: &str) -> Result<Vec<Value>> {
    let v: Value = http
        .get(format!("{base}/v1/payments"))
        .bearer_auth(account)
        .send()
        .await?
        .json()
        .await?;
    Ok(v["data"].as_array().cloned().unwrap_or_default())
}
