//! The layer's own answers: a replay, the in-flight conflict (or its wait, or `202`), a
//! mismatch, a record marked for a person, the store unavailable, a refused key.

use crate::body::full_body;
use crate::config::Config;
use crate::dialect::code_response;
use crate::metrics::Counter;
use crate::store_call::timed;
use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_TYPE, HeaderValue};
use oncely_core::response::{Body, IDEMPOTENT_REPLAYED, replay_response};
use oncely_core::{
    ErrorCode, Fingerprint, InFlightBehavior, KeyError, RecordKey, RecordState, StoredResponse,
    clock::duration_millis,
};

/// `503 idempotency_store_unavailable`: a store call failed or timed out. A claim that timed
/// out may have been recorded all the same, so the detail never says the request did not
/// happen (docs/DESIGN.md, "Store outages fail closed").
pub(super) fn unavailable(config: &Config) -> Response<Body> {
    code_response(
        &*config.dialect,
        ErrorCode::StoreUnavailable,
        config.policy.profile,
        format!(
            "the idempotency key store did not answer in time (unreachable, failing, busy past its lock timeout, or out of connections), so this attempt did not run the request; the store may still have recorded its claim. Retry after {} second(s) with the same key, never a new one: a recorded claim is answered 409 idempotency_request_in_flight until its lease lapses, and the key keeps the request to one execution",
            config.policy.retry_after_secs
        ),
        config.policy.retry_after_secs,
    )
}

pub(super) fn mismatch(config: &Config) -> Response<Body> {
    config.metrics.inc(Counter::mismatches);
    code_response(
        &*config.dialect,
        ErrorCode::KeyMismatch,
        config.policy.profile,
        "this Idempotency-Key was already used for a different request (method, path, query, media type or body); use a new key for a new request",
        config.policy.retry_after_secs,
    )
}

/// `409 idempotency_request_needs_attention`: the completer gave up on the key's record and
/// marked it for a person; nothing is executed.
pub(super) fn needs_attention(
    config: &Config,
    id: &RecordKey,
    marked_at: oncely_core::UnixMillis,
    attempts: u32,
    recovery_point: Option<&str>,
) -> Response<Body> {
    config.metrics.inc(Counter::needs_attention);
    tracing::warn!(scope = %id.scope, key = %id.key, marked_at, attempts, recovery_point,
        "a retry of a request marked for a person was refused");
    let stopped = match recovery_point {
        Some(rp) => format!("after its step {rp:?}"),
        None => "before its first step completed".to_owned(),
    };
    code_response(
        &*config.dialect,
        ErrorCode::RequestNeedsAttention,
        config.policy.profile,
        format!(
            "the request with this Idempotency-Key was abandoned {stopped} and could not be finished automatically ({attempts} re-drive attempt(s)); it has been marked for a person (at {marked_at} ms since the Unix epoch) and will not be executed again. Do not retry it, not even with a new key: it may have taken effect part-way. Contact the operator of this API"
        ),
        config.policy.retry_after_secs,
    )
}

pub(super) fn replay(config: &Config, stored: &StoredResponse) -> Response<Body> {
    config.metrics.inc(Counter::replays);
    if stored.body_retained {
        return replay_response(stored);
    }
    let mut res = code_response(
        &*config.dialect,
        ErrorCode::ResponseNotRetained,
        config.policy.profile,
        format!(
            "the request with this Idempotency-Key already completed with status {}, but its response body was too large to keep; it was not executed again",
            stored.status
        ),
        config.policy.retry_after_secs,
    );
    res.headers_mut().insert(
        http::HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
    res
}

/// A duplicate found the key in flight: reject at once, answer `202` with the status URL, or
/// in wait mode poll for the result.
pub(super) async fn in_flight(
    config: &Config,
    id: &RecordKey,
    fingerprint: Fingerprint,
    lease_expires_at: oncely_core::UnixMillis,
) -> Response<Body> {
    if let InFlightBehavior::Wait { max, poll } = config.policy.in_flight {
        let deadline = tokio::time::Instant::now() + max;
        let poll = poll.max(std::time::Duration::from_millis(1));
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(poll.min(deadline - now)).await;
            match timed(config, config.store.get(id)).await {
                Err(e) => {
                    tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "polling an in-flight key failed; answering 503");
                    return unavailable(config);
                }
                Ok(Some(rec)) if rec.fingerprint == fingerprint => match &rec.state {
                    RecordState::InFlight { .. } => {}
                    RecordState::Complete {
                        response,
                        completed_at,
                    } => {
                        let window_end = completed_at
                            .saturating_add(duration_millis(config.policy.replay_window));
                        if config.clock.now_millis() < window_end {
                            return replay(config, response);
                        }
                        break;
                    }
                    // Released: nothing was stored; the client's retry will claim it.
                    RecordState::Released => break,
                    // A state this version does not know: answer 409 (never run the handler).
                    _ => break,
                },
                // Gone, or now held by a different request: let the client retry.
                Ok(_) => break,
            }
        }
    }
    config.metrics.inc(Counter::in_flight_conflicts);
    let retry_after = in_flight_retry_after(config, id, lease_expires_at).await;
    if let Some(url) = config.policy.in_flight.status_url(id.key.as_str()) {
        return accepted(id, &url, retry_after);
    }
    code_response(
        &*config.dialect,
        ErrorCode::RequestInFlight,
        config.policy.profile,
        format!(
            "a request with this Idempotency-Key is being processed; retry after {retry_after} second(s) with the same key"
        ),
        retry_after,
    )
}

/// The `Retry-After` of an in-flight answer: from the first request's age, its progress (a
/// committed recovery point) and its lease ([`oncely_core::in_flight_retry_after_secs`]). One
/// store read, bounded by the store timeout; without it, the lease alone sizes the answer.
async fn in_flight_retry_after(
    config: &Config,
    id: &RecordKey,
    lease_expires_at: oncely_core::UnixMillis,
) -> u64 {
    let now = config.clock.now_millis();
    let (elapsed, progressed, lease_end) = match timed(config, config.store.get(id)).await {
        Ok(Some(rec)) => match &rec.state {
            RecordState::InFlight {
                lease_expires_at,
                recovery_point,
            } => (
                now.saturating_sub(rec.created_at),
                recovery_point.is_some(),
                *lease_expires_at,
            ),
            // Finished meanwhile: the retry is answered at once.
            _ => (0, false, now),
        },
        _ => (
            now.saturating_sub(lease_expires_at - duration_millis(config.policy.lease)),
            false,
            lease_expires_at,
        ),
    };
    oncely_core::in_flight_retry_after_secs(
        elapsed,
        lease_end.saturating_sub(now),
        progressed,
        config.policy.retry_after_secs,
    )
}

/// `202 Accepted` with `Location: <status URL>` and `Retry-After` (the `Accepted` in-flight
/// mode): a JSON body naming the key, its state and the status URL.
fn accepted(id: &RecordKey, url: &str, retry_after: u64) -> Response<Body> {
    let body = serde_json::json!({
        "key": id.key.as_str(),
        "state": "in_flight",
        "code": ErrorCode::RequestInFlight.as_str(),
        "status_url": url,
        "detail": format!("a request with this Idempotency-Key is being processed; poll {url}, or retry the same request with the same key after {retry_after} second(s)"),
    });
    let mut res = Response::new(full_body(Bytes::from(body.to_string())));
    *res.status_mut() = http::StatusCode::ACCEPTED;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(url) {
        h.insert(http::header::LOCATION, v);
    }
    h.insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
    res
}

/// The answer to a missing or invalid key: `400 idempotency_key_missing` or
/// `idempotency_key_invalid`, naming the route's key source.
pub(super) fn key_refused(
    config: &Config,
    method: &http::Method,
    path: &str,
    e: &KeyError,
) -> Response<Body> {
    let policy = &config.policy;
    let source = &config.key_source;
    if *e == KeyError::Missing {
        config.metrics.inc(Counter::key_missing);
        let detail = if *source == crate::KeySource::default() {
            format!(
                "{method} {path} requires an Idempotency-Key header: mint a unique key per operation and reuse it on every retry"
            )
        } else {
            format!("{method} {path} reads its idempotency key from {source}, and it is missing")
        };
        return code_response(
            &*config.dialect,
            ErrorCode::KeyMissing,
            policy.profile,
            detail,
            policy.retry_after_secs,
        );
    }
    config.metrics.inc(Counter::key_invalid);
    code_response(
        &*config.dialect,
        ErrorCode::KeyInvalid,
        policy.profile,
        format!(
            "{}; a key is 1 to 255 visible ASCII characters, sent once",
            source.explain(e)
        ),
        policy.retry_after_secs,
    )
}
