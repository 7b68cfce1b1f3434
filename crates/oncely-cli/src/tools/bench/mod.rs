//! `oncely bench`: an HTTP load generator that mints `Idempotency-Key`s.
//!
//! Generic load generators (wrk, oha) send the same request over and over; an idempotent write
//! endpoint then replays one stored response and the numbers measure the replay path only. This
//! one chooses a key per request:
//!
//! - `--keys unique`: every request carries a new key (first executions);
//! - `--keys duplicate=P`: a share `P` (0.0 to 1.0) of requests reuses a key from a ring of the
//!   last `--ring` (default 64) keys whose request completed with a 2xx status, the others carry a
//!   new key; while the ring is still empty a new key is minted (so `duplicate=1.0` measures
//!   replays once the first few requests have completed);
//! - `--keys none`: no key header at all (for endpoints without the layer, or to see the 400).
//!
//! It sends requests from `--concurrency` workers over a keep-alive connection pool, with no
//! retries (it measures the server, not a client's retry loop), and stops by itself after
//! `--requests N` or `--duration-secs S` (default 10 seconds). Hard caps: at most 10,000,000
//! requests, 3,600 seconds and 1,024 workers.
//!
//! It reports requests per second, latency percentiles (p50/p90/p99/max, measured from sending
//! the request to reading the last byte of the response body, recorded in microseconds in an
//! HDR histogram with 3 significant digits), status counts, transport errors, and how many
//! responses carried `Idempotent-Replayed: true`. `--json` prints one machine-readable record
//! (see [`Report`]) and hides the progress bar.
//!
//! Exit status: 0 when every request got an HTTP response below 500, 1 otherwise.
//!
//! ```text
//! oncely serve --store memory --addr 127.0.0.1:8080 &
//! oncely bench --url http://127.0.0.1:8080/v1/orders --auth 'Bearer acct_1' \
//!     --body '{"items":[{"sku":"A","quantity":1}]}' --concurrency 16 --duration-secs 10 --keys unique
//! ```
//!
//! The flags are in [`args`], the load in [`load`] ([`measure`]), the record it makes in
//! [`report`].

mod args;
mod load;
mod report;

use anyhow::Result;
pub use args::Args;
pub use load::measure;
use report::Report;

fn print_text(r: &Report) {
    println!(
        "{} {}  keys={}  concurrency={}",
        r.method, r.url, r.keys, r.concurrency
    );
    println!(
        "  {} requests in {:.2} s: {:.1} requests/s",
        r.requests, r.duration_secs, r.requests_per_sec
    );
    println!(
        "  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  mean {:.3}",
        r.latency_ms.p50, r.latency_ms.p90, r.latency_ms.p99, r.latency_ms.max, r.latency_ms.mean
    );
    let status: Vec<String> = r.status.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("  status: {}", status.join(", "));
    if !r.errors.is_empty() {
        let errors: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        println!("  transport errors: {}", errors.join(", "));
    }
    println!(
        "  replayed: {}  keys minted: {}  keys reused: {}",
        r.replayed, r.keys_minted, r.keys_reused
    );
}

/// Runs `oncely bench`; returns whether it passed: every request got an HTTP response below 500.
///
/// # Errors
///
/// See [`measure`]; also a report that cannot be serialized.
pub async fn run(args: Args) -> Result<bool> {
    let report = measure(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report);
    }
    let server_errors: u64 = report
        .status
        .iter()
        .filter(|(k, _)| k.starts_with('5'))
        .map(|(_, v)| v)
        .sum();
    let successes: u64 = report
        .status
        .iter()
        .filter(|(k, _)| k.starts_with('2'))
        .map(|(_, v)| v)
        .sum();
    if successes == 0 {
        eprintln!(
            "oncely bench: no request succeeded (no 2xx answer): the figures above measure errors, not the endpoint; check --url, --auth, --body and --keys"
        );
    }
    Ok(report.errors.is_empty() && server_errors == 0 && successes > 0)
}
