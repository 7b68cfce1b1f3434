//! Client-controlled bypass: request headers a client controls (replay markers, cache
//! directives, and the names the server's own answers announce) must change nothing.
//!
//! The check screens with two probes carrying every candidate header at once: a new key, then
//! its retry without them (the contract: one execution, then its replay), and a completed key
//! (the contract: the stored response). Nothing changed: PASS. Something changed: before any
//! verdict, the control, the same requests without the headers, tells the headers' doing from
//! the server's own behaviour (a key still in flight right after its response, a record whose
//! window passed); only a change the control does not show is a FAIL, and a search that halves
//! the headers names the one that makes it.
//!
//! The candidates: a fixed list ([`candidates`]) and the headers the server adds to its own
//! answers (a replay's `X-Cache: HIT`, `X-From-Cache: 1`, `X-Replayed: true`), learned from
//! the baseline's replay before the check's first round and from the in-flight answers of the
//! concurrency check in a second round, run after it.

mod candidates;
mod steps;

use super::{Baseline, CLIENT_BYPASS, NO_REPLAYS, Rec, ident};
use crate::audit::anti_patterns::CLIENT_CONTROLLED_BYPASS;
use crate::audit::config::BYPASS_REQUESTS;
use crate::audit::probe::{Exchange, Prober};
use crate::audit::report::CheckResult;
use candidates::{Candidate, fixed, learn, texts};
use std::time::Duration;
use steps::{
    Completed, Kind, Ledger, NewKeyRun, Stop, completed_key, control_text, new_key, retry_settled,
};

const TITLE: &str =
    "replay and cache headers sent by the client change nothing (no bypass, no wedged key)";

/// What one round (one set of headers) showed.
enum Outcome {
    /// The headers changed nothing; the notes explain a change the control showed too.
    Clean(Vec<String>),
    /// The headers changed the outcome (against a control that did not), and which one does.
    Bypass { what: String, named: String },
    /// The control strayed too, and no wait resolved it: nothing can be said of the headers.
    Unobservable(String),
    /// A screening probe got no response, or the allotment could not cover it.
    Stopped(String),
}

/// The check between its first round (before the concurrency check) and its second (after
/// the in-flight check, with what the in-flight answers announced).
pub(crate) struct ClientBypass(State);

enum State {
    /// The verdict is already known (no baseline, no replays, a bypass found).
    Decided(CheckResult),
    /// The first round showed no bypass.
    Open(Box<FirstRound>),
}

/// What the first round leaves for the second.
struct FirstRound {
    r: Rec,
    ledger: Ledger,
    base: Baseline,
    /// The headers it sent (learned first, then the fixed list).
    sent: Vec<Candidate>,
    /// Those the baseline's replay announced.
    learned: Vec<Candidate>,
    outcome: Outcome,
}

impl ClientBypass {
    /// The first round: the fixed headers and those the baseline's replay announced, on a new
    /// key and on the completed baseline key.
    pub(crate) async fn start(p: &Prober, base: Option<&Baseline>) -> Self {
        let mut r = Rec::new(CLIENT_BYPASS, TITLE);
        let Some(base) = base else {
            return Self(State::Decided(r.inconclusive(
                "the baseline request did not succeed (see replay-fidelity), so there is nothing to compare with",
            )));
        };
        if !base.replays {
            return Self(State::Decided(r.not_applicable(NO_REPLAYS)));
        }
        let answers: Vec<(&'static str, &Exchange)> = base
            .replay
            .iter()
            .map(|ex| ("the replay of the baseline request", ex))
            .collect();
        let learned = learn(&base.original, &answers, &fixed(), p.key_header());
        if !learned.is_empty() {
            r.note(format!(
                "announced by the server's own answers, so sent back too: {}",
                announced(&learned)
            ));
        }
        let sent: Vec<Candidate> = learned.iter().cloned().chain(fixed()).collect();
        r.note(format!("the headers: {}", texts(&sent)));
        let mut ledger = Ledger::new(BYPASS_REQUESTS);
        let outcome = round(
            p,
            &mut r,
            &mut ledger,
            base,
            &sent,
            Completed::Baseline(base),
        )
        .await;
        match outcome {
            Outcome::Bypass { what, named } => Self(State::Decided(fail(r, &what, &named))),
            Outcome::Stopped(e) => Self(State::Decided(r.inconclusive(e))),
            outcome => Self(State::Open(Box::new(FirstRound {
                r,
                ledger,
                base: base.clone(),
                sent,
                learned,
                outcome,
            }))),
        }
    }

    /// The second round, when the in-flight answers (`in_flight`, the concurrency check's
    /// `409`s) announce headers the first round did not send: a new key and a fresh completed
    /// key carrying them. Then the verdict.
    pub(crate) async fn finish(self, p: &Prober, in_flight: &[Exchange]) -> CheckResult {
        let FirstRound {
            mut r,
            mut ledger,
            base,
            sent,
            learned,
            outcome: first,
        } = match self.0 {
            State::Decided(result) => return result,
            State::Open(round) => *round,
        };
        let base = &base;
        let answers: Vec<(&'static str, &Exchange)> = in_flight
            .iter()
            .map(|ex| ("an in-flight 409 of the concurrency check", ex))
            .collect();
        let more = learn(&base.original, &answers, &sent, p.key_header());
        let second = if more.is_empty() {
            None
        } else {
            r.note(format!(
                "announced by the server's in-flight answers, not sent yet: {}",
                announced(&more)
            ));
            Some(round(p, &mut r, &mut ledger, base, &more, Completed::Fresh).await)
        };
        let mut unobservable = Vec::new();
        let mut notes = Vec::new();
        for outcome in [Some(first), second].into_iter().flatten() {
            match outcome {
                Outcome::Bypass { what, named } => return fail(r, &what, &named),
                Outcome::Clean(n) => notes.extend(n),
                Outcome::Unobservable(why) => unobservable.push(why),
                Outcome::Stopped(e) => {
                    return r.inconclusive(format!(
                        "the round for the headers the in-flight answers announced ({}) stopped: {e}",
                        texts(&more)
                    ));
                }
            }
        }
        if !unobservable.is_empty() {
            return r.inconclusive(format!(
                "the control strayed from the contract too, so the check cannot tell what the \
                 headers change: {}.",
                unobservable.join("; ")
            ));
        }
        let mut detail = if notes.is_empty() {
            format!(
                "a new key carrying all {} headers executed once and then replayed; the \
                 completed key carrying them replayed the stored response ({}).",
                sent.len(),
                ident(&base.original)
            )
        } else {
            format!(
                "the {} headers changed nothing: {}.",
                sent.len(),
                notes.join("; ")
            )
        };
        if !learned.is_empty() {
            detail.push_str(&format!(
                " They included {} header(s) the server's own answers announced ({}).",
                learned.len(),
                texts(&learned)
            ));
        }
        if !more.is_empty() {
            detail.push_str(&format!(
                " The {} header(s) its in-flight answers announced ({}) changed nothing either.",
                more.len(),
                texts(&more)
            ));
        }
        r.pass(detail)
    }
}

/// `name: value (where)` for learned headers.
fn announced(c: &[Candidate]) -> String {
    c.iter()
        .map(|c| match c.learned_from {
            Some(from) => format!("{} ({from} carried it)", c.text()),
            None => c.text(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn fail(r: Rec, what: &str, named: &str) -> CheckResult {
    r.fail(
        CLIENT_CONTROLLED_BYPASS,
        format!(
            "request headers the client controls changed the outcome: {what}; {named}. A \
             middleware must decide replays from its own store, never from a request header: any \
             client (or a proxy passing the header through) can otherwise skip deduplication or \
             wedge a key. The control, the same requests without the headers, got the contract's \
             behaviour."
        ),
    )
}

/// What a screening probe's change turned out to be once its control was sent.
enum Explained {
    /// The headers' doing: what they changed, and the wait a new key's retry needs (when the
    /// control's own retry needed one).
    Headers {
        what: String,
        pace: Option<Duration>,
    },
    /// Not the headers' doing (the control showed it too, and the wait resolved both).
    NotHeaders(String),
    Unobservable(String),
}

/// One round: screens with `set` on a new key and on a completed key (`which`), sends the
/// control for a probe that changed the behaviour, and names the header when the change is
/// the headers' doing.
async fn round(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    base: &Baseline,
    set: &[Candidate],
    which: Completed<'_>,
) -> Outcome {
    let stopped = |s: Stop| match s {
        Stop::Spent => Outcome::Stopped("the check's allotment of requests is spent".to_owned()),
        Stop::Failed(e) => Outcome::Stopped(e),
    };
    let counted = matches!(which, Completed::Baseline(_));
    let s1 = match new_key(p, r, ledger, base, set, counted, None).await {
        Ok(run) => run,
        Err(s) => return stopped(s),
    };
    let s2 = match completed_key(p, r, ledger, which, set, counted).await {
        Ok(d) => d,
        Err(s) => return stopped(s),
    };
    let mut notes = Vec::new();
    let mut unobservable = Vec::new();
    if s1.deviation.is_some() {
        match explain_new_key(p, r, ledger, base, &s1).await {
            Ok(Explained::Headers { what, pace }) => {
                let named = search(p, r, ledger, base, set, Mode::NewKey(pace)).await;
                return Outcome::Bypass { what, named };
            }
            Ok(Explained::NotHeaders(n)) => notes.push(n),
            Ok(Explained::Unobservable(u)) => unobservable.push(u),
            Err(s) => return stopped(s),
        }
    }
    if let Some(dev) = s2 {
        match explain_completed(p, r, ledger, set, which, &dev.what).await {
            Ok(Explained::Headers { what, .. }) => {
                let named = search(p, r, ledger, base, set, Mode::Completed).await;
                return Outcome::Bypass { what, named };
            }
            Ok(Explained::NotHeaders(n)) => notes.push(n),
            Ok(Explained::Unobservable(u)) => unobservable.push(u),
            Err(s) => return stopped(s),
        }
    }
    if unobservable.is_empty() {
        Outcome::Clean(notes)
    } else {
        Outcome::Unobservable(unobservable.join("; "))
    }
}

/// The new-key probe changed the behaviour: the control (a new key without the headers, then
/// its retry) tells whether the headers did. When both retries found the key still in flight,
/// both keys are sent again after the `Retry-After`: a key the headers wedged stays in flight,
/// a key that was only completing gets its replay, as the control's does.
async fn explain_new_key(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    base: &Baseline,
    probe: &NewKeyRun,
) -> Result<Explained, Stop> {
    let dev = probe
        .deviation
        .clone()
        .expect("called for a probe that strayed");
    r.note("the control: the same requests without the headers (a new key, then its retry):");
    let control = new_key(p, r, ledger, base, &[], false, None).await?;
    let Some(c) = control.deviation.clone() else {
        return Ok(Explained::Headers {
            what: dev.what,
            pace: None,
        });
    };
    if !(dev.kind == Kind::InFlight && c.kind == Kind::InFlight) {
        return Ok(Explained::Unobservable(format!(
            "a new key's run without the headers strayed too ({}), as the one with them did ({})",
            control_text(c.kind),
            control_text(dev.kind)
        )));
    }
    let wait = dev
        .retry_after
        .max(c.retry_after)
        .unwrap_or(steps::MAX_WAIT);
    r.note(format!(
        "both retries got 409: after the Retry-After ({} ms), both keys again without the headers:",
        wait.as_millis()
    ));
    tokio::time::sleep(wait).await;
    let probe_settled = retry_settled(p, r, ledger, probe).await?;
    let control_settled = retry_settled(p, r, ledger, &control).await?;
    Ok(match (probe_settled, control_settled) {
        (true, true) => Explained::NotHeaders(format!(
            "a new key's immediate retry got 409 in flight with the headers and without them (the \
             control), and both keys got their replay after the Retry-After ({} ms): the record \
             completes shortly after its response, whatever the headers",
            wait.as_millis()
        )),
        (false, true) => Explained::Headers {
            what: format!(
                "the same key sent again without them, after the first had completed, got 409 \
                 Conflict, and again after the Retry-After ({} ms), while the control key sent \
                 without them got its replay by then: the key is wedged in flight (the first \
                 request was executed but never recorded as complete), so every retry is refused",
                wait.as_millis()
            ),
            pace: Some(wait),
        },
        (_, false) => Explained::Unobservable(format!(
            "without the headers too, a new key's retry got no replay even after the Retry-After \
             ({} ms)",
            wait.as_millis()
        )),
    })
}

/// The completed-key probe changed the behaviour (`what`): the control (a fresh key, completed,
/// then sent again without the headers) tells whether the headers did; a change seen on the
/// baseline's older record is then probed again on a fresh completed key.
async fn explain_completed(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    set: &[Candidate],
    which: Completed<'_>,
    what: &str,
) -> Result<Explained, Stop> {
    r.note("the control: a fresh key, completed, then sent again without the headers:");
    if let Some(c) = completed_key(p, r, ledger, Completed::Fresh, &[], false).await? {
        return Ok(Explained::Unobservable(format!(
            "a completed key sent again without the headers strayed too ({})",
            control_text(c.kind)
        )));
    }
    if let Completed::Baseline(_) = which {
        r.note("the same probe on a fresh completed key:");
        if completed_key(p, r, ledger, Completed::Fresh, set, false)
            .await?
            .is_none()
        {
            return Ok(Explained::NotHeaders(format!(
                "the completed baseline key carrying them strayed ({what}), but a fresh completed \
                 key carrying them got its stored response, as the control did: the baseline's \
                 record changed without them (for example, its replay window passed)"
            )));
        }
    }
    Ok(Explained::Headers {
        what: what.to_owned(),
        pace: None,
    })
}

/// Which probe the search repeats with fewer headers.
#[derive(Clone, Copy)]
enum Mode {
    /// A new key carrying them, then its retry (`pace` later: the wait the control needed).
    NewKey(Option<Duration>),
    /// A fresh completed key carrying them.
    Completed,
}

/// Names the header that changes the behaviour of `mode`'s probe: halves the set, keeps the
/// half that still changes it (or the other half, confirmed at the end), down to one header.
/// At most `ceil(log2 n) + 1` probes.
async fn search(
    p: &Prober,
    r: &mut Rec,
    ledger: &mut Ledger,
    base: &Baseline,
    set: &[Candidate],
    mode: Mode,
) -> String {
    if set.len() > 1 {
        r.note("halving the headers, to name the one that changes the behaviour:");
    }
    let mut known: &[Candidate] = set;
    let mut cand: &[Candidate] = set;
    let mut tested = true;
    let among = |known: &[Candidate], why: &str| {
        format!(
            "the header(s) that do it are among {} ({why} before one was singled out)",
            texts(known)
        )
    };
    while cand.len() > 1 || !tested {
        let (half, rest) = if cand.len() > 1 {
            cand.split_at(cand.len() / 2)
        } else {
            (cand, &cand[..0])
        };
        r.note(format!("with {}:", texts(half)));
        let changed = match mode {
            Mode::NewKey(pace) => new_key(p, r, ledger, base, half, false, pace)
                .await
                .map(|run| run.deviation.is_some()),
            Mode::Completed => completed_key(p, r, ledger, Completed::Fresh, half, false)
                .await
                .map(|d| d.is_some()),
        };
        match changed {
            Ok(true) => {
                known = half;
                cand = half;
                tested = true;
            }
            Ok(false) if rest.is_empty() => {
                return format!(
                    "only the combination of {} did (no single one of them)",
                    texts(known)
                );
            }
            Ok(false) => {
                cand = rest;
                tested = false;
            }
            Err(Stop::Spent) => return among(known, "the check's allotment of requests ran out"),
            Err(Stop::Failed(e)) => return among(known, &format!("a probe got {e}")),
        }
    }
    let c = &cand[0];
    match c.learned_from {
        Some(from) => format!(
            "the header(s) that do it: {} (announced by the server: {from} carried it)",
            c.text()
        ),
        None => format!("the header(s) that do it: {}", c.text()),
    }
}
