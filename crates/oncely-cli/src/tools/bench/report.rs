//! What a run measured: the record `--json` prints ([`Report`]).

use serde::Serialize;
use std::collections::BTreeMap;

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest request.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The machine-readable record `--json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The endpoint.
    pub url: String,
    /// The method.
    pub method: String,
    /// The key mode, as given.
    pub keys: String,
    /// Concurrent workers.
    pub concurrency: usize,
    /// Requests sent (answered or failed).
    pub requests: u64,
    /// Requests that got an HTTP response.
    pub responses: u64,
    /// Wall-clock time of the run, in seconds.
    pub duration_secs: f64,
    /// Requests per second (`requests / duration_secs`).
    pub requests_per_sec: f64,
    /// Latency of the answered requests, in milliseconds.
    pub latency_ms: Latency,
    /// Responses per HTTP status code.
    pub status: BTreeMap<String, u64>,
    /// Requests that got no response, per kind (connect, timeout, body, other).
    pub errors: BTreeMap<String, u64>,
    /// Responses that carried `Idempotent-Replayed: true`.
    pub replayed: u64,
    /// Requests that carried a newly minted key.
    pub keys_minted: u64,
    /// Requests that reused a key from the ring.
    pub keys_reused: u64,
}
