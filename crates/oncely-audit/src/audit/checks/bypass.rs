//! Client-controlled bypass: the replay and cache headers some middlewares read from requests
//! must change nothing.

use super::{
    Baseline, CLIENT_BYPASS, NO_REPLAYS, Rec, delta, executed_again, ident, same_response,
};
use crate::audit::anti_patterns::CLIENT_CONTROLLED_BYPASS;
use crate::audit::config::BYPASS_HEADERS;
use crate::audit::probe::{Key, Prober, fresh_value};
use crate::audit::report::CheckResult;
use http::{HeaderName, HeaderValue, StatusCode};

/// The request headers some middlewares trust: replay markers (a client, or a proxy passing the
/// header through, claims "this is a replay") and cache directives (RFC 9111 section 5.2.1.4
/// `no-cache`, and the legacy `Pragma`), which an idempotency cache must not honour.
pub(crate) const HEADERS: [(&str, &str); BYPASS_HEADERS] = [
    ("idempotent-replayed", "true"),
    ("idempotency-replayed", "true"),
    ("x-idempotent-replayed", "true"),
    ("x-idempotency-replayed", "true"),
    ("x-idempotency-replay", "true"),
    ("cache-control", "no-cache"),
    ("pragma", "no-cache"),
];

fn extra(which: &[usize]) -> Vec<(HeaderName, HeaderValue)> {
    which
        .iter()
        .map(|&i| {
            (
                HeaderName::from_static(HEADERS[i].0),
                HeaderValue::from_static(HEADERS[i].1),
            )
        })
        .collect()
}

fn names(which: &[usize]) -> String {
    which
        .iter()
        .map(|&i| format!("{}: {}", HEADERS[i].0, HEADERS[i].1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Step 1: a new key carrying the headers, then the same key without them. `None` when the
/// behaviour is the contract's (an execution, then its replay), else what changed.
async fn new_key_step(
    p: &Prober,
    r: &mut Rec,
    base: &Baseline,
    which: &[usize],
    counted: bool,
) -> Result<Option<String>, String> {
    let key = fresh_value();
    let mut probe = p.probe(Key::One(key));
    probe.extra = extra(which);
    let before = if counted { r.count(p).await } else { None };
    let a = r
        .send(p, &probe)
        .await
        .map_err(|e| format!("no response: {e}"))?;
    probe.extra.clear();
    let b = r
        .send(p, &probe)
        .await
        .map_err(|e| format!("no response: {e}"))?;
    let after = if counted { r.count(p).await } else { None };
    let o = &base.original;
    if a.status != o.status {
        return Ok(Some(format!(
            "a new request carrying them got {} (the same request without them gets {})",
            a.status, o.status
        )));
    }
    if a.marked_replay() {
        return Ok(Some(
            "a new request carrying them was answered as a replay of something that never ran"
                .to_owned(),
        ));
    }
    let d = delta(before, after).map(|d| d - 1);
    if b.status == StatusCode::CONFLICT {
        return Ok(Some(format!(
            "the same key sent again without them, after the first had completed, got {}: the key \
             is wedged in flight (the first request was executed but never recorded as complete), \
             so every retry is refused",
            b.status
        )));
    }
    if b.status.is_success() && executed_again(&a, &b, d) == Some(true) {
        return Ok(Some(format!(
            "the same key sent again without them executed again ({} then {}): the first request \
             was not recorded",
            ident(&a),
            ident(&b)
        )));
    }
    if !same_response(&a, &b) {
        return Ok(Some(format!(
            "the same key sent again without them got {} with {}, not the first response ({} with {})",
            b.status,
            ident(&b),
            a.status,
            ident(&a)
        )));
    }
    Ok(None)
}

/// Step 2: a completed key carrying the headers must get the replay. `base`'s key when given,
/// else (one header at a time, as the combined probe may have changed the baseline's record)
/// a fresh key completed first without the headers.
async fn completed_key_step(
    p: &Prober,
    r: &mut Rec,
    base: Option<&Baseline>,
    which: &[usize],
    counted: bool,
) -> Result<Option<String>, String> {
    let (key, original) = match base {
        Some(b) => (b.key.clone(), b.original.clone()),
        None => {
            let key = fresh_value();
            let first = r
                .send(p, &p.probe(Key::One(key.clone())))
                .await
                .map_err(|e| format!("no response: {e}"))?;
            if !first.status.is_success() {
                return Err(format!("a request with a fresh key got {}", first.status));
            }
            (key, first)
        }
    };
    let mut probe = p.probe(Key::One(key));
    probe.extra = extra(which);
    let before = if counted { r.count(p).await } else { None };
    let c = r
        .send(p, &probe)
        .await
        .map_err(|e| format!("no response: {e}"))?;
    let after = if counted { r.count(p).await } else { None };
    let o = &original;
    if c.status.is_success() && executed_again(o, &c, delta(before, after)) == Some(true) {
        return Ok(Some(format!(
            "the completed key carrying them executed again ({} then {}): they bypass the stored \
             response",
            ident(o),
            ident(&c)
        )));
    }
    if !same_response(o, &c) {
        return Ok(Some(format!(
            "the completed key carrying them got {} with {} instead of the stored {} with {}",
            c.status,
            ident(&c),
            o.status,
            ident(o)
        )));
    }
    Ok(None)
}

/// Sends the headers together on a new key and on the completed baseline key; when either
/// changes the behaviour, retests one header at a time to name the culprit.
pub(crate) async fn client_bypass(p: &Prober, base: Option<&Baseline>) -> CheckResult {
    let mut r = Rec::new(
        CLIENT_BYPASS,
        "replay and cache headers sent by the client change nothing (no bypass, no wedged key)",
    );
    let Some(base) = base else {
        return r.inconclusive(
            "the baseline request did not succeed (see replay-fidelity), so there is nothing to compare with",
        );
    };
    if !base.replays {
        return r.not_applicable(NO_REPLAYS);
    }
    let all: Vec<usize> = (0..HEADERS.len()).collect();
    r.note(format!("the headers: {}", names(&all)));
    let inconclusive = |r: Rec, e: String| r.inconclusive(e);
    let step1 = match new_key_step(p, &mut r, base, &all, true).await {
        Ok(v) => v,
        Err(e) => return inconclusive(r, e),
    };
    let step2 = match completed_key_step(p, &mut r, Some(base), &all, true).await {
        Ok(v) => v,
        Err(e) => return inconclusive(r, e),
    };
    let (what, new_key) = match (step1, step2) {
        (None, None) => {
            return r.pass(format!(
                "a new key carrying all {} headers executed once and then replayed; the \
                 completed key carrying them replayed the stored response ({}).",
                HEADERS.len(),
                ident(&base.original)
            ));
        }
        (Some(w), _) => (w, true),
        (None, Some(w)) => (w, false),
    };
    r.note("one header at a time, to name the one that changes the behaviour:");
    let mut culprits = Vec::new();
    for i in 0..HEADERS.len() {
        let res = if new_key {
            new_key_step(p, &mut r, base, &[i], false).await
        } else {
            completed_key_step(p, &mut r, None, &[i], false).await
        };
        if let Ok(Some(_)) = res {
            culprits.push(i);
        }
    }
    let named = if culprits.is_empty() {
        format!(
            "only the combination of {} did (no single one of them)",
            names(&all)
        )
    } else {
        format!("the header(s) that do it: {}", names(&culprits))
    };
    r.fail(
        CLIENT_CONTROLLED_BYPASS,
        format!(
            "request headers the client controls changed the outcome: {what}; {named}. A \
             middleware must decide replays from its own store, never from a request header: any \
             client (or a proxy passing the header through) can otherwise skip deduplication or \
             wedge a key."
        ),
    )
}
