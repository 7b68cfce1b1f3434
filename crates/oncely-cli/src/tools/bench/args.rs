//! The arguments of `oncely bench`: the flags, the key modes and the caps on a run.

use anyhow::{Context as _, Result, bail};
use std::str::FromStr;

/// The most requests one run may send.
pub const MAX_REQUESTS: u64 = 10_000_000;
/// The longest run, in seconds.
pub const MAX_DURATION_SECS: f64 = 3_600.0;
/// The most concurrent workers.
pub const MAX_CONCURRENCY: usize = 1_024;
/// The largest key ring for `--keys duplicate=P`.
pub const MAX_RING: usize = 65_536;
/// Which `Idempotency-Key` each request carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyMode {
    /// A new key on every request.
    Unique,
    /// This share (0.0 to 1.0) of requests reuses a recently completed key.
    Duplicate(f64),
    /// No key header.
    None,
}

impl FromStr for KeyMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "unique" => Ok(Self::Unique),
            "none" => Ok(Self::None),
            _ => {
                let Some(p) = s.strip_prefix("duplicate=") else {
                    bail!("unknown key mode {s:?}: expected unique, none or duplicate=P");
                };
                let p: f64 = p
                    .parse()
                    .with_context(|| format!("duplicate=P: {p:?} is not a number"))?;
                if !(0.0..=1.0).contains(&p) {
                    bail!("duplicate=P: P must be between 0.0 and 1.0, got {p}");
                }
                Ok(Self::Duplicate(p))
            }
        }
    }
}

impl std::fmt::Display for KeyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unique => f.write_str("unique"),
            Self::None => f.write_str("none"),
            Self::Duplicate(p) => write!(f, "duplicate={p}"),
        }
    }
}

/// Arguments of `oncely bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Full URL of the endpoint, e.g. http://127.0.0.1:8080/v1/orders.
    #[arg(long)]
    pub url: String,
    /// HTTP method.
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// Request body (sent with --content-type); default: one order item, for POST /v1/orders.
    #[arg(long, default_value = r#"{"items":[{"sku":"bench","quantity":1}]}"#)]
    pub body: String,
    /// Content-Type of the body.
    #[arg(long, default_value = "application/json")]
    pub content_type: String,
    /// Authorization header value, e.g. 'Bearer acct_1'.
    #[arg(long)]
    pub auth: Option<String>,
    /// Extra header 'Name: value' (repeatable).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,
    /// Concurrent workers, each with one request in flight (1 to 1024).
    #[arg(long, short = 'c', default_value_t = 8)]
    pub concurrency: usize,
    /// Stop after this many seconds (default 10 when --requests is not given; at most 3600).
    #[arg(long, conflicts_with = "requests")]
    pub duration_secs: Option<f64>,
    /// Stop after this many requests (at most 10,000,000).
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Key mode: unique, none or duplicate=P (P from 0.0 to 1.0).
    #[arg(long, default_value = "unique")]
    pub keys: KeyMode,
    /// How many recently completed keys `duplicate=P` picks from.
    #[arg(long, default_value_t = 64)]
    pub ring: usize,
    /// Per-request timeout, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
    /// Seed for the key-reuse choices (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one machine-readable JSON record instead of the text report (hides the progress bar).
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_modes_parse() {
        assert_eq!("unique".parse::<KeyMode>().unwrap(), KeyMode::Unique);
        assert_eq!("none".parse::<KeyMode>().unwrap(), KeyMode::None);
        assert_eq!(
            "duplicate=0.25".parse::<KeyMode>().unwrap(),
            KeyMode::Duplicate(0.25)
        );
        assert_eq!(
            "duplicate=1".parse::<KeyMode>().unwrap(),
            KeyMode::Duplicate(1.0)
        );
        assert!("duplicate=1.5".parse::<KeyMode>().is_err());
        assert!("duplicate=-0.1".parse::<KeyMode>().is_err());
        assert!("duplicate=x".parse::<KeyMode>().is_err());
        assert!("dup".parse::<KeyMode>().is_err());
        assert_eq!(KeyMode::Duplicate(0.5).to_string(), "duplicate=0.5");
    }
}
