//! The baseline key sent again with something changed: the body's bytes, the body's meaning,
//! the endpoint, the caller.

use super::{
    Baseline, CANONICAL_JSON, CROSS_ENDPOINT, CROSS_SCOPE, PAYLOAD_MISMATCH, Rec, delta,
    executed_again, ident, same_response,
};
use crate::audit::anti_patterns::{
    BYTE_LEVEL_KEYING, CROSS_ENDPOINT_REPLAY, DUPLICATE_AS_SERVER_ERROR, FALSE_MISMATCH,
    GLOBAL_KEY_SCOPE, MISMATCH_EXECUTED, REPLAY_DIFFERS, SILENT_MISMATCH_REPLAY,
    WRONG_ERROR_STATUS,
};
use crate::audit::body::{mutated, reordered};
use crate::audit::probe::{Cred, Key, Probe, Prober};
use crate::audit::report::CheckResult;
use bytes::Bytes;
use http::{Method, StatusCode};

const NO_BASELINE: &str = "the baseline request did not succeed (see replay-fidelity), so there is nothing to compare with";

/// The baseline key with the same JSON written differently must replay.
pub(crate) async fn canonical_json(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        CANONICAL_JSON,
        "the same JSON with keys reordered and other whitespace replays (no false mismatch, no new execution)",
    );
    if p.json.is_null() {
        return r.not_applicable("no request body is configured");
    }
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    let mut probe = p.probe(Key::One(base.key.clone()));
    probe.body = Some(Bytes::from(reordered(&p.json)));
    let before = r.count(p).await;
    let res = r.send(p, &probe).await;
    let after = r.count(p).await;
    let ex = match res {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let d = delta(before, after);
    let o = &base.original;
    if same_response(o, &ex) && d.is_none_or(|d| d <= 0) {
        return r.pass(format!(
            "the reordered body got the original response ({}, {}): the fingerprint compares JSON \
             values, not bytes.",
            ex.status,
            ident(&ex)
        ));
    }
    if ex.status.is_client_error() {
        return r.fail(
            FALSE_MISMATCH,
            format!(
                "the same JSON value, serialized differently, was rejected with {}: the \
                 fingerprint hashes the body's bytes, so a client whose retry re-serializes the \
                 body (another key order, other whitespace) is refused (canonical JSON, RFC 8785, \
                 avoids this).",
                ex.status
            ),
        );
    }
    if ex.status.is_server_error() {
        return r.fail(
            DUPLICATE_AS_SERVER_ERROR,
            format!("the retry got {}.", ex.status),
        );
    }
    if ex.status.is_success() && executed_again(o, &ex, d) == Some(true) {
        return r.fail(
            BYTE_LEVEL_KEYING,
            format!(
                "the same JSON value, serialized differently, executed again ({} then {}): the \
                 body's bytes act as part of the key.",
                ident(o),
                ident(&ex)
            ),
        );
    }
    r.fail(
        REPLAY_DIFFERS,
        format!(
            "the retry got {} with {}, not the original {} with {}.",
            ex.status,
            ident(&ex),
            o.status,
            ident(o)
        ),
    )
}

/// The baseline key with a different body must be refused with a 4xx.
pub(crate) async fn payload_mismatch(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        PAYLOAD_MISMATCH,
        "the same key with a different body is refused with a 4xx (422 preferred), never replayed, never executed",
    );
    let Some((changed, change)) = mutated(&p.json) else {
        return r.not_applicable(
            "the configured body is not a JSON object or array, so it cannot be varied",
        );
    };
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    let mut probe = p.probe(Key::One(base.key.clone()));
    probe.body = Some(Bytes::from(
        serde_json::to_vec(&changed).expect("a Value serializes"),
    ));
    r.note(format!("the body was varied: {change}"));
    let before = r.count(p).await;
    let res = r.send(p, &probe).await;
    let after = r.count(p).await;
    let ex = match res {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let d = delta(before, after);
    let o = &base.original;
    if d.is_some_and(|d| d > 0) {
        return r.fail(
            MISMATCH_EXECUTED,
            format!(
                "the count URL grew by {} after the different body was sent with a used key ({}).",
                d.unwrap_or_default(),
                ex.status
            ),
        );
    }
    let code = ex
        .error_code()
        .map(|c| format!(" (code {c})"))
        .unwrap_or_default();
    match ex.status {
        StatusCode::UNPROCESSABLE_ENTITY => r.pass(format!(
            "refused with 422{code}, as the IETF draft (section 2.7) specifies; the stored response was not replayed."
        )),
        StatusCode::BAD_REQUEST => r.pass(format!(
            "refused with 400{code}. Accepted (Stripe's choice), but without a specific code a 400 \
             cannot be told from a validation error of the varied field; 422 is the IETF draft's status."
        )),
        StatusCode::CONFLICT => r.pass(format!(
            "refused with 409{code}. Accepted (Resend's choice), but many generic retry loops retry \
             every 409 and a mismatch is a client bug that must not be retried; 422 is the IETF draft's status."
        )),
        s if s.is_client_error() => r.pass(format!(
            "refused with {s}{code}, an unusual status for a mismatch (422 is the IETF draft's)."
        )),
        s if s.is_server_error() => r.fail(
            DUPLICATE_AS_SERVER_ERROR,
            format!("the different body under a used key got {s}{code}; a mismatch is the client's error: 422."),
        ),
        _ if ex.marked_replay() || same_response(o, &ex) || (ex.id().is_some() && ex.id() == o.id()) => r.fail(
            SILENT_MISMATCH_REPLAY,
            format!(
                "a different body ({change}) under a used key got the stored response ({}, {}): the \
                 client believes its new request succeeded, and it never ran.",
                ex.status,
                ident(&ex)
            ),
        ),
        _ => r.fail(
            MISMATCH_EXECUTED,
            format!(
                "a different body ({change}) under a used key got {} with {} (the original had {}): \
                 it ran as a new request instead of being refused.",
                ex.status,
                ident(&ex),
                ident(o)
            ),
        ),
    }
}

/// The baseline key on the other endpoint must not replay the first endpoint's response.
pub(crate) async fn cross_endpoint(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        CROSS_ENDPOINT,
        "the same key on another endpoint does not replay the first endpoint's response",
    );
    let Some((method, url)) = p.targets.other.clone() else {
        return r.not_applicable("no other endpoint is configured");
    };
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    let has_body = matches!(method, Method::POST | Method::PUT | Method::PATCH);
    let probe = Probe {
        method,
        url,
        key: Key::One(base.key.clone()),
        body: if has_body { p.body.clone() } else { None },
        cred: Cred::First,
    };
    let ex = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let o = &base.original;
    if same_response(o, &ex) {
        return r.fail(
            CROSS_ENDPOINT_REPLAY,
            format!(
                "the other endpoint answered with the first endpoint's stored response ({}, {}): \
                 the key is looked up without the request it was used for, so a client reusing a \
                 key on another operation gets a response for something it did not ask.",
                ex.status,
                ident(&ex)
            ),
        );
    }
    let how = match ex.status {
        StatusCode::UNPROCESSABLE_ENTITY => {
            "refused as a mismatch: the key is bound to its first request (method, route, body)"
                .to_owned()
        }
        s if s.is_success() => format!(
            "executed independently ({}): keys are scoped per endpoint",
            ident(&ex)
        ),
        s => format!("answered {s}"),
    };
    r.pass(format!(
        "not a replay of the first endpoint's response: {how}."
    ))
}

/// The baseline key and body under the second credential must execute independently.
pub(crate) async fn cross_scope(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        CROSS_SCOPE,
        "the same key under another credential executes independently (keys are scoped per caller)",
    );
    if !p.has_second_auth() {
        return r.not_applicable("no second credential is configured");
    }
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    let mut probe = p.probe(Key::One(base.key.clone()));
    probe.cred = Cred::Second;
    let ex = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let o = &base.original;
    match ex.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => r.inconclusive(format!(
            "the second credential was refused ({}); give one the endpoint accepts.",
            ex.status
        )),
        s if s.is_success() => {
            let same_id = ex.id().is_some() && ex.id() == o.id();
            if same_response(o, &ex) || same_id || ex.marked_replay() {
                r.fail(
                    GLOBAL_KEY_SCOPE,
                    format!(
                        "the second caller got the first caller's stored response ({}, {}): keys \
                         are looked up without the caller, so one tenant can read another's \
                         results and a colliding key silently drops a request (server case S9).",
                        ex.status,
                        ident(&ex)
                    ),
                )
            } else {
                r.pass(format!(
                    "the second caller's request executed on its own ({}, first caller's {}).",
                    ident(&ex),
                    ident(o)
                ))
            }
        }
        StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY => r.fail(
            GLOBAL_KEY_SCOPE,
            format!(
                "the second caller's request was refused with {} because the first caller had used \
                 the key: keys are not scoped per caller, and the error reveals another tenant's \
                 activity (server case S9).",
                ex.status
            ),
        ),
        s if s.is_server_error() => r.fail(
            WRONG_ERROR_STATUS,
            format!("the second caller's request got {s}; it should have executed on its own."),
        ),
        s => r.inconclusive(format!(
            "the second caller's request got {s}; cannot tell whether keys are scoped."
        )),
    }
}
