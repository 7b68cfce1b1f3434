//! One request and the response it got, and what the checks read from a response: its
//! resource id, replay marker, error code, `Retry-After`, significant headers.

use super::evidence::truncate_body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode, header};
use std::time::Instant;

/// The response headers recognised as marking a replay when their value is `true` (or `1`):
/// `Idempotent-Replayed` (Stripe's convention, Oncely's contract) and the variants other
/// middlewares send.
pub(crate) const REPLAY_MARKERS: [&str; 5] = [
    "idempotent-replayed",
    "idempotency-replayed",
    "x-idempotent-replayed",
    "x-idempotency-replayed",
    "x-idempotency-replay",
];

/// Headers that legitimately differ between an original response and its replay (they describe
/// the exchange, not the result), so the replay-fidelity check does not compare them.
const PER_EXCHANGE_HEADERS: [&str; 14] = [
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "x-amzn-requestid",
    "x-amz-request-id",
    "x-amzn-trace-id",
    "x-runtime",
    "x-response-time",
    "x-served-by",
    "x-timer",
    "x-cache",
    "x-cache-hits",
    "x-envoy-upstream-service-time",
    "x-powered-by",
];

/// One request and the response it got.
#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    /// The request, as an evidence line.
    pub(crate) request: String,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) started: Instant,
    pub(crate) finished: Instant,
}

impl Exchange {
    /// The body as JSON, if it is JSON.
    pub(crate) fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The created resource's identifier: the body's top-level `id` (string or number), or
    /// `data.id`.
    pub(crate) fn id(&self) -> Option<String> {
        let v = self.json()?;
        id_of(&v).or_else(|| v.get("data").and_then(id_of))
    }

    /// The replay marker the response carries with the value `true` (or `1`), if any: one of
    /// [`REPLAY_MARKERS`] (`Idempotent-Replayed`, `Idempotency-Replayed`,
    /// `X-Idempotent-Replayed`, ...).
    pub(crate) fn replay_marker(&self) -> Option<&'static str> {
        REPLAY_MARKERS.into_iter().find(|m| {
            self.headers.get(*m).is_some_and(|v| {
                let v = v.as_bytes();
                v.eq_ignore_ascii_case(b"true") || v == b"1"
            })
        })
    }

    /// Whether the response carries a replay marker ([`Self::replay_marker`]).
    pub(crate) fn marked_replay(&self) -> bool {
        self.replay_marker().is_some()
    }

    /// The names of the cookies the response sets.
    pub(crate) fn set_cookie_names(&self) -> Vec<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| {
                let t = String::from_utf8_lossy(v.as_bytes()).into_owned();
                t.split(';')
                    .next()
                    .and_then(|nv| nv.split_once('='))
                    .map(|(n, _)| n.trim().to_owned())
            })
            .collect()
    }

    /// A machine-readable error code in the body: problem+json's `code` extension, a Stripe-style
    /// `error.code` / `error.type`, or a problem `type` other than `about:blank`.
    pub(crate) fn error_code(&self) -> Option<String> {
        let v = self.json()?;
        let s = |x: Option<&serde_json::Value>| x.and_then(|x| x.as_str()).map(str::to_owned);
        s(v.get("code"))
            .or_else(|| s(v.get("error").and_then(|e| e.get("code"))))
            .or_else(|| s(v.get("error").and_then(|e| e.get("type"))))
            .or_else(|| s(v.get("type")).filter(|t| t != "about:blank"))
            .filter(|c| !c.is_empty())
    }

    /// Whether the body is a problem document (RFC 9457) or at least a JSON error with a code.
    pub(crate) fn is_problem(&self) -> bool {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        (ct.starts_with("application/problem+json") && self.json().is_some())
            || self.error_code().is_some()
    }

    /// `Retry-After` as given, and whether it is valid (delta-seconds or an HTTP-date, RFC 9110
    /// section 10.2.3).
    pub(crate) fn retry_after(&self) -> Option<(String, bool)> {
        let v = self.headers.get(header::RETRY_AFTER)?;
        let text = String::from_utf8_lossy(v.as_bytes()).into_owned();
        let t = text.trim();
        let valid = (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            || httpdate::parse_http_date(t).is_ok();
        Some((text, valid))
    }

    /// How long the exchange took, in milliseconds.
    pub(crate) fn millis(&self) -> u128 {
        self.finished.duration_since(self.started).as_millis()
    }

    /// The response as an evidence line.
    pub(crate) fn response_line(&self) -> String {
        describe_response(self)
    }
}

/// Whether a response header should be identical in a replay: `Location`, `Content-Type`,
/// `Content-Location`, `ETag`, `Link`, and every `x-*` header except the per-exchange ones
/// (request ids, timings, cache diagnostics).
pub(crate) fn is_significant(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "location" | "content-type" | "content-location" | "etag" | "link"
    ) || (n.starts_with("x-")
        && !PER_EXCHANGE_HEADERS.contains(&n)
        && !REPLAY_MARKERS.contains(&n)
        && !n.starts_with("x-ratelimit"))
}

/// A JSON object's `id` member as text (a string, or a number written out).
pub(crate) fn id_of(v: &serde_json::Value) -> Option<String> {
    match v.get("id")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A response as an evidence line: `< 201 Created Location: ...; Content-Type: ... body: {...}
/// (123 bytes, 64 ms)`.
pub(crate) fn describe_response(ex: &Exchange) -> String {
    let mut s = format!("< {}", ex.status);
    let mut shown = Vec::new();
    for (name, value) in &ex.headers {
        let n = name.as_str();
        if is_significant(name) || n == "retry-after" || REPLAY_MARKERS.contains(&n) {
            shown.push(format!(
                "{name}: {}",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
    }
    if !shown.is_empty() {
        s.push(' ');
        s.push_str(&shown.join("; "));
    }
    s.push_str(&format!(
        " body: {} ({} bytes, {} ms)",
        truncate_body(&ex.body),
        ex.body.len(),
        ex.millis()
    ));
    s
}
