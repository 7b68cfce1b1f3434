//! The gates' output: a `PASS`/`FAIL` line per gate as it finishes, then a table (or, with
//! `--json`, one JSON document on stdout and nothing else), then the details of failed gates on
//! stderr.

use super::GateResult;
use crate::serve::StoreUrl;
use anyhow::Result;
use indicatif::ProgressBar;
use serde_json::json;
use std::time::Duration;

/// The verdicts so far, and where they go.
pub struct Report {
    store: StoreUrl,
    json: bool,
    progress: ProgressBar,
    results: Vec<GateResult>,
}

impl Report {
    /// A report of gates on `store`; `json` for `--json`; `progress` is the spinner the lines
    /// print above.
    pub fn new(store: StoreUrl, json: bool, progress: ProgressBar) -> Self {
        Self {
            store,
            json,
            progress,
            results: Vec::new(),
        }
    }

    /// Says (without `--json`) that gate `n` of `total`, `title`, starts.
    pub fn starting(&self, n: usize, total: usize, title: &str) {
        if self.json {
            return;
        }
        let line = format!("[{n}/{total}] {title} ...");
        if self.progress.is_hidden() {
            eprintln!("{line}");
        } else {
            self.progress.println(line);
        }
    }

    /// Records a gate's verdict and, without `--json`, says it at once.
    pub fn push(&mut self, r: GateResult) {
        if !self.json {
            let line = format!(
                "{} {}: {}",
                if r.passed { "PASS" } else { "FAIL" },
                r.name,
                r.summary
            );
            if self.progress.is_hidden() {
                eprintln!("{line}");
            } else {
                self.progress.println(line);
            }
        }
        self.results.push(r);
    }

    /// Prints the table or the JSON document after `elapsed`; returns whether all passed.
    ///
    /// # Errors
    ///
    /// The JSON document cannot be serialized.
    pub fn finish(self, elapsed: Duration) -> Result<bool> {
        let Self {
            store,
            json,
            progress,
            results,
        } = self;
        progress.finish_and_clear();
        let passed = results.iter().all(|r| r.passed);
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({
                    "store": store.to_string(), "passed": passed, "seconds": elapsed.as_secs_f64(), "gates": results,
                }))?
            );
        } else {
            println!();
            println!("{:<19} {:<6} measured", "gate", "result");
            println!("{:<19} {:<6} --------", "----", "------");
            for r in &results {
                println!(
                    "{:<19} {:<6} {}",
                    r.name,
                    if r.passed { "PASS" } else { "FAIL" },
                    r.summary
                );
            }
            println!();
            println!(
                "store: {store}; {} in {:.1} s",
                if passed {
                    "all gates passed"
                } else {
                    "SOME GATES FAILED"
                },
                elapsed.as_secs_f64()
            );
            for r in results.iter().filter(|r| !r.passed) {
                eprintln!("{} details: {}", r.name, r.details);
            }
        }
        Ok(passed)
    }
}
