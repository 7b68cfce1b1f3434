//! Many clients updating one row under optimistic concurrency control (OCC).
//!
//! # The model
//!
//! One server holds one row with a version number. Each client wants to update the row once:
//!
//! 1. it sends a read; the server answers with the current version;
//! 2. it sends a conditional write carrying that version; the server applies it (and bumps the
//!    version) only if the version is still current, otherwise the write fails;
//! 3. on a failed write the client sleeps for its strategy's backoff and starts over at 1.
//!
//! Every message crosses a network whose delay is `|Normal(mean, sd)|` (default 10 ms and 2 ms).
//! All clients start at time 0. The simulation is a discrete-event loop over a priority queue of
//! message arrivals; nothing about the outcome is scripted. **Work** is the number of write calls
//! the server handled; **completion time** is when the last client learned its write succeeded.
//! Each run is repeated with different seeds and averaged, as in the AWS Architecture Blog post
//! "Exponential Backoff And Jitter" whose setup (100 clients, base 5 ms, cap 2 s) is the default.
//!
//! ```
//! use oncely_client::simulate::{ContentionConfig, Strategy, run_contention};
//!
//! let config = ContentionConfig::new().with_clients(25).with_runs(3).with_seed(7);
//! let a = run_contention(&config, Strategy::FullJitter);
//! let b = run_contention(&config, Strategy::FullJitter);
//! assert_eq!(a, b); // deterministic
//! assert!(a.mean_calls >= 25.0);
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::net::Net;
use super::strategy::Strategy;
use crate::backoff::nanos_to_duration;

/// Configuration of a contention simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentionConfig {
    clients: usize,
    base: Duration,
    cap: Duration,
    net_mean: Duration,
    net_sd: Duration,
    runs: u32,
    seed: u64,
}

impl Default for ContentionConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl ContentionConfig {
    /// The published setup: 100 clients, base 5 ms, cap 2 s, network delay 10 ms mean and 2 ms
    /// standard deviation, averaged over 10 runs, seed 1.
    pub const fn new() -> Self {
        Self {
            clients: 100,
            base: Duration::from_millis(5),
            cap: Duration::from_secs(2),
            net_mean: Duration::from_millis(10),
            net_sd: Duration::from_millis(2),
            runs: 10,
            seed: 1,
        }
    }

    /// Number of contending clients.
    pub const fn with_clients(mut self, clients: usize) -> Self {
        self.clients = clients;
        self
    }

    /// Backoff base delay.
    pub const fn with_base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// Backoff cap.
    pub const fn with_cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Network delay mean and standard deviation.
    pub const fn with_network(mut self, mean: Duration, sd: Duration) -> Self {
        self.net_mean = mean;
        self.net_sd = sd;
        self
    }

    /// How many runs (each with its own seed derived from the base seed) are averaged (min 1).
    pub const fn with_runs(mut self, runs: u32) -> Self {
        self.runs = if runs == 0 { 1 } else { runs };
        self
    }

    /// The base seed.
    pub const fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Number of contending clients.
    pub const fn clients(&self) -> usize {
        self.clients
    }
}

/// The result of [`run_contention`], averaged over the runs.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ContentionReport {
    /// The strategy simulated.
    pub strategy: Strategy,
    /// Number of clients.
    pub clients: usize,
    /// Runs averaged.
    pub runs: u32,
    /// Mean write calls per run (the work).
    pub mean_calls: f64,
    /// Mean completion time per run.
    pub mean_completion: Duration,
    /// Clients that completed in every run (always all of them: OCC always makes progress).
    pub completed: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A client's read reaches the server.
    Read { client: usize },
    /// The read's answer reaches the client.
    ReadReply { client: usize, version: u64 },
    /// A client's conditional write reaches the server.
    Write { client: usize, version: u64 },
    /// The write's answer reaches the client.
    WriteReply { client: usize, ok: bool },
}

struct RunResult {
    calls: u64,
    completion_ns: u64,
    completed: usize,
}

fn run_once(config: &ContentionConfig, strategy: Strategy, seed: u64) -> RunResult {
    let mut rng = StdRng::seed_from_u64(seed);
    let net = Net {
        mean: config.net_mean,
        sd: config.net_sd,
    };
    let mut queue: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |queue: &mut BinaryHeap<_>, at: u64, event: Event| {
        seq += 1;
        queue.push(Reverse((at, seq, event)));
    };
    let mut failures = vec![0u32; config.clients];
    let mut previous: Vec<Option<Duration>> = vec![None; config.clients];
    for client in 0..config.clients {
        let at = net.delay(&mut rng);
        push(&mut queue, at, Event::Read { client });
    }
    let mut version = 0u64;
    let mut calls = 0u64;
    let mut completed = 0usize;
    let mut now = 0u64;
    while let Some(Reverse((at, _, event))) = queue.pop() {
        now = at;
        match event {
            Event::Read { client } => {
                let reply = now.saturating_add(net.delay(&mut rng));
                push(&mut queue, reply, Event::ReadReply { client, version });
            }
            Event::ReadReply { client, version } => {
                let arrive = now.saturating_add(net.delay(&mut rng));
                push(&mut queue, arrive, Event::Write { client, version });
            }
            Event::Write {
                client,
                version: read,
            } => {
                calls += 1;
                let ok = read == version;
                if ok {
                    version += 1;
                }
                let reply = now.saturating_add(net.delay(&mut rng));
                push(&mut queue, reply, Event::WriteReply { client, ok });
            }
            Event::WriteReply { client, ok } => {
                if ok {
                    completed += 1;
                } else {
                    let retry = failures[client];
                    failures[client] = failures[client].saturating_add(1);
                    let sleep =
                        strategy.delay(config.base, config.cap, retry, previous[client], &mut rng);
                    previous[client] = Some(sleep);
                    let sleep_ns = u64::try_from(sleep.as_nanos()).unwrap_or(u64::MAX);
                    let at = now
                        .saturating_add(sleep_ns)
                        .saturating_add(net.delay(&mut rng));
                    push(&mut queue, at, Event::Read { client });
                }
            }
        }
    }
    RunResult {
        calls,
        completion_ns: now,
        completed,
    }
}

/// Simulates one strategy, averaged over the configured runs.
pub fn run_contention(config: &ContentionConfig, strategy: Strategy) -> ContentionReport {
    let mut calls = 0u128;
    let mut completion = 0u128;
    let mut completed = usize::MAX;
    for run in 0..config.runs {
        let seed = config
            .seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(u64::from(run));
        let r = run_once(config, strategy, seed);
        calls += u128::from(r.calls);
        completion += u128::from(r.completion_ns);
        completed = completed.min(r.completed);
    }
    let runs = u128::from(config.runs);
    ContentionReport {
        strategy,
        clients: config.clients,
        runs: config.runs,
        mean_calls: calls as f64 / runs as f64,
        mean_completion: nanos_to_duration(completion / runs),
        completed,
    }
}

/// Simulates every strategy in [`Strategy::ALL`] with the same configuration and seeds.
pub fn compare_contention(config: &ContentionConfig) -> Vec<ContentionReport> {
    Strategy::ALL
        .iter()
        .map(|s| run_contention(config, *s))
        .collect()
}
