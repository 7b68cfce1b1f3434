//! One completer pass and one reaper pass, with many completed records held and 100 abandoned
//! ones, on Redis, SQLite, PostgreSQL and MySQL/MariaDB: what a pass costs as the records kept
//! grow (`docs/DESIGN.md`, "The maintenance index"). The target: a pass at 1,000,000 records
//! held costs at most twice what it costs at 10,000, on every store.
//!
//! The stores, and how each is filled:
//!
//! - **Redis**: a `redis-server` of the bench's own on a free port (nothing persisted, so it
//!   loads fast; killed at the end), loaded through the store (claim + complete, 256 at a
//!   time, the server's default policy). Besides the pass times it reports the Redis commands
//!   a pass ran (`INFO commandstats`), which do not depend on the machine's load, and the time
//!   of the namespace walk (the index's backstop, at most once an hour), the only maintenance
//!   that reads every record.
//! - **SQLite**: a file in a temporary directory, opened as a server opens it.
//! - **PostgreSQL** (when `ONCELY_BENCH_POSTGRES_URL` or `ONCELY_TEST_POSTGRES_URL` is set) and
//!   **MySQL/MariaDB** (`ONCELY_BENCH_MYSQL_URL` or `ONCELY_TEST_MYSQL_URL`): a database of the
//!   bench's own on that server (`oncely_bench_maint_<uuid>`, dropped at the end), so the
//!   completer never re-drives anybody else's records.
//!
//!   A SQL store gets one completed record through the store's own write path (claim +
//!   complete: the template, exactly the row a server writes), then copies of it under new
//!   keys, 100,000 rows per `INSERT ... SELECT` (the series from `generate_series` on
//!   PostgreSQL, a recursive CTE on SQLite, a cross join of digits on MySQL), every column
//!   copied as the table has it (the column list is read from the catalog, so a later
//!   migration's columns are copied too). PostgreSQL's statistics are then refreshed
//!   (`ANALYZE`, as autovacuum would).
//!
//! Each pass time is the median of 5 passes, each on 100 fresh abandoned records. The plans of
//! the SQL stores' maintenance queries are checked by the stores' own tests (`plans` in
//! `oncely-postgres`, `oncely-sqlite` and `oncely-mysql`; `ONCELY_TEST_PLAN_ROWS` sets their
//! table size).
//!
//! Run (the sizes are the records held, 10,000 when none is given; `ONCELY_BENCH_STORES`
//! picks stores, default `redis,sqlite,postgres,mysql`, those without a URL skipped):
//!
//! ```text
//! ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! ONCELY_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/mysql \
//!   cargo bench -p oncely-bench --bench maintenance -- 10000 100000 1000000
//! ```
//!
//! (1,000,000 records take about 1 GB of Redis memory and a few minutes to load; on PostgreSQL
//! and SQLite about 0.5 GB of disk and under a minute to copy.)
//!
//! A smoke run (a debug build, every store, small sizes; its times mean nothing):
//!
//! ```text
//! ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! ONCELY_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/mysql \
//!   cargo test -p oncely-bench --bench maintenance -- 1000 10000
//! ```
//!
//! PostgreSQL and SQLite at 1,000,000 only:
//!
//! ```text
//! ONCELY_BENCH_STORES=postgres,sqlite \
//! ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo bench -p oncely-bench --bench maintenance -- 10000 1000000
//! ```
//!
//! In this folder: the passes and the report here; [`Bench`] (`bench.rs`: each store opened,
//! filled, reset, closed); the SQL stores' bulk copy (`copy.rs`); the completed and abandoned
//! records and the re-drive (`records.rs`); the bench's own Redis server (`redis_server.rs`).

#![allow(missing_docs)]

mod bench;
mod copy;
mod records;
mod redis_server;

use bench::Bench;
use oncely_bench::run_prefix;
use oncely_jobs::{DEFAULT_REAP_PAUSE, RedrivePolicy, complete_abandoned, reap_all};
use records::{ABANDONED, CompleteThroughStore, abandon};
use std::time::{Duration, Instant};

/// Passes per size (the median is reported).
const PASSES: usize = 5;
/// The stores measured when `ONCELY_BENCH_STORES` is unset.
const DEFAULT_STORES: &str = "redis,sqlite,postgres,mysql";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One line of the report.
struct Row {
    store: &'static str,
    size: usize,
    completer: Duration,
    completer_cmds: Option<u64>,
    reaper: Duration,
    reaper_cmds: Option<u64>,
    walk: Option<Duration>,
}

/// Every size on one store, smallest first (each size adds records to the last).
async fn measure(bench: &mut Bench, sizes: &[usize], rows: &mut Vec<Row>) {
    let redrive = CompleteThroughStore(bench.store.clone());
    let policy = RedrivePolicy::default();
    let prefix = run_prefix();
    let (mut held, mut round) = (0, 0);
    for &size in sizes {
        let started = Instant::now();
        bench.load(&prefix, held, size - held.min(size)).await;
        held = held.max(size);
        eprintln!(
            "{}: {size} completed records held (loaded in {:.1} s)",
            bench.name,
            started.elapsed().as_secs_f64()
        );
        let walk = bench.walk().await;
        if let Some((records, _)) = walk {
            assert!(records >= size as u64, "the walk found {records}");
        }
        // The first pass ever on a Redis namespace walks it too; this one is not measured.
        abandon(&*bench.store, &prefix, round).await;
        round += 1;
        complete_abandoned(&*bench.store, &redrive, Duration::ZERO, ABANDONED, &policy).await;
        let (mut completer, mut reaper) = (Vec::new(), Vec::new());
        let (mut completer_cmds, mut reaper_cmds) = (None, None);
        for _ in 0..PASSES {
            abandon(&*bench.store, &prefix, round).await;
            round += 1;
            bench.reset().await;
            let started = Instant::now();
            let report =
                complete_abandoned(&*bench.store, &redrive, Duration::ZERO, ABANDONED, &policy)
                    .await;
            completer.push(started.elapsed());
            completer_cmds = bench.commands().await;
            assert_eq!(report.completed, ABANDONED as u64, "{report:?}");
            bench.reset().await;
            let started = Instant::now();
            let report = reap_all(&*bench.store, 1000, DEFAULT_REAP_PAUSE)
                .await
                .expect("reap");
            reaper.push(started.elapsed());
            reaper_cmds = bench.commands().await;
            assert_eq!(report.deleted, 0, "{report:?}");
        }
        rows.push(Row {
            store: bench.name,
            size,
            completer: median(completer),
            completer_cmds,
            reaper: median(reaper),
            reaper_cmds,
            walk: walk.map(|(_, d)| d),
        });
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| {
            a.replace(['_', ','], "")
                .parse()
                .expect("a number of records")
        })
        .collect();
    if sizes.is_empty() {
        sizes.push(10_000);
    }
    sizes.sort_unstable();
    let stores = std::env::var("ONCELY_BENCH_STORES").unwrap_or_else(|_| DEFAULT_STORES.into());
    let mut rows = Vec::new();
    for name in stores.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut bench = match Bench::open(name).await {
            Ok(b) => b,
            Err(why) => {
                eprintln!("{name}: skipped ({why})");
                continue;
            }
        };
        measure(&mut bench, &sizes, &mut rows).await;
        bench.finish().await;
    }
    let count = |c: Option<u64>| c.map_or_else(|| "-".to_owned(), |c| c.to_string());
    println!(
        "| store | records held | completer pass (100 abandoned) | commands | reaper pass | commands | walk of the namespace |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        let base = rows
            .iter()
            .find(|r| r.store == row.store)
            .expect("the store's first row");
        println!(
            "| {} | {} | {:.2} ms ({:.2}x) | {} | {:.2} ms ({:.2}x) | {} | {} |",
            row.store,
            row.size,
            ms(row.completer),
            row.completer.as_secs_f64() / base.completer.as_secs_f64(),
            count(row.completer_cmds),
            ms(row.reaper),
            row.reaper.as_secs_f64() / base.reaper.as_secs_f64(),
            count(row.reaper_cmds),
            row.walk
                .map_or_else(|| "-".to_owned(), |w| format!("{:.2} s", w.as_secs_f64())),
        );
    }
}
