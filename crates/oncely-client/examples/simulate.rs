//! Prints the contention comparison and the outage amplification.
//!
//! `cargo run -p oncely-client --release --example simulate`

use oncely_client::simulate::{ContentionConfig, OutageConfig, compare_contention, run_outage};

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
    let outage = OutageConfig::new();
    for report in [run_outage(&outage.with_budget(None)), run_outage(&outage)] {
        println!("{report:?}");
    }
}
