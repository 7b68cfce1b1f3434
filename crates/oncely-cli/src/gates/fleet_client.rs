//! `oncely fleet-client`: one fleet client process on the Rust SDK, speaking the external-client
//! interface of `oncely gates --only fleet --client-command CMD` (see `gates/external.rs` and
//! `conformance/README.md`, "The fleet run"). It is the reference the Python and Node fleet
//! clients mirror, and what tests/fleet_external.rs runs as the external client.

use anyhow::{Context as _, Result};
use oncely_client::{IdempotencyKeyExt, OncelyRetry, RetryError, RetryPolicy, StopReason};
use std::io::Write as _;
use std::time::{Duration, Instant};

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set (run me through `oncely gates --only fleet --client-command`)")
    })
}

fn number(name: &str) -> Result<u64> {
    var(name)?
        .parse()
        .with_context(|| format!("{name} is not a number"))
}

/// The language-neutral error kind of a retry error (`conformance/retry/README.md`).
fn kind(stop: &RetryError) -> &'static str {
    match stop.reason() {
        StopReason::AttemptsExhausted { .. } => "attempts_exhausted",
        StopReason::DeadlineExhausted { .. } => "deadline_exhausted",
        StopReason::RetryAfterBeyondDeadline { .. } => "retry_after_beyond_deadline",
        StopReason::BudgetEmpty { .. } => "budget_empty",
        StopReason::OutcomeUnknown => "outcome_unknown",
        StopReason::InvalidIdempotencyKey(_) => "invalid_idempotency_key",
        StopReason::NotRetryable => "not_retryable",
        StopReason::BodyNotReplayable => "body_not_replayable",
        StopReason::NestedRetryLayer { .. } => "nested_retry_layer",
        _ => "other",
    }
}

/// Makes the calls the environment describes and prints one JSON line per call.
pub async fn run() -> Result<bool> {
    let url = var("ONCELY_FLEET_URL")?;
    let account = var("ONCELY_FLEET_ACCOUNT")?;
    let prefix = var("ONCELY_FLEET_KEY_PREFIX")?;
    let calls = number("ONCELY_FLEET_CALLS")?;
    let policy = RetryPolicy::new()
        .with_max_attempts(u32::try_from(number("ONCELY_FLEET_MAX_ATTEMPTS")?)?)
        .with_deadline(Duration::from_millis(number("ONCELY_FLEET_DEADLINE_MS")?))
        .with_attempt_timeout(Duration::from_millis(number(
            "ONCELY_FLEET_ATTEMPT_TIMEOUT_MS",
        )?))
        .with_full_jitter(
            Duration::from_millis(number("ONCELY_FLEET_BASE_MS")?),
            Duration::from_millis(number("ONCELY_FLEET_CAP_MS")?),
        );
    let client = OncelyRetry::new(policy).client()?;
    for n in 0..calls {
        let key = format!("{prefix}-{n}");
        let amount = 100 + n as i64;
        let body = serde_json::json!({
            "amount": amount, "currency": "EUR", "source": "tok_visa", "description": "gate",
        });
        let started = Instant::now();
        let result = client
            .post(format!("{url}/v1/payments"))
            .bearer_auth(&account)
            .idempotency_key(&key)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await;
        let (status, error) = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                // Read the whole answer, as a caller would.
                let _ = response.bytes().await;
                (Some(status), None)
            }
            Err(e) => match RetryError::from_middleware(&e) {
                Some(stop) => (stop.last_status().map(|s| s.as_u16()), Some(kind(stop))),
                None => (None, Some("transport")),
            },
        };
        let line = serde_json::json!({
            "key": key, "amount": amount,
            "status": if error.is_some() { None } else { status },
            "error": error, "ms": started.elapsed().as_secs_f64() * 1000.0,
        });
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(true)
}
