//! Counts the statements sqlx sends, from its own statement log (the `sqlx::query` tracing
//! events it emits once per executed statement, `BEGIN`, `COMMIT` and `ROLLBACK` included;
//! a transaction dropped without an explicit end is rolled back by sqlx without such an
//! event). A process-wide tracing subscriber that listens only while [`start`] is on,
//! so the timed runs go without it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

static ON: AtomicBool = AtomicBool::new(false);
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Counter;

struct Summary(Option<String>);

impl Visit for Summary {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "summary" {
            self.0 = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.0.is_none() {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

impl Subscriber for Counter {
    fn register_callsite(&self, m: &'static Metadata<'static>) -> Interest {
        if m.target() == "sqlx::query" {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.target() == "sqlx::query" && ON.load(Ordering::Relaxed)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut s = Summary(None);
        event.record(&mut s);
        if let Some(summary) = s.0 {
            SEEN.lock().unwrap_or_else(|p| p.into_inner()).push(summary);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Installs the counting subscriber as the process's global default (once; later calls
/// do nothing). Returns `false` when another global subscriber was installed first.
pub fn install() -> bool {
    static DONE: Mutex<Option<bool>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    *done.get_or_insert_with(|| tracing::subscriber::set_global_default(Counter).is_ok())
}

/// Starts recording (forgetting what was recorded before).
pub fn start() {
    SEEN.lock().unwrap_or_else(|p| p.into_inner()).clear();
    ON.store(true, Ordering::SeqCst);
}

/// Stops recording and returns the statements seen since [`start`], each as sqlx's
/// summary (its first four words), in the order they finished.
pub fn stop() -> Vec<String> {
    ON.store(false, Ordering::SeqCst);
    std::mem::take(&mut *SEEN.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Of `statements`, how many were commits (`COMMIT`).
pub fn commits(statements: &[String]) -> usize {
    statements
        .iter()
        // A bare COMMIT, or PostgreSQL's completion sent with its commit as one message
        // (docs/DESIGN.md, "The completion goes out with the commit").
        // (sqlx logs a summary of that message: its first statement, the completing
        // `WITH done AS (UPDATE oncely_idempotency_keys ...`).
        .filter(|s| {
            s.eq_ignore_ascii_case("commit")
                || s.starts_with("WITH done AS (UPDATE oncely_idempotency_keys")
                || s.starts_with("WITH done AS (UPDATE …")
        })
        .count()
}
