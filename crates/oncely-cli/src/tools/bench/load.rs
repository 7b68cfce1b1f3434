//! The load itself: the workers, their keys and their tallies, and [`measure`], which runs them
//! and sums up a [`Report`].

use super::args::{Args, KeyMode, MAX_CONCURRENCY, MAX_DURATION_SECS, MAX_REQUESTS, MAX_RING};
use super::report::{Latency, Report};
use anyhow::{Context as _, Result, bail};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::{BTreeMap, VecDeque};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The slowest latency the histogram records, in microseconds (10 minutes); slower ones are
/// clamped to it.
const MAX_LATENCY_US: u64 = 600_000_000;

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

#[cfg(test)]
mod tests {
    use super::*;

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
