//! Many identical requests with one key, at once: at most one execution.

use super::{CONCURRENCY, Rec, delta};
use crate::audit::anti_patterns::{
    CHECK_THEN_INSERT_RACE, DUPLICATE_AS_SERVER_ERROR, REPLAY_DIFFERS, WRONG_ERROR_STATUS,
};
use crate::audit::probe::{Exchange, Key, ProbeError, Prober, describe_request};
use crate::audit::report::CheckResult;
use http::StatusCode;
use std::collections::{BTreeMap, BTreeSet};

const TITLE: &str = "identical requests with one key, sent at once, execute at most once";

/// The concurrency check's verdict plus what the in-flight check reuses.
pub(crate) struct Concurrency {
    pub(crate) result: CheckResult,
    /// The `409` responses seen.
    pub(crate) conflicts: Vec<Exchange>,
    /// Every request succeeded with the same response (the server waits and replays).
    pub(crate) all_identical: bool,
}

/// Fires `n` identical requests with one fresh key at once.
pub(crate) async fn concurrency(p: &Prober, n: usize) -> Concurrency {
    let mut r = Rec::new(CONCURRENCY, TITLE);
    let probe = p.probe(Key::fresh());
    let before = r.count(p).await;
    r.note(format!("{n} x {}", describe_request(&probe)));
    // Every future is created first and polled together by `join_all`, so the requests leave
    // as close together as one client can send them.
    let results: Vec<Result<Exchange, ProbeError>> =
        futures::future::join_all((0..n).map(|_| p.send(&probe))).await;

    // Evidence: identical responses grouped, in order of first appearance.
    let mut groups: Vec<(String, usize)> = Vec::new();
    let mut by_shape: BTreeMap<(u16, Vec<u8>), usize> = BTreeMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for res in &results {
        match res {
            Ok(ex) => {
                let shape = (ex.status.as_u16(), ex.body.to_vec());
                if let Some(&i) = by_shape.get(&shape) {
                    groups[i].1 += 1;
                } else {
                    by_shape.insert(shape, groups.len());
                    groups.push((ex.response_line(), 1));
                }
            }
            Err(e) => *errors.entry(e.to_string()).or_default() += 1,
        }
    }
    // A racy server answers with as many distinct bodies as executions: show a few.
    const SHOWN: usize = 5;
    for (line, count) in groups.iter().take(SHOWN) {
        r.note(format!("{count} x {line}"));
    }
    if groups.len() > SHOWN {
        let rest: usize = groups[SHOWN..].iter().map(|(_, c)| c).sum();
        r.note(format!(
            "... {rest} more response(s) with {} other distinct bodies",
            groups.len() - SHOWN
        ));
    }
    for (e, count) in &errors {
        r.note(format!("{count} x < no response: {e}"));
    }
    let after = r.count(p).await;

    let ok: Vec<&Exchange> = results.iter().flatten().collect();
    let successes: Vec<&Exchange> = ok
        .iter()
        .copied()
        .filter(|e| e.status.is_success())
        .collect();
    let conflicts: Vec<Exchange> = ok
        .iter()
        .filter(|e| e.status == StatusCode::CONFLICT)
        .map(|e| (*e).clone())
        .collect();
    let throttled = ok
        .iter()
        .filter(|e| e.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let server_errors: Vec<StatusCode> = ok
        .iter()
        .filter(|e| e.status.is_server_error())
        .map(|e| e.status)
        .collect();
    let others: BTreeSet<u16> = ok
        .iter()
        .filter(|e| {
            !e.status.is_success()
                && !e.status.is_server_error()
                && !matches!(
                    e.status,
                    StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS
                )
        })
        .map(|e| e.status.as_u16())
        .collect();
    let bodies: BTreeSet<&[u8]> = successes.iter().map(|e| e.body.as_ref()).collect();
    let ids: Option<BTreeSet<String>> = successes.iter().map(|e| e.id()).collect();
    let all_identical = !successes.is_empty() && successes.len() == n && bodies.len() == 1;
    let d = delta(before, after);
    let done = |result| Concurrency {
        result,
        conflicts: conflicts.clone(),
        all_identical,
    };

    if ok.is_empty() {
        return done(r.inconclusive(format!("none of the {n} requests got a response")));
    }
    // Executions: distinct ids when every 2xx body has one, else distinct 2xx bodies; the count
    // URL's growth when it says more.
    let (by_responses, how) = match &ids {
        Some(ids) if !successes.is_empty() => (ids.len(), "distinct ids"),
        _ => (bodies.len(), "distinct 2xx bodies"),
    };
    let executions = by_responses.max(d.unwrap_or(0).max(0) as usize);
    let summary = summary(
        n,
        successes.len(),
        conflicts.len(),
        throttled,
        &server_errors,
        &others,
        errors.values().sum(),
    );
    if executions > 1 {
        let ids_text = ids
            .as_ref()
            .map(|ids| {
                let mut shown: Vec<String> = ids.iter().take(10).cloned().collect();
                if ids.len() > 10 {
                    shown.push("...".to_owned());
                }
                format!(" ({})", shown.join(", "))
            })
            .unwrap_or_default();
        let counted = match d {
            Some(d) => format!("; the count URL grew by {d}"),
            None => String::new(),
        };
        return done(r.fail(
            CHECK_THEN_INSERT_RACE,
            format!(
                "{n} identical requests with one key executed {executions} times ({by_responses} \
                 {how}{ids_text}{counted}): {summary}. The key was looked up, then recorded, and \
                 several requests passed the look-up; the claim must be one atomic write arbitrated \
                 by the store (server case S5). The in-flight check tells a racy claim from a \
                 missing in-flight state."
            ),
        ));
    }
    if !server_errors.is_empty() {
        return done(r.fail(
            DUPLICATE_AS_SERVER_ERROR,
            format!(
                "at most one execution, but some duplicates got a server error: {summary}. A \
                 losing claim (a unique violation) must become 409 in flight or a replay, never a \
                 5xx (server case S11)."
            ),
        ));
    }
    if successes.is_empty() {
        return done(r.inconclusive(format!("no request succeeded: {summary}")));
    }
    if bodies.len() > 1 {
        return done(r.fail(
            REPLAY_DIFFERS,
            format!(
                "one execution, but the successful responses differ ({} distinct bodies): a \
                 duplicate got something other than the original response: {summary}.",
                bodies.len()
            ),
        ));
    }
    if !others.is_empty() {
        return done(r.fail(
            WRONG_ERROR_STATUS,
            format!(
                "at most one execution, but duplicates of a request in flight got unexpected \
                 statuses: {summary}. They should get 409 (code idempotency_request_in_flight, \
                 Retry-After), or wait and get the replay."
            ),
        ));
    }
    let mut detail = format!("1 execution from {n} identical requests with one key: {summary}.");
    if all_identical {
        detail.push_str(
            " Every request got the same response: either the requests did not overlap (each later one got the stored replay) or the server waits for the first and replays it.",
        );
    }
    if throttled > 0 {
        detail.push_str(
            " Note: some duplicates were throttled (429), which proves nothing about them.",
        );
    }
    if d.is_none() {
        detail.push_str(" Executions were counted from the responses only (no count URL).");
    }
    done(r.pass(detail))
}

fn summary(
    n: usize,
    successes: usize,
    conflicts: usize,
    throttled: usize,
    server_errors: &[StatusCode],
    others: &BTreeSet<u16>,
    errors: usize,
) -> String {
    let mut parts = vec![format!("{successes} of {n} succeeded")];
    if conflicts > 0 {
        parts.push(format!("{conflicts} x 409"));
    }
    if throttled > 0 {
        parts.push(format!("{throttled} x 429"));
    }
    if !server_errors.is_empty() {
        parts.push(format!("{} x 5xx", server_errors.len()));
    }
    if !others.is_empty() {
        parts.push(format!("other statuses {others:?}"));
    }
    if errors > 0 {
        parts.push(format!("{errors} without a response"));
    }
    parts.join(", ")
}
