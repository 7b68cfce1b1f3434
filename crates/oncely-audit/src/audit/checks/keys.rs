//! Key validation: malformed and missing keys.

use super::{MALFORMED_KEYS, MISSING_KEY, Rec};
use crate::audit::anti_patterns::{KEY_OPTIONAL, NO_KEY_VALIDATION, WRONG_ERROR_STATUS};
use crate::audit::probe::{Key, Prober, fresh_value};
use crate::audit::report::CheckResult;
use http::{HeaderValue, Method, StatusCode};

/// Sends four malformed keys; each must get `400`.
pub(crate) async fn malformed_keys(p: &Prober) -> CheckResult {
    let mut r = Rec::new(
        MALFORMED_KEYS,
        "empty, 256-character, non-ASCII and repeated keys are refused with 400",
    );
    let non_ascii = {
        // Raw UTF-8 bytes of "café" (obs-text on the wire): a header value, not visible ASCII.
        let mut v = b"oncely-audit-caf\xc3\xa9-".to_vec();
        v.extend_from_slice(uuid::Uuid::new_v4().simple().to_string().as_bytes());
        HeaderValue::from_bytes(&v).expect("obs-text bytes are a valid header value")
    };
    let long = HeaderValue::try_from("k".repeat(256)).expect("ASCII is a valid header value");
    let cases = [
        ("empty", Key::One(HeaderValue::from_static(""))),
        ("256 characters (the limit is 255)", Key::One(long)),
        ("non-ASCII", Key::One(non_ascii)),
        (
            "header repeated",
            Key::Repeated(fresh_value(), fresh_value()),
        ),
    ];
    let mut executed = Vec::new();
    let mut wrong = Vec::new();
    let mut unanswered = Vec::new();
    let mut plain = Vec::new();
    for (label, key) in cases {
        let probe = p.probe(key);
        match r.send(p, &probe).await {
            Err(e) => unanswered.push(format!("{label}: {e}")),
            Ok(ex) if ex.status == StatusCode::BAD_REQUEST => {
                if !ex.is_problem() {
                    plain.push(label);
                }
            }
            Ok(ex) if ex.status.is_success() => executed.push(format!("{label} ({})", ex.status)),
            Ok(ex) => wrong.push(format!("{label} ({})", ex.status)),
        }
    }
    if !executed.is_empty() {
        return r.fail(
            NO_KEY_VALIDATION,
            format!(
                "malformed keys were accepted and executed: {}. A key must be 1-255 visible ASCII \
                 characters in one header; anything else is a client bug to reject with 400, not a \
                 key to store.",
                executed.join(", ")
            ),
        );
    }
    if !wrong.is_empty() {
        return r.fail(
            WRONG_ERROR_STATUS,
            format!(
                "malformed keys were refused, but not with 400: {}.",
                wrong.join(", ")
            ),
        );
    }
    if !unanswered.is_empty() {
        return r.inconclusive(format!("no response for: {}", unanswered.join("; ")));
    }
    let mut detail = "all four malformed keys were refused with 400.".to_owned();
    if !plain.is_empty() {
        detail.push_str(&format!(
            " Note: no machine-readable problem body for: {} (RFC 9457 application/problem+json \
             with a code, e.g. idempotency_key_invalid, is recommended).",
            plain.join(", ")
        ));
    }
    r.pass(detail)
}

/// Sends the request without a key: `400` for `POST`/`PATCH`.
pub(crate) async fn missing_key(p: &Prober) -> CheckResult {
    let mut r = Rec::new(
        MISSING_KEY,
        "a request without a key is refused with 400 and a problem body",
    );
    let probe = p.probe(Key::Absent);
    let ex = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let requires = matches!(p.method, Method::POST | Method::PATCH);
    match ex.status {
        StatusCode::BAD_REQUEST if ex.is_problem() => r.pass(format!(
            "refused with 400 and a machine-readable body{}.",
            ex.error_code().map(|c| format!(" (code {c})")).unwrap_or_default()
        )),
        StatusCode::BAD_REQUEST => r.pass(
            "refused with 400. Note: the body is not machine-readable (RFC 9457 \
             application/problem+json with the code idempotency_key_missing is recommended).",
        ),
        s if s.is_success() && requires => r.fail(
            KEY_OPTIONAL,
            format!(
                "a {} without an Idempotency-Key was executed ({s}). Accepting keyless writes is a \
                 weaker contract: a client that forgets the key, or a library that drops it, gets \
                 no duplicate protection and no error telling it so. Require the key on \
                 state-changing endpoints (the IETF draft, section 2.7: 400 when missing).",
                p.method
            ),
        ),
        s if s.is_success() => r.pass(format!(
            "a {} without a key was executed ({s}); {} is idempotent by HTTP semantics (RFC 9110 \
             section 9.2.2), so a key is optional on it.",
            p.method, p.method
        )),
        s => r.fail(
            WRONG_ERROR_STATUS,
            format!("refused with {s}; a missing key on an endpoint that requires one is a 400 (IETF draft, section 2.7)."),
        ),
    }
}
