//! The server's shared state ([`App`]): the key store, the business database, the outside
//! systems' client, the policy, and the counters `/metrics` shows.

use super::db::Db;
use super::store::Opened;
use anyhow::{Context as _, Result};
use oncely_core::{Maintenance, Policy};
use oncely_jobs::{CompleterCounters, CompleterReport, ReaperCounters};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long a graceful shutdown waits for a request inside an outside call whose timeout is
/// `processor_timeout` (`--processor-timeout-ms`): that timeout, plus 2 seconds for the
/// request to record its result at its next recovery point (`docs/DESIGN.md`, "Operating the
/// server").
pub fn outside_call_wait(processor_timeout: Duration) -> Duration {
    processor_timeout.saturating_add(Duration::from_secs(2))
}

/// The server's shared state.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Maintenance>,
    db: Db,
    http: reqwest::Client,
    processor_url: String,
    crash_after: Option<String>,
    policy: Policy,
    drain: Option<oncely_tower::Drain>,
    payments_created: AtomicU64,
    reaper: OnceLock<Arc<ReaperCounters>>,
    completer: OnceLock<Arc<CompleterCounters>>,
}

/// What `/metrics` counts beside the layer's own metrics.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    /// Payments this process created (first executions).
    pub payments_created: u64,
    /// Records past retention the in-process reaper deleted.
    pub reaped: u64,
    /// Of those, records still in flight (abandoned, never finished).
    pub orphaned: u64,
    /// Records marked for a person (the completer gave up on them), as counted by the last
    /// in-process reaper pass.
    pub marked: u64,
    /// The in-process completer's totals (zero without one).
    pub completer: CompleterReport,
}

impl App {
    /// The state over `opened`: `processor_url` is the outside systems' base URL, `crash_after`
    /// the `--crash-after` recovery point, `drain` the layer's (`None` without the layer; the
    /// layer's counters reach `/metrics` through the `metrics` facade, not through the state).
    ///
    /// # Errors
    ///
    /// The HTTP client for the outside systems cannot be built.
    pub fn new(
        opened: &Opened,
        processor_url: &str,
        processor_timeout: Duration,
        crash_after: Option<String>,
        policy: Policy,
        drain: Option<oncely_tower::Drain>,
    ) -> Result<Self> {
        Ok(Self {
            inner: Arc::new(Inner {
                store: opened.store.clone(),
                db: opened.db.clone(),
                http: reqwest::Client::builder()
                    .timeout(processor_timeout)
                    .build()?,
                processor_url: processor_url.trim_end_matches('/').to_owned(),
                crash_after,
                policy,
                drain,
                payments_created: AtomicU64::new(0),
                reaper: OnceLock::new(),
                completer: OnceLock::new(),
            }),
        })
    }

    /// The business database.
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// The key store.
    pub fn store(&self) -> Arc<dyn Maintenance> {
        self.inner.store.clone()
    }

    /// The idempotency policy the server runs with.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The layer's graceful-shutdown handle (`None` without the layer).
    pub fn drain(&self) -> Option<oncely_tower::Drain> {
        self.inner.drain.clone()
    }

    /// What this process counted so far.
    pub fn counts(&self) -> Counts {
        let reaper = self
            .inner
            .reaper
            .get()
            .map(|c| c.snapshot())
            .unwrap_or_default();
        Counts {
            payments_created: self.inner.payments_created.load(Ordering::Relaxed),
            reaped: reaper.deleted,
            orphaned: reaper.orphaned,
            marked: reaper.marked,
            completer: self
                .inner
                .completer
                .get()
                .map(|c| c.snapshot())
                .unwrap_or_default(),
        }
    }

    /// Shows the in-process completer's running totals in `/metrics` (set once; later calls
    /// are ignored).
    pub fn show_completer(&self, counters: Arc<CompleterCounters>) {
        let _ = self.inner.completer.set(counters);
    }

    /// Counts a payment this process created.
    pub fn payment_created(&self) {
        self.inner.payments_created.fetch_add(1, Ordering::Relaxed);
    }

    /// Kills the process with SIGKILL if `--crash-after` names this recovery point (testing
    /// only): no destructor runs, nothing is flushed, exactly like a machine dying.
    pub fn crash_point(&self, name: &str) {
        if self.inner.crash_after.as_deref() == Some(name) {
            eprintln!("oncely: --crash-after {name}: killing this process now, as asked");
            #[cfg(unix)]
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            std::process::abort();
        }
    }

    /// Calls an outside system with a derived idempotency key; returns the status and JSON body.
    pub async fn outside_call(&self, path: &str, key: &str, body: Value) -> Result<(u16, Value)> {
        let resp = self
            .inner
            .http
            .post(format!("{}/{path}", self.inner.processor_url))
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("call the outside system at /{path}"))?;
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// Runs the reaper in this process ([`oncely_jobs::Reaper`]: a pass at start, then
    /// every `every`, in batches of 1,000), its running totals shown in `/metrics`: records
    /// deleted and orphaned, and how many records are marked for a person (each pass logs
    /// every one of them). It runs until the process ends. Call it once (a second reaper's
    /// totals would not be shown).
    pub fn spawn_reaper(&self, every: Duration) {
        let reaper = oncely_jobs::Reaper::new(self.inner.store.clone(), every, 1000);
        let _ = self.inner.reaper.set(reaper.counters());
        reaper.spawn(std::future::pending());
    }
}
