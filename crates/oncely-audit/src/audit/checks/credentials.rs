//! The key under other credentials of one account or carrying another caller's session: a
//! refreshed token (same account) must replay, another caller presenting the first one's
//! session cookies must not.

use super::{
    Baseline, NO_REPLAYS, REFRESHED_CREDENTIAL, Rec, SESSION_SCOPE, delta, executed_again, ident,
    same_response,
};
use crate::audit::anti_patterns::{
    CREDENTIAL_IN_KEY, DUPLICATE_AS_SERVER_ERROR, SESSION_SCOPED_RECORDS, WRONG_ERROR_STATUS,
};
use crate::audit::probe::{Cred, Key, Prober};
use crate::audit::report::CheckResult;
use http::StatusCode;

const NO_BASELINE: &str = "the baseline request did not succeed (see replay-fidelity), so there is nothing to compare with";

/// The baseline key and body under another token of the same account must replay.
pub(crate) async fn refreshed_credential(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        REFRESHED_CREDENTIAL,
        "the same key and body under a refreshed token of the same account replays (the credential is not part of the key)",
    );
    if !p.has(Cred::SameAccount) {
        return r.not_applicable(
            "no second token of the first caller's account (--same-account-auth) is configured",
        );
    }
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    if !base.replays {
        return r.not_applicable(NO_REPLAYS);
    }
    let probe = p
        .probe(Key::One(base.key.clone()))
        .with_cred(Cred::SameAccount);
    let before = r.count(p).await;
    let res = r.send(p, &probe).await;
    let after = r.count(p).await;
    let ex = match res {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let o = &base.original;
    let d = delta(before, after);
    match ex.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => r.inconclusive(format!(
            "the same-account credential was refused ({}); give one the endpoint accepts.",
            ex.status
        )),
        s if s.is_success() => match executed_again(o, &ex, d) {
            Some(true) => r.fail(
                CREDENTIAL_IN_KEY,
                format!(
                    "the retry under a refreshed token of the same account executed again ({} \
                     then {}): the Authorization header (or a hash of it) is part of the key, so \
                     a client whose token is refreshed between two attempts pays twice. Scope \
                     keys by the account the credential authenticates, not by the credential.",
                    ident(o),
                    ident(&ex)
                ),
            ),
            Some(false) if same_response(o, &ex) => r.pass(format!(
                "the retry under a refreshed token of the same account got the stored response \
                 ({}, {}).",
                ex.status,
                ident(&ex)
            )),
            Some(false) => r.pass(format!(
                "the retry under a refreshed token of the same account was not executed again \
                 ({}, {}), though its response is not byte-identical to the original (see \
                 replay-fidelity).",
                ex.status,
                ident(&ex)
            )),
            None => r.not_applicable(
                "a replay cannot be told from a new execution here: the responses have no id, no \
                 replay marker, and no count URL was given.",
            ),
        },
        StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY => r.fail(
            CREDENTIAL_IN_KEY,
            format!(
                "the retry under a refreshed token of the same account was refused with {}: the \
                 Authorization header is part of the key's fingerprint, so a client whose token \
                 is refreshed between attempts cannot retry.",
                ex.status
            ),
        ),
        s if s.is_server_error() => r.fail(
            DUPLICATE_AS_SERVER_ERROR,
            format!("the retry under a refreshed token of the same account got {s}."),
        ),
        s => r.not_applicable(format!(
            "the retry under a refreshed token of the same account got {s}, neither a replay nor \
             an execution: nothing to conclude."
        )),
    }
}

/// The baseline key and body under the second credential, presenting the first credential's
/// cookies, must not get the first caller's response.
pub(crate) async fn session_scope(
    p: &Prober,
    base: Option<&Baseline>,
    keys_are_global: bool,
) -> CheckResult {
    let mut r = Rec::new(
        SESSION_SCOPE,
        "another caller presenting the first caller's session cookies does not get the first caller's response",
    );
    if !p.cookies_on() {
        return r.not_applicable(
            "cookies are off, so no session can be presented (turn them on with --cookies for a session-bound API)",
        );
    }
    if !p.has(Cred::Second) {
        return r.not_applicable("no second credential is configured");
    }
    let Some(base) = base else {
        return r.inconclusive(NO_BASELINE);
    };
    if !base.replays {
        return r.not_applicable(NO_REPLAYS);
    }
    if keys_are_global {
        return r.not_applicable(
            "keys are not scoped per caller at all (see cross-scope): presenting a session adds nothing to that finding",
        );
    }
    let cookies = p.cookie_names(Cred::First);
    if cookies.is_empty() {
        return r.not_applicable(
            "the first caller's responses set no cookie, so there is no session to present",
        );
    }
    r.note(format!(
        "the first caller's cookies: {} (values not shown)",
        cookies.join(", ")
    ));
    // A key only the first caller has used (the baseline's was used by the second caller too,
    // by the cross-scope check): the first caller's request with it, in its session.
    let first = p.probe(Key::fresh());
    let o = match r.send(p, &first).await {
        Ok(ex) if ex.status.is_success() => ex,
        Ok(ex) => {
            return r.inconclusive(format!(
                "the first caller's request with a fresh key got {}",
                ex.status
            ));
        }
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let mut probe = first.with_cred(Cred::Second);
    probe.cookies_of = Cred::First;
    let ex = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let o = &o;
    match ex.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => r.inconclusive(format!(
            "the second credential was refused ({}); give one the endpoint accepts.",
            ex.status
        )),
        s if s.is_success() => {
            let same_id = ex.id().is_some() && ex.id() == o.id();
            if same_response(o, &ex) || same_id || ex.marked_replay() {
                r.fail(
                    SESSION_SCOPED_RECORDS,
                    format!(
                        "the second caller, presenting the first caller's session cookies, got \
                         the first caller's stored response ({}, {}): the idempotency records \
                         are looked up by session, not by the authenticated caller, so whoever \
                         holds a session cookie reads its results (and without cookies nothing \
                         is deduplicated at all).",
                        ex.status,
                        ident(&ex)
                    ),
                )
            } else {
                r.pass(format!(
                    "the second caller's request executed on its own despite the first caller's \
                     cookies ({}, first caller's {}).",
                    ident(&ex),
                    ident(o)
                ))
            }
        }
        StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY => r.fail(
            SESSION_SCOPED_RECORDS,
            format!(
                "the second caller, presenting the first caller's session cookies, was refused \
                 with {} because the first caller had used the key: records are looked up by \
                 session, not by caller.",
                ex.status
            ),
        ),
        s if s.is_server_error() => r.fail(
            WRONG_ERROR_STATUS,
            format!("the second caller's request got {s}; it should have executed on its own."),
        ),
        s => r.not_applicable(format!(
            "the second caller's request got {s}, neither a replay nor an execution: nothing to conclude."
        )),
    }
}
