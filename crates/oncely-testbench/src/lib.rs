//! # oncely-testbench: the scripted fault server of the retry conformance suite
//!
//! Oncely's retry SDKs (Rust, Python, Node) are held to one language-neutral data file,
//! `conformance/retry/scenarios.json` (its format: `conformance/retry/README.md`). This crate
//! serves it: each request names its scenario, run and call in headers (`x-oncely-scenario`,
//! `x-oncely-run`, `x-oncely-call`), the testbench counts the attempts of that call and plays
//! the scenario's step for this attempt, faults included, at the socket level:
//!
//! - a delay before answering (the client's attempt timeout fires first, or not);
//! - a **reset** after the request was read: `SO_LINGER` 0, then close, so the client gets a
//!   TCP RST and no answer;
//! - a **hang**: the request is read and never answered, until the client closes;
//! - a **cut-off body**: the head declares the full `content-length`, part of the body follows,
//!   then a FIN;
//! - a **slow body**: the body in chunks, apart in time.
//!
//! `GET /_testbench/runs/<run>` reports what each attempt sent (method, path, headers, the
//! `Idempotency-Key`, the body's length and SHA-256) and when it arrived and ended, in
//! milliseconds from the run's first attempt; [`report`] has the shape. `GET /_testbench/info`
//! gives the loopback URL where nothing listens, for "connection refused" scenarios.
//!
//! The `oncely` binary runs it as `oncely testbench --addr 127.0.0.1:0 [--scenarios PATH]`,
//! which prints the URL as its first line of standard output and serves until killed. The Rust
//! SDK's runner (`crates/oncely-client/tests/conformance.rs`) starts it in process:
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use oncely_testbench::{Testbench, scenario::ScenarioFile};
//!
//! let file = ScenarioFile::bundled();
//! let bench = Testbench::start("127.0.0.1:0".parse().unwrap(), &file).await?;
//! println!("{} ({} scenarios)", bench.url(), file.scenarios.len());
//! # Ok(()) }
//! ```

pub mod date;
pub mod report;
pub mod scenario;
pub mod server;

pub use report::{Answer, AttemptReport, RunReport};
pub use scenario::{LoadError, ScenarioFile};
pub use server::Testbench;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// What `oncely testbench` does: loads `scenarios` (the bundled file when `None`), binds
/// `addr`, prints the URL as the first line of standard output (flushed), and serves until the
/// process is killed.
///
/// # Errors
///
/// The file cannot be read or is invalid, or the address cannot be bound.
pub async fn serve(addr: SocketAddr, scenarios: Option<&Path>) -> Result<(), ServeError> {
    let file = match scenarios {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| ServeError::Read {
                path: path.display().to_string(),
                source: e,
            })?;
            ScenarioFile::from_json(&text)?
        }
        None => ScenarioFile::bundled(),
    };
    let bench = Testbench::start(addr, &file)
        .await
        .map_err(ServeError::Bind)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", bench.url()).map_err(ServeError::Bind)?;
    out.flush().map_err(ServeError::Bind)?;
    drop(out);
    eprintln!(
        "oncely testbench: {} scenarios (format {}); refused_url {}",
        file.scenarios.len(),
        file.format,
        bench.refused_url()
    );
    bench.wait().await;
    Ok(())
}

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The scenario file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The scenario file is invalid.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The address could not be bound (or standard output written).
    #[error("cannot serve: {0}")]
    Bind(std::io::Error),
}
