//! The baseline key sent again with something changed: the body's bytes, the body's meaning,
//! the endpoint, the caller.

use super::{
    Baseline, CANONICAL_JSON, CROSS_ENDPOINT, CROSS_SCOPE, NO_REPLAYS, PAYLOAD_MISMATCH, Rec,
    delta, executed_again, ident, same_response,
};
use crate::audit::anti_patterns::{
    BYTE_LEVEL_KEYING, CROSS_ENDPOINT_REPLAY, DUPLICATE_AS_SERVER_ERROR, FALSE_MISMATCH,
    GLOBAL_KEY_SCOPE, MISMATCH_EXECUTED, REPLAY_DIFFERS, SILENT_MISMATCH_REPLAY,
    WRONG_ERROR_STATUS,
};
use crate::audit::body::{mutated, reordered};
use crate::audit::probe::{Cred, Dest, Key, Probe, Prober};
use crate::audit::report::CheckResult;
use bytes::Bytes;
use http::{Method, StatusCode, header};

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

/// The baseline key on the other endpoint must not replay the first endpoint's response. The
/// other endpoint is first sent its own request with a fresh key: unless that succeeds, a
/// refusal of the reused key proves nothing and the check is N/A.
pub(crate) async fn cross_endpoint(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        CROSS_ENDPOINT,
        "the same key on another endpoint does not replay the first endpoint's response",
    );
    let Some((method, _)) = p.targets.other.clone() else {
        return r.not_applicable("no other endpoint is configured");
    };
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    if !base.replays {
        return r.not_applicable(NO_REPLAYS);
    }
    let has_body = matches!(method, Method::POST | Method::PUT | Method::PATCH);
    let mut probe = Probe {
        method,
        dest: Dest::Other,
        key: Key::fresh(),
        body: if has_body { p.other_body.clone() } else { None },
        cred: Cred::First,
        cookies_of: Cred::First,
        extra: Vec::new(),
    };
    let alone = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    if !alone.status.is_success() {
        let hint = if p.other_body_given {
            "check --other-body"
        } else {
            "it was sent the audited endpoint's body; give it one it accepts with --other-body"
        };
        return r.not_applicable(format!(
            "the other endpoint answered {} to its own request with a fresh key, so its answer to \
             a reused key would prove nothing ({hint}).",
            alone.status
        ));
    }
    probe.key = Key::One(base.key.clone());
    let ex = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let o = &base.original;
    if same_response(o, &ex) || (ex.id().is_some() && ex.id() == o.id()) {
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
    match ex.status {
        StatusCode::UNPROCESSABLE_ENTITY | StatusCode::CONFLICT => r.pass(format!(
            "not a replay of the first endpoint's response: refused with {}{} (the key is bound to \
             its first request: method, route, body), while the other endpoint's own request with \
             a fresh key succeeded ({}).",
            ex.status,
            ex.error_code()
                .map(|c| format!(" (code {c})"))
                .unwrap_or_default(),
            alone.status
        )),
        s if s.is_success() => r.pass(format!(
            "not a replay of the first endpoint's response: executed independently ({}): keys are \
             scoped per endpoint.",
            ident(&ex)
        )),
        s if s.is_server_error() => r.fail(
            DUPLICATE_AS_SERVER_ERROR,
            format!("the reused key on the other endpoint got {s}; expected 422 or an independent execution."),
        ),
        s => r.not_applicable(format!(
            "the reused key on the other endpoint got {s}: neither a replay, nor a refusal as a \
             mismatch, nor an execution, so nothing can be concluded."
        )),
    }
}

/// What the second credential can see of the first caller's baseline resource: `Some(true)`
/// when it reads it (the same account), `Some(false)` when it cannot, `None` when nothing
/// tells (no count URL listing ids, no `Location`).
async fn second_sees_first(p: &Prober, r: &mut Rec, base: &Baseline) -> Option<(bool, String)> {
    let id = base.original.id();
    if let (Some(id), Some(res)) = (id.as_ref(), p.count_as(Cred::Second).await) {
        match res {
            Ok((c, ids)) if !ids.is_empty() || c.n == 0 => {
                r.note(c.evidence);
                let sees = ids.contains(id);
                let how = if sees {
                    format!(
                        "the count URL read with the second credential lists the first caller's {id}"
                    )
                } else {
                    format!(
                        "the count URL read with the second credential does not list the first caller's {id}"
                    )
                };
                return Some((sees, how));
            }
            Ok((c, _)) => r.note(c.evidence),
            Err(e) => r.note(e),
        }
    }
    let location = base.original.headers.get(header::LOCATION)?.to_str().ok()?;
    let url = p.targets.endpoints[0].join(location).ok()?;
    if !p
        .targets
        .endpoints
        .iter()
        .any(|e| e.origin() == url.origin())
    {
        return None;
    }
    let probe = Probe {
        method: Method::GET,
        dest: Dest::Url(url),
        key: Key::Absent,
        body: None,
        cred: Cred::Second,
        cookies_of: Cred::Second,
        extra: Vec::new(),
    };
    let ex = r.send(p, &probe).await.ok()?;
    match ex.status {
        s if s.is_success() => Some((
            true,
            format!(
                "GET {location} (the first caller's resource) with the second credential answered {s}"
            ),
        )),
        s @ (StatusCode::NOT_FOUND | StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED) => Some((
            false,
            format!(
                "GET {location} (the first caller's resource) with the second credential answered {s}"
            ),
        )),
        _ => None,
    }
}

/// The baseline key and body under the second credential must execute independently. When the
/// second caller gets a replay, the audit checks whether it is the same account (it can read
/// the first caller's resource): then the check is inconclusive and the report warns.
pub(crate) async fn cross_scope(
    p: &Prober,
    base: Option<&Baseline>,
    warnings: &mut Vec<String>,
) -> CheckResult {
    let mut r = Rec::new(
        CROSS_SCOPE,
        "the same key under another credential executes independently (keys are scoped per caller)",
    );
    if !p.has(Cred::Second) {
        return r.not_applicable("no second credential is configured");
    }
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    if !base.replays {
        return r.not_applicable(NO_REPLAYS);
    }
    let probe = p.probe(Key::One(base.key.clone())).with_cred(Cred::Second);
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
            if !(same_response(o, &ex) || same_id || ex.marked_replay()) {
                return r.pass(format!(
                    "the second caller's request executed on its own ({}, first caller's {}).",
                    ident(&ex),
                    ident(o)
                ));
            }
            let got = format!(
                "the second caller got the first caller's stored response ({}, {})",
                ex.status,
                ident(&ex)
            );
            match second_sees_first(p, &mut r, base).await {
                Some((true, how)) => {
                    warnings.push(format!(
                        "--second-auth looks like the same account as --auth ({how}), and it got \
                         the first caller's response replayed: the cross-scope check needs a \
                         credential of another account; a second token of the same account \
                         belongs in --same-account-auth."
                    ));
                    r.inconclusive(format!(
                        "{got}, but it reads the first caller's resources ({how}): it looks like \
                         the same account, for which a replay is right. Give a credential of \
                         another account."
                    ))
                }
                Some((false, how)) => r.fail(
                    GLOBAL_KEY_SCOPE,
                    format!(
                        "{got}, though it is another account ({how}): keys are looked up without \
                         the caller, so one tenant can read another's results and a colliding \
                         key silently drops a request."
                    ),
                ),
                None => {
                    warnings.push(
                        "--second-auth got a replay of the first caller's response: if it is the \
                         same account as --auth, that is right and cross-scope's FAIL is not a \
                         fault (pass such a credential as --same-account-auth; give --count-url \
                         so the audit can tell accounts apart)."
                            .to_owned(),
                    );
                    r.fail(
                        GLOBAL_KEY_SCOPE,
                        format!(
                            "{got}: keys are looked up without the caller, so one tenant can read \
                             another's results and a colliding key silently drops a request. \
                             (Nothing told whether the second credential is \
                             another account: see the warning.)"
                        ),
                    )
                }
            }
        }
        StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY => r.fail(
            GLOBAL_KEY_SCOPE,
            format!(
                "the second caller's request was refused with {} because the first caller had used \
                 the key: keys are not scoped per caller, and the error reveals another tenant's \
                 activity.",
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
