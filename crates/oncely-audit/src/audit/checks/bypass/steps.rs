//! The client-bypass check's two probes, each run with a set of headers (or none, as the
//! control): a new key carrying them and its retry, and a completed key carrying them. And the
//! allotment they draw their requests from.

use super::candidates::Candidate;
use crate::audit::checks::{Baseline, Rec, delta, executed_again, ident, same_response};
use crate::audit::probe::{Exchange, Key, Probe, Prober, fresh_value};
use http::{HeaderValue, StatusCode};
use std::time::Duration;

/// The check's request allotment, count-URL reads aside.
pub(super) struct Ledger {
    left: usize,
}

impl Ledger {
    pub(super) fn new(requests: usize) -> Self {
        Self { left: requests }
    }

    /// Takes `n` requests from the allotment; `false` (and nothing taken) when fewer are left.
    pub(super) fn take(&mut self, n: usize) -> bool {
        let ok = self.left >= n;
        if ok {
            self.left -= n;
        }
        ok
    }
}

/// Why a probe has no verdict.
#[derive(Debug)]
pub(super) enum Stop {
    /// The check's allotment cannot cover the probe: nothing was sent.
    Spent,
    /// A request failed or a precondition did not hold (described).
    Failed(String),
}

/// How a run strayed from the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A new key's first request got another status than the baseline's.
    Status,
    /// A new key's first request was answered as a replay.
    MarkedReplay,
    /// The retry of a completed request got `409`: still in flight.
    InFlight,
    /// The retry executed again.
    ExecutedAgain,
    /// The retry got another response.
    Differs,
}

/// A run's departure from the contract: its kind and, for the evidence, what happened.
#[derive(Debug, Clone)]
pub(super) struct Deviation {
    pub(super) kind: Kind,
    pub(super) what: String,
    /// For [`Kind::InFlight`]: the wait the `409` asked for (its `Retry-After`, bounded).
    pub(super) retry_after: Option<Duration>,
}

/// A new key's run: the key, its first answer, and how the run strayed (if it did).
pub(super) struct NewKeyRun {
    pub(super) key: HeaderValue,
    pub(super) first: Exchange,
    pub(super) deviation: Option<Deviation>,
}

/// The longest wait the check makes for a `Retry-After`: 2 seconds.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(2);

/// The wait a `409` asks for: its `Retry-After` (delta-seconds, or an HTTP-date from now),
/// between 100 ms and [`MAX_WAIT`]; 1 second when it gives none or an invalid one.
fn retry_wait(ex: &Exchange) -> Duration {
    let asked = ex
        .headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| {
            let t = t.trim();
            t.parse::<u64>().ok().map(Duration::from_secs).or_else(|| {
                httpdate::parse_http_date(t).ok().map(|at| {
                    at.duration_since(std::time::SystemTime::now())
                        .unwrap_or_default()
                })
            })
        })
        .unwrap_or(Duration::from_secs(1));
    asked.clamp(Duration::from_millis(100), MAX_WAIT)
}

fn with_headers(mut probe: Probe, headers: &[Candidate]) -> Probe {
    probe.extra = headers
        .iter()
        .map(|c| (c.name.clone(), c.value.clone()))
        .collect();
    probe
}

async fn send(p: &Prober, r: &mut Rec, probe: &Probe) -> Result<Exchange, Stop> {
    r.send(p, probe)
        .await
        .map_err(|e| Stop::Failed(format!("no response: {e}")))
}

/// Whether `later`, the same key's retry after `first` completed, is the contract's answer:
/// `first`'s response again, not a new execution.
pub(super) fn replays(first: &Exchange, later: &Exchange) -> bool {
    later.status.is_success()
        && same_response(first, later)
        && executed_again(first, later, None) != Some(true)
}

/// A new key carrying `headers` (none: the control), then, `pace` later (at once when `None`),
/// the same key without them. The contract: the baseline's status, then its replay. Two
/// requests; with `counted`, a count-URL reading before and after.
pub(super) async fn new_key(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    base: &Baseline,
    headers: &[Candidate],
    counted: bool,
    pace: Option<Duration>,
) -> Result<NewKeyRun, Stop> {
    if !ledger.take(2) {
        return Err(Stop::Spent);
    }
    let key = fresh_value();
    let probe = with_headers(p.probe(Key::One(key.clone())), headers);
    let before = if counted { r.count(p).await } else { None };
    let a = send(p, r, &probe).await?;
    if let Some(wait) = pace {
        r.note(format!("(waiting {} ms)", wait.as_millis()));
        tokio::time::sleep(wait).await;
    }
    let b = send(p, r, &with_headers(probe, &[])).await?;
    let after = if counted { r.count(p).await } else { None };
    let deviation = judge_new_key(&base.original, &a, &b, delta(before, after).map(|d| d - 1));
    Ok(NewKeyRun {
        key,
        first: a,
        deviation,
    })
}

/// How a new key's run (`a` carrying the headers, `b` its retry without them) strayed from the
/// contract, given the baseline `o` and the count growth `d` beyond the first execution.
fn judge_new_key(o: &Exchange, a: &Exchange, b: &Exchange, d: Option<i64>) -> Option<Deviation> {
    let dev = |kind, what: String| {
        Some(Deviation {
            kind,
            what,
            retry_after: (kind == Kind::InFlight).then(|| retry_wait(b)),
        })
    };
    if a.status != o.status {
        return dev(
            Kind::Status,
            format!(
                "a new request carrying them got {} (the same request without them gets {})",
                a.status, o.status
            ),
        );
    }
    if a.marked_replay() {
        return dev(
            Kind::MarkedReplay,
            "a new request carrying them was answered as a replay of something that never ran"
                .to_owned(),
        );
    }
    if b.status == StatusCode::CONFLICT {
        return dev(
            Kind::InFlight,
            format!(
                "the same key sent again without them, after the first had completed, got {}: \
                 the key is wedged in flight (the first request was executed but never recorded \
                 as complete), so every retry is refused",
                b.status
            ),
        );
    }
    if b.status.is_success() && executed_again(a, b, d) == Some(true) {
        return dev(
            Kind::ExecutedAgain,
            format!(
                "the same key sent again without them executed again ({} then {}): the first \
                 request was not recorded",
                ident(a),
                ident(b)
            ),
        );
    }
    if !same_response(a, b) {
        return dev(
            Kind::Differs,
            format!(
                "the same key sent again without them got {} with {}, not the first response ({} \
                 with {})",
                b.status,
                ident(b),
                a.status,
                ident(a)
            ),
        );
    }
    None
}

/// The same key as a [`NewKeyRun`] sent again without headers (after a wait): whether it now
/// gets its replay. One request.
pub(super) async fn retry_settled(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    run: &NewKeyRun,
) -> Result<bool, Stop> {
    if !ledger.take(1) {
        return Err(Stop::Spent);
    }
    let later = send(p, r, &p.probe(Key::One(run.key.clone()))).await?;
    Ok(replays(&run.first, &later))
}

/// Which completed key a completed-key probe uses.
#[derive(Clone, Copy)]
pub(super) enum Completed<'a> {
    /// The baseline's (one request: the probe).
    Baseline(&'a Baseline),
    /// A fresh key, completed first without the headers (two requests).
    Fresh,
}

/// A completed key carrying `headers` (none: the control). The contract: the stored response.
/// With `counted`, a count-URL reading before and after the probe.
pub(super) async fn completed_key(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    which: Completed<'_>,
    headers: &[Candidate],
    counted: bool,
) -> Result<Option<Deviation>, Stop> {
    let needed = match which {
        Completed::Baseline(_) => 1,
        Completed::Fresh => 2,
    };
    if !ledger.take(needed) {
        return Err(Stop::Spent);
    }
    let (key, original) = match which {
        Completed::Baseline(b) => (b.key.clone(), b.original.clone()),
        Completed::Fresh => {
            let key = fresh_value();
            let first = send(p, r, &p.probe(Key::One(key.clone()))).await?;
            if !first.status.is_success() {
                return Err(Stop::Failed(format!(
                    "a request with a fresh key got {}",
                    first.status
                )));
            }
            (key, first)
        }
    };
    let probe = with_headers(p.probe(Key::One(key)), headers);
    let before = if counted { r.count(p).await } else { None };
    let c = send(p, r, &probe).await?;
    let after = if counted { r.count(p).await } else { None };
    let o = &original;
    let dev = |kind, what| {
        Ok(Some(Deviation {
            kind,
            what,
            retry_after: None,
        }))
    };
    if c.status.is_success() && executed_again(o, &c, delta(before, after)) == Some(true) {
        return dev(
            Kind::ExecutedAgain,
            format!(
                "the completed key carrying them executed again ({} then {}): they bypass the \
                 stored response",
                ident(o),
                ident(&c)
            ),
        );
    }
    if !same_response(o, &c) {
        return dev(
            Kind::Differs,
            format!(
                "the completed key carrying them got {} with {} instead of the stored {} with {}",
                c.status,
                ident(&c),
                o.status,
                ident(o)
            ),
        );
    }
    Ok(None)
}

/// A control's deviation in a few words, for the evidence.
pub(super) fn control_text(kind: Kind) -> &'static str {
    match kind {
        Kind::Status => "its first request got another status than the baseline's",
        Kind::MarkedReplay => "its first request was answered as a replay",
        Kind::InFlight => "its retry got 409 (still in flight)",
        Kind::ExecutedAgain => "its retry executed again",
        Kind::Differs => "its retry got another response",
    }
}
