//! Prints the contention comparison and the outage amplification.
//!
//! `cargo run -p oncely-client --release --example simulate`

use oncely_client::simulate::{ContentionConfig, OutageConfig, compare_budget, compare_contention};

fn main() {
    let config = ContentionConfig::new();
    println!("strategy       mean calls   mean completion");
    for r in compare_contention(&config) {
        println!(
            "{:<14} {:>10.1}   {:>10.1} ms",
            r.strategy.name(),
            r.mean_calls,
            r.mean_completion.as_secs_f64() * 1000.0
        );
    }
    for report in compare_budget(&OutageConfig::new()) {
        println!(
            "budget {:<5} requests {:>7} / calls {:>7} = amplification {:.3}",
            report.budget, report.requests, report.logical_calls, report.amplification
        );
    }
}
