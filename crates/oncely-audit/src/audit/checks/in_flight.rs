//! The in-flight response: a duplicate of a request that is still running.

use super::{Baseline, IN_FLIGHT, Rec, delta, executed_again, ident, same_response};
use crate::audit::anti_patterns::{
    BINARY_KEY_STATE, DUPLICATE_AS_SERVER_ERROR, UNHELPFUL_IN_FLIGHT, WRONG_ERROR_STATUS,
};
use crate::audit::probe::{Exchange, Key, Prober};
use crate::audit::report::CheckResult;
use http::StatusCode;
use std::collections::BTreeMap;
use std::time::Duration;

const TITLE: &str = "a duplicate of a request in flight gets 409 with Retry-After and a code (or waits and replays)";

/// The shortest and longest delay between the two requests of a pair.
const MIN_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(2);
/// How many pairs are tried when the first completes before its duplicate is sent.
const ATTEMPTS: usize = 3;

/// Sends a request, then a duplicate half the baseline latency later, while the first is
/// presumably still running; also examines the concurrency check's `409`s.
pub(crate) async fn in_flight(
    p: &Prober,
    base: Option<&Baseline>,
    earlier_conflicts: &[Exchange],
    earlier_all_identical: bool,
) -> CheckResult {
    let mut r = Rec::new(IN_FLIGHT, TITLE);
    let Some(base) = base else {
        return r.inconclusive(
            "the baseline request did not succeed (see replay-fidelity), so its latency is unknown",
        );
    };
    let latency = base.original.finished.duration_since(base.original.started);
    let mut delay = (latency / 2).clamp(MIN_DELAY, MAX_DELAY);
    let mut pair = None;
    let mut replayed_every_time = false;
    for attempt in 1..=ATTEMPTS {
        let probe = p.probe(Key::fresh());
        let before = r.count(p).await;
        r.note(format!(
            "pair {attempt}: a request, then the same request with the same key {} ms later",
            delay.as_millis()
        ));
        let (a, b) = tokio::join!(p.send(&probe), async {
            tokio::time::sleep(delay).await;
            p.send(&probe).await
        });
        r.record(p, &probe, &a);
        r.record(p, &probe, &b);
        let after = r.count(p).await;
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return r.inconclusive("a request of the pair got no response"),
        };
        // One execution (the first request's) is expected: "again" is growth beyond it.
        let d = delta(before, after).map(|d| d - 1);
        if b.started >= a.finished {
            r.note(format!(
                "the first completed ({} ms) before the duplicate was sent",
                a.millis()
            ));
        } else if a.status.is_success()
            && same_response(&a, &b)
            && executed_again(&a, &b, d) != Some(true)
        {
            // The duplicate got the original response: the server waited for the first, or
            // the duplicate reached it after the first completed. Only a shorter delay tells.
            r.note("the duplicate got the original response");
            replayed_every_time = true;
            pair = Some((a, b, delay));
        } else {
            replayed_every_time = false;
            pair = Some((a, b, delay));
            break;
        }
        delay = (delay / 2).max(Duration::from_millis(1));
    }

    let mut conflicts: Vec<&Exchange> = earlier_conflicts.iter().collect();
    if !earlier_conflicts.is_empty() {
        r.note(format!(
            "also examined: the {} x 409 of the concurrency check",
            earlier_conflicts.len()
        ));
    }
    let mut pair_detail = None;
    if let Some((a, b, delay)) = &pair {
        let gap = delay.as_millis();
        match (a.status.is_success(), b.status.is_success()) {
            (true, true) => {
                if replayed_every_time {
                    pair_detail = Some(format!(
                        "every duplicate sent while the first was in flight (last: {gap} ms after \
                         it) got the original response ({}): the server waits and replays",
                        ident(b)
                    ));
                } else if b.body.is_empty() || (a.id().is_some() && b.id().is_none()) {
                    return r.fail(
                        BINARY_KEY_STATE,
                        format!(
                            "the duplicate, sent {gap} ms after the first while it was in flight, \
                             got {} with {} instead of the original {} with {}: a replay of an \
                             empty or partial response. There is no in-flight state: the key was \
                             treated as done before its response existed.",
                            b.status,
                            ident(b),
                            a.status,
                            ident(a)
                        ),
                    );
                } else {
                    return r.fail(
                        BINARY_KEY_STATE,
                        format!(
                            "the duplicate, sent {gap} ms after the first while it was in flight, \
                             executed again ({} then {}): the key is recorded only when a request \
                             completes, so there is no in-flight state and any retry that arrives \
                             while the first runs (after a proxy or client timeout) runs twice.",
                            ident(a),
                            ident(b)
                        ),
                    );
                }
            }
            (true, false) | (false, true) => {
                let other = if a.status.is_success() { b } else { a };
                if other.status == StatusCode::CONFLICT {
                    conflicts.push(other);
                    pair_detail = Some(format!(
                        "the duplicate sent {gap} ms after the first, while it was in flight, got 409"
                    ));
                } else if other.status.is_server_error() {
                    return r.fail(
                        DUPLICATE_AS_SERVER_ERROR,
                        format!("a duplicate of a request in flight got {}; it should get 409 and Retry-After.", other.status),
                    );
                } else {
                    return r.fail(
                        WRONG_ERROR_STATUS,
                        format!(
                            "a duplicate of a request in flight got {}; it should get 409 (code \
                             idempotency_request_in_flight) with Retry-After, or wait and get the replay.",
                            other.status
                        ),
                    );
                }
            }
            (false, false) => {
                return r.inconclusive(format!(
                    "neither request of the pair succeeded ({} and {})",
                    a.status, b.status
                ));
            }
        }
    }

    let mut problems: BTreeMap<String, usize> = BTreeMap::new();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for c in &conflicts {
        let mut missing = Vec::new();
        match c.retry_after() {
            None => missing.push("no Retry-After".to_owned()),
            Some((v, false)) => missing.push(format!(
                "Retry-After {v:?} is neither delta-seconds nor an HTTP-date"
            )),
            Some((_, true)) => {}
        }
        match c.error_code() {
            None => missing.push("no machine-readable code in the body".to_owned()),
            Some(code) => *codes.entry(code).or_default() += 1,
        }
        if !missing.is_empty() {
            *problems.entry(missing.join(", ")).or_default() += 1;
        }
    }
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|(p, n)| format!("{n} x {p}")).collect();
        return r.fail(
            UNHELPFUL_IN_FLIGHT,
            format!(
                "{} in-flight 409 response(s) examined; {}. A client cannot tell this conflict from \
                 a mismatch (which must not be retried) nor know when to retry (RFC 9110 section 10.2.3).",
                conflicts.len(),
                list.join("; ")
            ),
        );
    }
    let code_text: Vec<String> = codes.keys().cloned().collect();
    let conflicts_text = if conflicts.is_empty() {
        String::new()
    } else {
        format!(
            "{} in-flight 409 response(s) examined, each with a valid Retry-After and a code ({})",
            conflicts.len(),
            code_text.join(", ")
        )
    };
    match (pair_detail, conflicts.is_empty()) {
        (Some(pd), true) => r.pass(format!("{pd}.")),
        (Some(pd), false) => r.pass(format!("{pd}; {conflicts_text}.")),
        (None, false) => r.pass(format!(
            "the endpoint answered too fast ({} ms) for a staggered duplicate to arrive in flight; \
             {conflicts_text}.",
            latency.as_millis()
        )),
        (None, true) if earlier_all_identical => r.pass(
            "no staggered duplicate arrived in flight, and every request of the concurrency check \
             got the same response: the server waits and replays.",
        ),
        (None, true) => r.inconclusive(format!(
            "the endpoint answered too fast ({} ms) for a staggered duplicate to arrive in flight, \
             and the concurrency check saw no 409: the in-flight response could not be observed.",
            latency.as_millis()
        )),
    }
}
