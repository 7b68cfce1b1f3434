//! Bursts of identical requests with one key each, at once: at most one execution per burst,
//! in every burst.

use super::{CONCURRENCY, Rec, delta};
use crate::audit::anti_patterns::{
    CHECK_THEN_INSERT_RACE, DUPLICATE_AS_SERVER_ERROR, REPLAY_DIFFERS, WRONG_ERROR_STATUS,
};
use crate::audit::probe::{Exchange, Key, ProbeError, Prober};
use crate::audit::report::{CheckResult, Trials};
use http::StatusCode;
use std::collections::{BTreeMap, BTreeSet};

const TITLE: &str =
    "identical requests with one key, sent at once, execute at most once (in every burst)";

/// The concurrency check's verdict plus what the in-flight check reuses.
pub(crate) struct Concurrency {
    pub(crate) result: CheckResult,
    /// The `409` responses seen, over all bursts.
    pub(crate) conflicts: Vec<Exchange>,
    /// In every burst, every request succeeded with the same response (the server waits and
    /// replays).
    pub(crate) all_identical: bool,
    /// The trials, for the report.
    pub(crate) trials: Trials,
}

/// What one burst showed.
struct Burst {
    executions: usize,
    /// Executions as counted from the responses.
    by_responses: usize,
    /// How executions were counted ("distinct ids", "distinct 2xx bodies").
    how: &'static str,
    ids: Option<BTreeSet<String>>,
    delta: Option<i64>,
    summary: String,
    answered: usize,
    successes: usize,
    server_errors: usize,
    distinct_bodies: usize,
    other_statuses: BTreeSet<u16>,
    throttled: usize,
    all_identical: bool,
}

/// The probability that `trials` independent bursts catch a race present in at least half of
/// them: `1 - 2^-trials`.
pub(crate) fn confidence(trials: usize) -> f64 {
    1.0 - 0.5f64.powi(trials.min(1000) as i32)
}

/// Fires `trials` bursts of `n` identical requests, each burst with its own fresh key, one
/// burst after the other.
pub(crate) async fn concurrency(p: &Prober, n: usize, trials: usize) -> Concurrency {
    let mut r = Rec::new(CONCURRENCY, TITLE);
    let mut conflicts = Vec::new();
    let mut bursts = Vec::new();
    for t in 1..=trials {
        bursts.push(burst(p, &mut r, n, t, trials, &mut conflicts).await);
    }
    let executions: Vec<usize> = bursts.iter().map(|b| b.executions).collect();
    let all_identical = bursts.iter().all(|b| b.all_identical);
    let per_trial = format!(
        "executions per burst: [{}]",
        executions
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut trials_out = Trials {
        trials,
        requests_per_trial: n,
        executions: executions.clone(),
        pass_confidence: None,
    };
    let done = |result, trials_out: Trials| Concurrency {
        result,
        conflicts: conflicts.clone(),
        all_identical,
        trials: trials_out,
    };
    let of = |k: usize| format!("{k} of {trials} burst(s) of {n}");

    if bursts.iter().all(|b| b.answered == 0) {
        return done(
            r.inconclusive(format!(
                "none of the {} requests got a response",
                n * trials
            )),
            trials_out,
        );
    }
    let racy: Vec<(usize, &Burst)> = bursts
        .iter()
        .enumerate()
        .filter(|(_, b)| b.executions > 1)
        .map(|(i, b)| (i + 1, b))
        .collect();
    if let Some((first, b)) = racy.first() {
        let ids_text = b
            .ids
            .as_ref()
            .map(|ids| {
                let mut shown: Vec<String> = ids.iter().take(10).cloned().collect();
                if ids.len() > 10 {
                    shown.push("...".to_owned());
                }
                format!(" ({})", shown.join(", "))
            })
            .unwrap_or_default();
        let counted = match b.delta {
            Some(d) => format!("; the count URL grew by {d}"),
            None => String::new(),
        };
        return done(
            r.fail(
                CHECK_THEN_INSERT_RACE,
                format!(
                    "in {}, identical requests with one key executed more than once ({per_trial}). \
                     Burst {first}: {n} identical requests with one key executed {} times ({} {}{ids_text}{counted}): \
                     {}. The key was looked up, then recorded, and several requests passed the \
                     look-up; the claim must be one atomic write arbitrated by the store. The \
                     in-flight check tells a racy claim from a missing in-flight \
                     state.",
                    of(racy.len()),
                    b.executions,
                    b.by_responses,
                    b.how,
                    b.summary
                ),
            ),
            trials_out,
        );
    }
    let with = |f: &dyn Fn(&Burst) -> bool| bursts.iter().filter(|b| f(b)).count();
    let first_summary = |f: &dyn Fn(&Burst) -> bool| {
        bursts
            .iter()
            .position(f)
            .map(|i| format!("burst {}: {}", i + 1, bursts[i].summary))
            .unwrap_or_default()
    };
    let k = with(&|b| b.server_errors > 0);
    if k > 0 {
        return done(
            r.fail(
                DUPLICATE_AS_SERVER_ERROR,
                format!(
                    "at most one execution per burst, but in {} some duplicates got a server \
                     error ({}). A losing claim (a unique violation) must become 409 in flight \
                     or a replay, never a 5xx (which generic clients retry).",
                    of(k),
                    first_summary(&|b| b.server_errors > 0)
                ),
            ),
            trials_out,
        );
    }
    if with(&|b| b.successes > 0) == 0 {
        return done(
            r.inconclusive(format!(
                "no request succeeded ({})",
                first_summary(&|_| true)
            )),
            trials_out,
        );
    }
    let k = with(&|b| b.distinct_bodies > 1);
    if k > 0 {
        return done(
            r.fail(
                REPLAY_DIFFERS,
                format!(
                    "one execution per burst, but in {} the successful responses differ: a \
                     duplicate got something other than the original response ({}).",
                    of(k),
                    first_summary(&|b| b.distinct_bodies > 1)
                ),
            ),
            trials_out,
        );
    }
    let k = with(&|b| !b.other_statuses.is_empty());
    if k > 0 {
        return done(
            r.fail(
                WRONG_ERROR_STATUS,
                format!(
                    "at most one execution per burst, but in {} duplicates of a request in \
                     flight got unexpected statuses ({}). They should get 409 (code \
                     idempotency_request_in_flight, Retry-After), or wait and get the replay.",
                    of(k),
                    first_summary(&|b| !b.other_statuses.is_empty())
                ),
            ),
            trials_out,
        );
    }
    let conf = confidence(trials);
    trials_out.pass_confidence = Some(conf);
    let quarter = 1.0 - 0.75f64.powi(trials.min(1000) as i32);
    let mut detail = format!(
        "1 execution from {n} identical requests with one key, in each of {trials} burst(s) \
         ({per_trial}; first burst: {}). A race present in at least half of the bursts would \
         have been caught with probability 1 - 2^-{trials} = {:.2}% (in at least a quarter: \
         {:.2}%); a black-box probe proves no absence of a rarer race.",
        bursts[0].summary,
        conf * 100.0,
        quarter * 100.0
    );
    if all_identical {
        detail.push_str(
            " Every request got the same response: either the requests did not overlap (each later one got the stored replay) or the server waits for the first and replays it.",
        );
    }
    if bursts.iter().any(|b| b.throttled > 0) {
        detail.push_str(
            " Note: some duplicates were throttled (429), which proves nothing about them.",
        );
    }
    if bursts.iter().all(|b| b.delta.is_none()) {
        detail.push_str(" Executions were counted from the responses only (no count URL).");
    }
    done(r.pass(detail), trials_out)
}

/// One burst: `n` identical requests with one fresh key, at once.
async fn burst(
    p: &Prober,
    r: &mut Rec,
    n: usize,
    t: usize,
    trials: usize,
    all_conflicts: &mut Vec<Exchange>,
) -> Burst {
    let probe = p.probe(Key::fresh());
    let before = r.count(p).await;
    r.note(format!(
        "burst {t} of {trials}: {n} x {}",
        p.describe(&probe)
    ));
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
    all_conflicts.extend(
        ok.iter()
            .filter(|e| e.status == StatusCode::CONFLICT)
            .map(|e| (*e).clone()),
    );
    let conflicts = ok
        .iter()
        .filter(|e| e.status == StatusCode::CONFLICT)
        .count();
    let throttled = ok
        .iter()
        .filter(|e| e.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let server_errors = ok.iter().filter(|e| e.status.is_server_error()).count();
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
    let d = delta(before, after);
    // Executions: distinct ids when every 2xx body has one, else distinct 2xx bodies; the count
    // URL's growth when it says more.
    let (by_responses, how) = match &ids {
        Some(ids) if !successes.is_empty() => (ids.len(), "distinct ids"),
        _ => (bodies.len(), "distinct 2xx bodies"),
    };
    let executions = by_responses.max(d.unwrap_or(0).max(0) as usize);
    let mut parts = vec![format!("{} of {n} succeeded", successes.len())];
    if conflicts > 0 {
        parts.push(format!("{conflicts} x 409"));
    }
    if throttled > 0 {
        parts.push(format!("{throttled} x 429"));
    }
    if server_errors > 0 {
        parts.push(format!("{server_errors} x 5xx"));
    }
    if !others.is_empty() {
        parts.push(format!("other statuses {others:?}"));
    }
    let unanswered: usize = errors.values().sum();
    if unanswered > 0 {
        parts.push(format!("{unanswered} without a response"));
    }
    Burst {
        executions,
        by_responses,
        how,
        ids,
        delta: d,
        summary: parts.join(", "),
        answered: ok.len(),
        successes: successes.len(),
        server_errors,
        distinct_bodies: bodies.len(),
        other_statuses: others,
        throttled,
        all_identical: successes.len() == n && bodies.len() == 1,
    }
}
