//! `oncely simulate`: the client SDK's deterministic retry simulations, as tables (and a plot).
//!
//! Two tables, both from [`oncely_client::simulate`] (seeded discrete-event models; the same
//! flags always print the same numbers):
//!
//! - **(a) contention**: `--clients` clients (default 100) update one row under optimistic
//!   concurrency, per backoff strategy (no backoff, exponential without jitter, equal jitter,
//!   full jitter, decorrelated jitter): mean write calls (the work) and mean completion time, in
//!   milliseconds, averaged over `--runs` runs. `--clients-sweep 10,50,100,200` prints one block
//!   per value. The setup is the AWS Architecture Blog post "Exponential Backoff And Jitter"
//!   (base 5 ms, cap 2 s, network 10 ms mean and 2 ms standard deviation).
//! - **(b) fleet outage**: `--instances` instances (default 100), each starting
//!   `--calls-per-instance` logical calls (default 1,000) one every 100 ms, retrying failed
//!   requests up to 3 attempts with full jitter (500 ms base, 8 s cap), without and with the
//!   per-instance retry budget, at each failure rate of `--failure-rates` (default
//!   `0.1,0.5,1.0`; 1.0 is a total outage). The load amplification factor is requests sent per
//!   logical call (1.0 = no retry load, 3.0 = every call used all 3 attempts).
//!
//! After each contention block a verdict line says whether the published ranking held
//! (`full jitter did the least work: yes/no`, and the three other orderings). The command is
//! informational: it exits 0 whatever the ranking.
//!
//! `--plot FILE.svg` writes one SVG holding three charts: mean calls and mean completion time per
//! strategy (grouped by clients value, logarithmic axis), and the amplification without and with
//! the budget per failure rate.

mod plot;

use anyhow::{Context as _, Result, bail};
use oncely_client::simulate::{
    ContentionConfig, ContentionReport, OutageConfig, OutageReport, Strategy, compare_budget,
    compare_contention,
};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

/// The most contending clients one simulation may model (no backoff costs about clients²
/// calls per run).
const MAX_CLIENTS: usize = 10_000;
/// The most instances one outage simulation may model.
const MAX_INSTANCES: usize = 100_000;

/// Arguments of `oncely simulate`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Contending clients in the contention table (not with --clients-sweep).
    #[arg(long, default_value_t = 100, conflicts_with = "clients_sweep")]
    clients: usize,
    /// Several clients values, comma-separated (e.g. 10,50,100,200): one contention block each.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    clients_sweep: Vec<usize>,
    /// Instances in the fleet-outage table, each with its own client and retry budget.
    #[arg(long, default_value_t = 100)]
    instances: usize,
    /// Logical calls each instance starts in the fleet-outage table (one every 100 ms).
    #[arg(long, default_value_t = 1000)]
    calls_per_instance: u32,
    /// Failure rates of the fleet-outage table, comma-separated, each in 0.0..=1.0
    /// (1.0 = a total outage).
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "0.1,0.5,1.0")]
    failure_rates: Vec<f64>,
    /// Contention backoff base delay, in milliseconds.
    #[arg(long, default_value_t = 5)]
    base_ms: u64,
    /// Contention backoff cap, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    cap_ms: u64,
    /// The base seed of both simulations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Contention runs averaged per strategy (each with its own seed derived from --seed).
    #[arg(long, default_value_t = 10)]
    runs: u32,
    /// Print machine-readable JSON instead of the tables.
    #[arg(long)]
    json: bool,
    /// Also write the charts to this SVG file (one file, three charts).
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// One block of the contention table: every strategy at one clients value.
#[derive(Debug, Clone)]
pub(crate) struct ContentionBlock {
    pub(crate) clients: usize,
    pub(crate) reports: Vec<ContentionReport>,
}

/// Whether the published ranking held in one contention block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ranking {
    /// Full jitter made fewer write calls than every other strategy.
    full_least_work: bool,
    /// Decorrelated jitter finished sooner than full jitter, with more calls.
    decorrelated_faster_more_work: bool,
    /// Exponential without jitter had the longest completion time.
    exponential_slowest: bool,
    /// No backoff made the most write calls.
    no_backoff_most_work: bool,
}

impl ContentionBlock {
    fn get(&self, s: Strategy) -> Option<&ContentionReport> {
        self.reports.iter().find(|r| r.strategy == s)
    }

    fn ranking(&self) -> Ranking {
        let others = |s: Strategy| self.reports.iter().filter(move |r| r.strategy != s);
        let (Some(full), Some(decorr), Some(expo), Some(none)) = (
            self.get(Strategy::FullJitter),
            self.get(Strategy::Decorrelated),
            self.get(Strategy::Exponential),
            self.get(Strategy::NoBackoff),
        ) else {
            return Ranking {
                full_least_work: false,
                decorrelated_faster_more_work: false,
                exponential_slowest: false,
                no_backoff_most_work: false,
            };
        };
        Ranking {
            full_least_work: others(Strategy::FullJitter).all(|r| full.mean_calls < r.mean_calls),
            decorrelated_faster_more_work: decorr.mean_completion < full.mean_completion
                && decorr.mean_calls > full.mean_calls,
            exponential_slowest: others(Strategy::Exponential)
                .all(|r| expo.mean_completion > r.mean_completion),
            no_backoff_most_work: others(Strategy::NoBackoff)
                .all(|r| none.mean_calls > r.mean_calls),
        }
    }
}

/// One row of the fleet-outage table: one failure rate, without and with the budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutageRow {
    pub(crate) failure_rate: f64,
    pub(crate) without: OutageReport,
    pub(crate) with: OutageReport,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// A human label of a strategy, as in the blog post.
pub(crate) fn label(s: Strategy) -> &'static str {
    match s {
        Strategy::NoBackoff => "no backoff",
        Strategy::Exponential => "exponential (no jitter)",
        Strategy::EqualJitter => "equal jitter",
        Strategy::FullJitter => "full jitter",
        Strategy::Decorrelated => "decorrelated jitter",
        _ => s.name(),
    }
}

fn validate(args: &Args) -> Result<Vec<usize>> {
    let clients = if args.clients_sweep.is_empty() {
        vec![args.clients]
    } else {
        args.clients_sweep.clone()
    };
    for &c in &clients {
        if !(1..=MAX_CLIENTS).contains(&c) {
            bail!(
                "--clients / --clients-sweep values must be between 1 and {MAX_CLIENTS}, got {c}"
            );
        }
    }
    if !(1..=MAX_INSTANCES).contains(&args.instances) {
        bail!(
            "--instances must be between 1 and {MAX_INSTANCES}, got {}",
            args.instances
        );
    }
    if args.calls_per_instance == 0 {
        bail!("--calls-per-instance must be at least 1");
    }
    if args.instances as u64 * u64::from(args.calls_per_instance) > 100_000_000 {
        bail!("--instances x --calls-per-instance must be at most 100,000,000");
    }
    if args.failure_rates.is_empty() {
        bail!("--failure-rates needs at least one value");
    }
    for &f in &args.failure_rates {
        if !(0.0..=1.0).contains(&f) {
            bail!("--failure-rates values must be between 0.0 and 1.0, got {f}");
        }
    }
    if args.base_ms == 0 {
        bail!("--base-ms must be at least 1");
    }
    if args.cap_ms < args.base_ms {
        bail!(
            "--cap-ms ({}) must be at least --base-ms ({})",
            args.cap_ms,
            args.base_ms
        );
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(p) = &args.plot
        && p.extension().and_then(|e| e.to_str()) != Some("svg")
    {
        bail!("--plot writes SVG: give a file name ending in .svg");
    }
    Ok(clients)
}

/// Runs `oncely simulate`; always `Ok(true)` once the flags are valid (the command is
/// informational).
///
/// # Errors
///
/// Invalid flags (out-of-range values), or the plot file cannot be written.
pub async fn run(args: Args) -> Result<bool> {
    let clients = validate(&args)?;
    // Both simulations are CPU-bound loops: keep them off the async runtime's workers.
    let sim_args = args.clone();
    let (blocks, rows) = tokio::task::spawn_blocking(move || simulate(&sim_args, &clients)).await?;

    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&args, &blocks, &rows))?
        );
    } else {
        print!("{}", render_text(&args, &blocks, &rows));
    }
    if let Some(path) = &args.plot {
        let svg = plot::render(&blocks, &rows, args.instances);
        std::fs::write(path, svg).with_context(|| format!("write {}", path.display()))?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(true)
}

fn simulate(args: &Args, clients: &[usize]) -> (Vec<ContentionBlock>, Vec<OutageRow>) {
    let base = ContentionConfig::new()
        .with_base(Duration::from_millis(args.base_ms))
        .with_cap(Duration::from_millis(args.cap_ms))
        .with_runs(args.runs)
        .with_seed(args.seed);
    let blocks = clients
        .iter()
        .map(|&c| ContentionBlock {
            clients: c,
            reports: compare_contention(&base.with_clients(c)),
        })
        .collect();
    let outage = OutageConfig::new()
        .with_instances(args.instances)
        .with_calls_per_instance(args.calls_per_instance)
        .with_seed(args.seed);
    let rows = args
        .failure_rates
        .iter()
        .map(|&f| {
            let [without, with] = compare_budget(&outage.with_failure_rate(f));
            OutageRow {
                failure_rate: f,
                without,
                with,
            }
        })
        .collect();
    (blocks, rows)
}

fn render_text(args: &Args, blocks: &[ContentionBlock], rows: &[OutageRow]) -> String {
    let mut out = format!(
        "(a) contention: clients updating one row under optimistic concurrency\n    \
         backoff base {} ms, cap {} ms; network 10 ms mean, 2 ms sd; mean of {} run(s), seed {}\n",
        args.base_ms, args.cap_ms, args.runs, args.seed
    );
    for b in blocks {
        out.push_str(&format!(
            "\n  {} clients\n  {:<24} {:>12} {:>18}\n",
            b.clients, "strategy", "mean calls", "mean completion"
        ));
        for r in &b.reports {
            out.push_str(&format!(
                "  {:<24} {:>12.1} {:>15.1} ms\n",
                label(r.strategy),
                r.mean_calls,
                ms(r.mean_completion)
            ));
        }
        let k = b.ranking();
        out.push_str(&format!(
            "  full jitter did the least work: {}; decorrelated faster with more calls: {}; \
             exponential (no jitter) slowest: {}; no backoff the most calls: {}\n",
            yes(k.full_least_work),
            yes(k.decorrelated_faster_more_work),
            yes(k.exponential_slowest),
            yes(k.no_backoff_most_work)
        ));
    }
    out.push_str(&format!(
        "\n(b) fleet outage: {} instances x {} calls (one every 100 ms), 3 attempts, full jitter \
         500 ms..8 s\n    amplification = requests sent / logical calls; the budget is per \
         instance (500 tokens, 14 per transient retry)\n\n",
        args.instances, args.calls_per_instance
    ));
    out.push_str(&format!(
        "  {:>12} {:>16} {:>13} {:>15} {:>14} {:>14}\n",
        "failure rate",
        "no budget: ampl",
        "budget: ampl",
        "retries denied",
        "peak rps (no)",
        "peak rps (yes)"
    ));
    for r in rows {
        out.push_str(&format!(
            "  {:>11.0}% {:>15.3}x {:>12.3}x {:>15} {:>14} {:>14}\n",
            r.failure_rate * 100.0,
            r.without.amplification,
            r.with.amplification,
            r.with.retries_denied,
            r.without.peak_requests_per_second,
            r.with.peak_requests_per_second
        ));
    }
    out
}

fn report_json(r: &ContentionReport) -> Value {
    json!({
        "strategy": r.strategy.name(),
        "label": label(r.strategy),
        "mean_calls": r.mean_calls,
        "mean_completion_ms": ms(r.mean_completion),
        "completed": r.completed,
        "runs": r.runs,
    })
}

fn outage_json(r: &OutageReport) -> Value {
    json!({
        "budget": r.budget,
        "logical_calls": r.logical_calls,
        "requests": r.requests,
        "amplification": r.amplification,
        "retries": r.retries,
        "retries_denied": r.retries_denied,
        "succeeded": r.succeeded,
        "failed": r.failed,
        "peak_requests_per_second": r.peak_requests_per_second,
        "duration_ms": ms(r.duration),
    })
}

fn to_json(args: &Args, blocks: &[ContentionBlock], rows: &[OutageRow]) -> Value {
    json!({
        "contention": {
            "base_ms": args.base_ms,
            "cap_ms": args.cap_ms,
            "runs": args.runs,
            "seed": args.seed,
            "blocks": blocks.iter().map(|b| {
                let k = b.ranking();
                json!({
                    "clients": b.clients,
                    "strategies": b.reports.iter().map(report_json).collect::<Vec<_>>(),
                    "ranking": {
                        "full_jitter_least_work": k.full_least_work,
                        "decorrelated_faster_with_more_calls": k.decorrelated_faster_more_work,
                        "exponential_slowest": k.exponential_slowest,
                        "no_backoff_most_calls": k.no_backoff_most_work,
                    },
                })
            }).collect::<Vec<_>>(),
        },
        "outage": {
            "instances": args.instances,
            "calls_per_instance": args.calls_per_instance,
            "seed": args.seed,
            "rows": rows.iter().map(|r| json!({
                "failure_rate": r.failure_rate,
                "without_budget": outage_json(&r.without),
                "with_budget": outage_json(&r.with),
            })).collect::<Vec<_>>(),
        },
    })
}
