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

use anyhow::{Context as _, Result, bail};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most requests one run may send.
pub const MAX_REQUESTS: u64 = 10_000_000;
/// The longest run, in seconds.
pub const MAX_DURATION_SECS: f64 = 3_600.0;
/// The most concurrent workers.
pub const MAX_CONCURRENCY: usize = 1_024;
/// The largest key ring for `--keys duplicate=P`.
pub const MAX_RING: usize = 65_536;
/// The slowest latency the histogram records, in microseconds (10 minutes); slower ones are
/// clamped to it.
const MAX_LATENCY_US: u64 = 600_000_000;

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

/// What one worker saw.
struct Tally {
    hist: Histogram<u64>,
    status: BTreeMap<u16, u64>,
    errors: BTreeMap<&'static str, u64>,
    replayed: u64,
    minted: u64,
    reused: u64,
}

impl Tally {
    fn new() -> Result<Self> {
        Ok(Self {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
                .context("create the latency histogram")?,
            status: BTreeMap::new(),
            errors: BTreeMap::new(),
            replayed: 0,
            minted: 0,
            reused: 0,
        })
    }

    fn merge(&mut self, other: Self) -> Result<()> {
        self.hist
            .add(&other.hist)
            .context("merge latency histograms")?;
        for (k, v) in other.status {
            *self.status.entry(k).or_default() += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.replayed += other.replayed;
        self.minted += other.minted;
        self.reused += other.reused;
        Ok(())
    }
}

/// A small, fast, seedable generator (SplitMix64) for the key-reuse coin flips.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1).
    fn next_f64(&mut self) -> f64 {
        // 53 random bits: the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        let x = (self.next_u64() >> 11) as f64;
        x / (1u64 << 53) as f64
    }
}

/// What every worker shares.
struct Shared {
    client: reqwest::Client,
    method: reqwest::Method,
    url: reqwest::Url,
    body: bytes::Bytes,
    headers: reqwest::header::HeaderMap,
    keys: KeyMode,
    /// Bound by count: the next request number; workers stop at `limit`.
    issued: AtomicU64,
    limit: Option<u64>,
    deadline: Option<Instant>,
    /// Requests finished, for the progress bar.
    done: AtomicU64,
    /// Keys minted so far (their number makes them unique within the run).
    minted: AtomicU64,
    key_prefix: String,
    ring: Mutex<VecDeque<String>>,
    ring_cap: usize,
    stop: AtomicBool,
}

impl Shared {
    /// Whether a worker may send one more request.
    fn may_send(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        if let Some(deadline) = self.deadline {
            return Instant::now() < deadline;
        }
        let limit = self.limit.unwrap_or(0);
        self.issued.fetch_add(1, Ordering::Relaxed) < limit
    }

    fn mint(&self) -> String {
        let n = self.minted.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.key_prefix)
    }

    /// The key for the next request and whether it was reused.
    fn pick_key(&self, rng: &mut SplitMix) -> Option<(String, bool)> {
        match self.keys {
            KeyMode::None => None,
            KeyMode::Unique => Some((self.mint(), false)),
            KeyMode::Duplicate(p) => {
                if rng.next_f64() < p {
                    let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
                    if !ring.is_empty() {
                        // The ring never holds more than MAX_RING entries: fits in u64 and back.
                        let i = (rng.next_u64() % ring.len() as u64) as usize;
                        return Some((ring[i].clone(), true));
                    }
                }
                Some((self.mint(), false))
            }
        }
    }

    fn remember(&self, key: String) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() >= self.ring_cap {
            ring.pop_front();
        }
        ring.push_back(key);
    }
}

fn error_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "other"
    }
}

async fn worker(shared: Arc<Shared>, seed: u64) -> Result<Tally> {
    let mut tally = Tally::new()?;
    let mut rng = SplitMix(seed);
    while shared.may_send() {
        let key = shared.pick_key(&mut rng);
        let mut req = shared
            .client
            .request(shared.method.clone(), shared.url.clone())
            .headers(shared.headers.clone())
            .body(shared.body.clone());
        if let Some((k, reused)) = &key {
            req = req.header("idempotency-key", k.as_str());
            if *reused {
                tally.reused += 1;
            } else {
                tally.minted += 1;
            }
        }
        let started = Instant::now();
        let outcome = async {
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let replayed = resp
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
            resp.bytes().await?;
            Ok::<_, reqwest::Error>((status, replayed))
        }
        .await;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        match outcome {
            Ok((status, replayed)) => {
                tally
                    .hist
                    .saturating_record(micros.clamp(1, MAX_LATENCY_US));
                *tally.status.entry(status).or_default() += 1;
                tally.replayed += u64::from(replayed);
                if let Some((k, false)) = key
                    && (200..300).contains(&status)
                    && matches!(shared.keys, KeyMode::Duplicate(_))
                {
                    shared.remember(k);
                }
            }
            Err(e) => *tally.errors.entry(error_kind(&e)).or_default() += 1,
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(tally)
}

fn build_headers(args: &Args) -> Result<reqwest::header::HeaderMap> {
    use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
    let mut map = HeaderMap::new();
    map.insert(
        CONTENT_TYPE,
        HeaderValue::from_str(&args.content_type).context("--content-type")?,
    );
    if let Some(auth) = &args.auth {
        map.insert(
            AUTHORIZATION,
            HeaderValue::from_str(auth).context("--auth")?,
        );
    }
    for h in &args.headers {
        let Some((name, value)) = h.split_once(':') else {
            bail!("--header {h:?}: expected 'Name: value'");
        };
        map.append(
            HeaderName::from_str(name.trim()).with_context(|| format!("--header {h:?}"))?,
            HeaderValue::from_str(value.trim()).with_context(|| format!("--header {h:?}"))?,
        );
    }
    Ok(map)
}

fn millis(us: u64) -> f64 {
    // Latencies are below 2^53 microseconds: exact.
    #[allow(clippy::cast_precision_loss)]
    let us = us as f64;
    us / 1_000.0
}

/// Runs the load and returns the report (without printing it).
///
/// # Errors
///
/// Invalid arguments (URL, method, headers, bounds beyond the caps) or a client that cannot be
/// built.
pub async fn measure(args: &Args) -> Result<Report> {
    let url = reqwest::Url::parse(&args.url).with_context(|| format!("--url {:?}", args.url))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--url must be http:// or https://");
    }
    let method = reqwest::Method::from_bytes(args.method.to_ascii_uppercase().as_bytes())
        .with_context(|| format!("--method {:?}", args.method))?;
    if !(1..=MAX_CONCURRENCY).contains(&args.concurrency) {
        bail!("--concurrency must be 1 to {MAX_CONCURRENCY}");
    }
    if !(1..=MAX_RING).contains(&args.ring) {
        bail!("--ring must be 1 to {MAX_RING}");
    }
    let (limit, duration) = match (args.requests, args.duration_secs) {
        (Some(n), _) if n == 0 || n > MAX_REQUESTS => {
            bail!("--requests must be 1 to {MAX_REQUESTS}")
        }
        (Some(n), _) => (Some(n), None),
        (None, Some(s)) if !(s > 0.0 && s <= MAX_DURATION_SECS) => {
            bail!("--duration-secs must be above 0 and at most {MAX_DURATION_SECS}")
        }
        (None, Some(s)) => (None, Some(Duration::from_secs_f64(s))),
        (None, None) => (None, Some(Duration::from_secs(10))),
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms.max(1)))
        .pool_max_idle_per_host(args.concurrency)
        .tcp_nodelay(true)
        .build()
        .context("build the HTTP client")?;
    let seed = args.seed.unwrap_or_else(|| {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
                & u128::from(u64::MAX),
        )
        .unwrap_or(0)
    });
    let started = Instant::now();
    let shared = Arc::new(Shared {
        client,
        method: method.clone(),
        url,
        body: bytes::Bytes::from(args.body.clone().into_bytes()),
        headers: build_headers(args)?,
        keys: args.keys,
        issued: AtomicU64::new(0),
        limit,
        deadline: duration.map(|d| started + d),
        done: AtomicU64::new(0),
        minted: AtomicU64::new(0),
        // A fresh prefix per run: keys never collide with an earlier run's records.
        key_prefix: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        ring: Mutex::new(VecDeque::with_capacity(args.ring)),
        ring_cap: args.ring,
        stop: AtomicBool::new(false),
    });

    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let (len, template) = match (limit, duration) {
            (Some(n), _) => (
                n,
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec})",
            ),
            (None, Some(d)) => (
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
                "{spinner} [{elapsed_precise}] {wide_bar} {msg}",
            ),
            (None, None) => (0, "{spinner} {msg}"),
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        bar.set_style(ProgressStyle::with_template(template).context("progress bar template")?);
        bar
    };
    let ticker = {
        let shared = shared.clone();
        let bar = bar.clone();
        let by_count = limit.is_some();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let done = shared.done.load(Ordering::Relaxed);
                if by_count {
                    bar.set_position(done);
                } else {
                    bar.set_position(u64::try_from(started.elapsed().as_millis()).unwrap_or(0));
                    bar.set_message(format!("{done} requests"));
                }
            }
        })
    };

    let workers: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let seed = seed ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
            tokio::spawn(worker(shared.clone(), seed))
        })
        .collect();
    let mut total = Tally::new()?;
    let mut first_err = None;
    for w in workers {
        match w.await.context("a bench worker panicked")? {
            Ok(t) => total.merge(t)?,
            Err(e) => {
                shared.stop.store(true, Ordering::Relaxed);
                first_err.get_or_insert(e);
            }
        }
    }
    let elapsed = started.elapsed();
    ticker.abort();
    bar.finish_and_clear();
    if let Some(e) = first_err {
        return Err(e);
    }

    let responses = total.hist.len();
    let errors: u64 = total.errors.values().sum();
    let requests = responses + errors;
    let secs = elapsed.as_secs_f64();
    // Counts stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let rps = if secs > 0.0 {
        requests as f64 / secs
    } else {
        0.0
    };
    let h = &total.hist;
    let latency = if responses == 0 {
        Latency {
            p50: 0.0,
            p90: 0.0,
            p99: 0.0,
            max: 0.0,
            mean: 0.0,
        }
    } else {
        Latency {
            p50: millis(h.value_at_quantile(0.50)),
            p90: millis(h.value_at_quantile(0.90)),
            p99: millis(h.value_at_quantile(0.99)),
            max: millis(h.max()),
            mean: h.mean() / 1_000.0,
        }
    };
    Ok(Report {
        url: args.url.clone(),
        method: method.to_string(),
        keys: args.keys.to_string(),
        concurrency: args.concurrency,
        requests,
        responses,
        duration_secs: secs,
        requests_per_sec: rps,
        latency_ms: latency,
        status: total
            .status
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        errors: total
            .errors
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect(),
        replayed: total.replayed,
        keys_minted: total.minted,
        keys_reused: total.reused,
    })
}

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

    #[test]
    fn splitmix_floats_stay_in_range_and_spread() {
        let mut rng = SplitMix(7);
        let draws: Vec<f64> = (0..10_000).map(|_| rng.next_f64()).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let below_half = draws.iter().filter(|x| **x < 0.5).count();
        // A fair coin over 10,000 flips lands within 4,700..5,300 (6 sigma).
        assert!((4_700..5_300).contains(&below_half), "{below_half}");
    }
}
