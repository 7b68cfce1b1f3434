//! Drives one variant of the transactional bench's endpoint (`src/transactional/`;
//! docs/PERFORMANCE.md, "The transactional layer against its floor") a given number of times,
//! for instruction counts under `valgrind --tool=callgrind`: the per-request cost is the
//! difference between two runs with different counts, divided by the difference of the counts
//! (so that start-up, connecting and migrating cancel out).
//!
//! Usage: `ONCELY_BENCH_POSTGRES_URL=... tx_profile <db> <variant> <n> [concurrency]`, with
//! `<db>` `postgres` or `sqlite` and `<variant>` `baseline`, `floor`, `layer` or `replay` (the
//! layer's replays: 300 first executions, then the first `n` of those keys again, so `n` must not
//! exceed 300 and the difference of two runs isolates the replays). Warm-up
//! requests of the same variant run first (100, at concurrency 16). Prints the context switches per measured request.

#![allow(missing_docs)]

use oncely_bench::run_prefix;
use oncely_bench::transactional::{Bench, Variant};

fn switches() -> u64 {
    let mut n = 0;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let db = args.get(1).map_or("postgres", String::as_str).to_owned();
    let variant = args.get(2).map_or("layer", String::as_str).to_owned();
    let n: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(100);
    let concurrency: usize = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let bench = match db.as_str() {
            "sqlite" => Bench::sqlite().await,
            _ => Bench::postgres().await,
        }
        .expect("the database");
        let (v, replay) = match variant.as_str() {
            "baseline" => (Variant::Baseline, false),
            "floor" => (Variant::Floor, false),
            "replay" => (Variant::Layer, true),
            _ => (Variant::Layer, false),
        };
        // Warm-up at concurrency 16, so that the pool has opened all its connections (it opens
        // them lazily, which would otherwise land at random inside the measured requests).
        let warm = run_prefix();
        bench.drive(v, &warm, 100, 16).await.expect("warm-up");
        if replay {
            bench
                .drive(v, &warm, 100, 16)
                .await
                .expect("warm-up replays");
        }
        let prefix = run_prefix();
        if replay {
            bench
                .drive(v, &prefix, 300, concurrency)
                .await
                .expect("first executions");
        }
        let before = switches();
        bench
            .drive(v, &prefix, n, concurrency)
            .await
            .expect("measured requests");
        let after = switches();
        println!(
            "{db} {variant} n={n} c={concurrency}: {:.2} context switches/request",
            (after - before) as f64 / n as f64
        );
        bench.cleanup().await.expect("cleanup");
    });
}
