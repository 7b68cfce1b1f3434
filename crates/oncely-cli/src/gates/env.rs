//! The environment every gate shares: the store, the outside card processor and mailer (a
//! child process), API servers started on demand against that store, and the processor's
//! ledger to count side effects.

use super::child::Proc;
use crate::serve::StoreUrl;
use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The lease the gates give API servers (2 seconds), so that a crashed owner's claim lapses
/// quickly; the heartbeat renews it every 500 milliseconds while a handler runs.
const GATE_LEASE_MS: u64 = 2000;

/// The gates' shared environment (see the [module docs](self)).
pub struct Env {
    store: StoreUrl,
    processor: Proc,
    dir: tempfile::TempDir,
    /// The gates' own HTTP client (30-second timeout, many idle connections per host).
    pub http: reqwest::Client,
    /// API server processes sharing the store.
    pub instances: usize,
    /// The spinner (hidden with `--json` and when stderr is not a terminal).
    pub progress: ProgressBar,
    /// `--json`: nothing but the JSON document.
    quiet: bool,
    /// Flags every API server is started with besides the gates' own.
    serve_flags: Vec<String>,
}

impl Env {
    /// Starts the outside card processor and mailer, for gates on `store` with `instances` API
    /// servers; `dir` holds the business database; `json` silences the spinner.
    ///
    /// # Errors
    ///
    /// The processor or the HTTP client could not start.
    pub async fn start(
        store: StoreUrl,
        dir: tempfile::TempDir,
        instances: usize,
        json: bool,
    ) -> Result<Self> {
        let progress = if json {
            ProgressBar::hidden()
        } else {
            let p = ProgressBar::new_spinner();
            p.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            p.enable_steady_tick(Duration::from_millis(120));
            p
        };
        progress.set_message("starting the outside card processor and mailer");
        let processor = Proc::start("the processor", &["processor".to_owned()]).await?;
        Ok(Self {
            store,
            processor,
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(256)
                .build()
                .context("build the gates' HTTP client")?,
            instances,
            progress,
            quiet: json,
            serve_flags: Vec::new(),
        })
    }

    fn api_args(&self, lease_ms: u64, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--store".into(),
            self.store.to_string(),
            "--processor-url".into(),
            self.processor.url.clone(),
            "--lease-ms".into(),
            lease_ms.to_string(),
            "--business-db".into(),
            self.dir
                .path()
                .join("business.sqlite3")
                .display()
                .to_string(),
        ];
        args.extend(self.serve_flags.iter().cloned());
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    /// Starts every API server with `flag` as well (e.g. `--pg-fewest-round-trips`).
    #[must_use]
    pub fn with_serve_flag(mut self, flag: &str) -> Self {
        self.serve_flags.push(flag.to_owned());
        self
    }

    /// The outside card processor's base URL (`http://127.0.0.1:PORT`).
    pub fn processor_url(&self) -> &str {
        &self.processor.url
    }

    /// Starts an API server on the store with `extra` arguments, and the gates' short lease
    /// ([`GATE_LEASE_MS`]).
    pub async fn start_api(&self, extra: &[&str]) -> Result<Proc> {
        self.start_api_leased(GATE_LEASE_MS, extra).await
    }

    /// Starts an API server on the store with a lease of `lease_ms` milliseconds and `extra`
    /// arguments.
    pub async fn start_api_leased(&self, lease_ms: u64, extra: &[&str]) -> Result<Proc> {
        Proc::start("the API server", &self.api_args(lease_ms, extra)).await
    }

    /// The processor's ledger for charges or emails, summed per `(account, Idempotency-Key)` of
    /// the API request that caused them (from the metadata the API sends along):
    /// (calls, executions). One logical request must make exactly one execution.
    pub async fn ledger(&self, what: &str) -> Result<BTreeMap<(String, String), (u64, u64)>> {
        let v: Value = self
            .http
            .get(format!("{}/{what}", self.processor.url))
            .send()
            .await?
            .json()
            .await?;
        let mut out = BTreeMap::new();
        for e in v["entries"].as_array().cloned().unwrap_or_default() {
            let who = (
                e["metadata"]["account"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["metadata"]["idempotency_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            let sum = out.entry(who).or_insert((0, 0));
            sum.0 += e["calls"].as_u64().unwrap_or(0);
            sum.1 += e["executions"].as_u64().unwrap_or(0);
        }
        Ok(out)
    }

    /// Shows what the gates are doing now.
    pub fn step(&self, msg: impl Into<String>) {
        let msg = msg.into();
        // Not a terminal (CI, a pipe): the spinner is hidden, so say each step on its own line.
        if self.progress.is_hidden() && !self.quiet {
            eprintln!("oncely gates: {msg}");
        }
        self.progress.set_message(msg);
        self.progress.tick();
    }
}
