//! What each attempt of a run sent, and when: the answer of `GET /_testbench/runs/<run>`.
//!
//! Times are milliseconds (fractions allowed) from the arrival of the run's first attempt, so
//! the wait before attempt `n + 1` is its `arrived_ms` minus the `ended_ms` of attempt `n`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// At most this many runs are kept; the oldest is forgotten first.
pub const MAX_RUNS: usize = 10_000;

/// How the testbench finished an attempt.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// The whole answer was written and flushed.
    Complete,
    /// The connection was closed with a TCP reset, nothing sent.
    Reset,
    /// A head with the full length, part of the body, then a close.
    CutOff,
    /// The client closed the connection before the answer was complete.
    ClientClosed,
    /// A `hang` that the client never gave up on: closed by the testbench after
    /// [`crate::server::HANG_LIMIT`].
    Abandoned,
    /// Not finished yet.
    InProgress,
}

/// One attempt, as reported.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct AttemptReport {
    /// The call index (`x-oncely-call`).
    pub call: u32,
    /// 1-based attempt number within the call.
    pub attempt: u32,
    /// Index of the server step played.
    pub step: usize,
    /// The request method.
    pub method: String,
    /// The request path (with the query, if any).
    pub path: String,
    /// Request headers as received: lower-case names, in order, repeats kept.
    pub headers: Vec<(String, String)>,
    /// The first `idempotency-key` value.
    pub idempotency_key: Option<String>,
    /// How many `idempotency-key` headers there were.
    pub idempotency_key_count: usize,
    /// The body's length in bytes.
    pub body_len: usize,
    /// The body's SHA-256, lower-case hex.
    pub body_sha256: String,
    /// When the request head had been read, in milliseconds from the run's first attempt.
    pub arrived_ms: f64,
    /// When the testbench was done with the attempt (`None` while in progress).
    pub ended_ms: Option<f64>,
    /// How it ended.
    pub answer: Answer,
}

/// A run, as reported.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RunReport {
    /// The run id.
    pub run: String,
    /// The scenario of its first attempt (`None`: the run was never seen).
    pub scenario: Option<String>,
    /// Its attempts, in order of arrival.
    pub attempts: Vec<AttemptReport>,
}

impl RunReport {
    /// The attempts of one call, in order.
    pub fn of_call(&self, call: u32) -> Vec<&AttemptReport> {
        self.attempts.iter().filter(|a| a.call == call).collect()
    }
}

/// An attempt as recorded.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub(crate) call: u32,
    pub(crate) attempt: u32,
    pub(crate) step: usize,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body_len: usize,
    pub(crate) body_sha256: String,
    pub(crate) arrived: Instant,
    pub(crate) ended: Option<Instant>,
    pub(crate) answer: Answer,
}

#[derive(Debug)]
struct Run {
    scenario: String,
    first: Instant,
    attempts: Vec<Recorded>,
}

/// Every run's attempts, shared by the connections.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    inner: Mutex<(HashMap<String, Run>, VecDeque<String>)>,
}

/// Where an attempt sits in the record, to finish it later.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    run: String,
    index: usize,
}

impl Runs {
    /// Records an arriving attempt: its number within the call (1-based) is counted here, and
    /// `step_of` picks the step for that number. Returns the attempt number, the step index and
    /// the slot to finish it.
    pub(crate) fn arrive(
        &self,
        run: &str,
        scenario: &str,
        mut attempt: Recorded,
        step_of: impl FnOnce(u32) -> usize,
    ) -> (u32, usize, Slot) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (runs, order) = &mut *guard;
        if !runs.contains_key(run) {
            if order.len() >= MAX_RUNS
                && let Some(old) = order.pop_front()
            {
                runs.remove(&old);
            }
            order.push_back(run.to_owned());
            runs.insert(
                run.to_owned(),
                Run {
                    scenario: scenario.to_owned(),
                    first: attempt.arrived,
                    attempts: Vec::new(),
                },
            );
        }
        let r = runs.get_mut(run).expect("inserted above");
        let n = r.attempts.iter().filter(|a| a.call == attempt.call).count() as u32 + 1;
        attempt.attempt = n;
        attempt.step = step_of(n);
        let step = attempt.step;
        r.attempts.push(attempt);
        let slot = Slot {
            run: run.to_owned(),
            index: r.attempts.len() - 1,
        };
        (n, step, slot)
    }

    /// Marks an attempt done, now.
    pub(crate) fn finish(&self, slot: &Slot, answer: Answer) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = guard
            .0
            .get_mut(&slot.run)
            .and_then(|r| r.attempts.get_mut(slot.index))
            && a.ended.is_none()
        {
            a.ended = Some(Instant::now());
            a.answer = answer;
        }
    }

    /// The report of a run (empty if never seen).
    pub(crate) fn report(&self, run: &str) -> RunReport {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = guard.0.get(run) else {
            return RunReport {
                run: run.to_owned(),
                scenario: None,
                attempts: Vec::new(),
            };
        };
        let ms = |t: Instant| t.saturating_duration_since(r.first).as_secs_f64() * 1000.0;
        let mut attempts: Vec<AttemptReport> = r
            .attempts
            .iter()
            .map(|a| {
                let keys: Vec<&String> = a
                    .headers
                    .iter()
                    .filter(|(n, _)| n == "idempotency-key")
                    .map(|(_, v)| v)
                    .collect();
                AttemptReport {
                    call: a.call,
                    attempt: a.attempt,
                    step: a.step,
                    method: a.method.clone(),
                    path: a.path.clone(),
                    headers: a.headers.clone(),
                    idempotency_key: keys.first().map(|k| (*k).clone()),
                    idempotency_key_count: keys.len(),
                    body_len: a.body_len,
                    body_sha256: a.body_sha256.clone(),
                    arrived_ms: ms(a.arrived),
                    ended_ms: a.ended.map(ms),
                    answer: a.answer,
                }
            })
            .collect();
        attempts.sort_by(|a, b| a.arrived_ms.total_cmp(&b.arrived_ms));
        RunReport {
            run: run.to_owned(),
            scenario: Some(r.scenario.clone()),
            attempts,
        }
    }

    /// Forgets a run.
    pub(crate) fn forget(&self, run: &str) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (runs, order) = &mut *guard;
        runs.remove(run);
        order.retain(|r| r != run);
    }
}
