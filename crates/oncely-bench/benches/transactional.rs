//! The transactional bench (docs/PERFORMANCE.md, "The transactional layer against its floor"):
//! `POST /v1/orders` as baseline (no idempotency), floor (the minimum claim and completion
//! statements hand-written in the business transaction) and layer (`oncely_sqlx::layer` + `Tx`),
//! in-process, on PostgreSQL, MySQL / MariaDB and SQLite, at concurrency 16 and 1; the three
//! alternated round by round in one run, then the layer's replays (the same keys sent again). Then,
//! at concurrency 1 with the statement counter on, the statements each variant sends per request.
//!
//! Run: `ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncely_bench \
//! cargo bench -p oncely-bench --bench transactional`. Knobs (environment): `ONCELY_BENCH_ROUNDS`
//! (default 5), `ONCELY_BENCH_REQUESTS` (requests per variant per round at concurrency 16,
//! default 1500; a quarter of it at concurrency 1), `ONCELY_BENCH_DBS` (`postgres,sqlite` by
//! default; `mysql` adds MySQL / MariaDB from `ONCELY_BENCH_MYSQL_URL`, else
//! `ONCELY_TEST_MYSQL_URL`).
//! Prints a Markdown table per database and concurrency. Run without `--bench` (as
//! `cargo test --benches` does), it makes one round of 40 requests.
//!
//! `crates/oncely-bench/split-cores.sh` runs it with the database server (PostgreSQL, or MySQL /
//! MariaDB) on core 0 and the bench on core 1 (the split of a database on a host of its own;
//! docs/PERFORMANCE.md, "The transactional layer against its floor").

#![allow(missing_docs)]

use oncely_bench::run_prefix;
use oncely_bench::transactional::{Bench, Db, Variant, count};
use std::collections::BTreeMap;
use std::time::Duration;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Process CPU time (user + system, all threads) in seconds, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name: state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(14) + ticks(15)) / 100.0
}

/// Context switches (voluntary + involuntary) summed over the process's live threads, from
/// `/proc/self/task/*/status`.
fn context_switches() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut n = 0.0;
    for t in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    n
}

/// The `p` quantile of sorted latencies, in milliseconds.
fn pct_ms(sorted: &[std::time::Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (s[0], s[s.len() / 2], s[s.len() - 1])
}

fn fmt_row(name: &str, v: &[f64], digits: usize) -> String {
    let (min, med, max) = stats(v);
    let rounds: Vec<String> = v.iter().map(|x| format!("{x:.digits$}")).collect();
    format!(
        "| {name} | {} | {min:.digits$} | **{med:.digits$}** | {max:.digits$} |",
        rounds.join(" / ")
    )
}

struct Round {
    rps: BTreeMap<&'static str, f64>,
    /// p50 and p99 latency per request, milliseconds.
    p50: BTreeMap<&'static str, f64>,
    p99: BTreeMap<&'static str, f64>,
    cpu_us: BTreeMap<&'static str, f64>,
    switches: BTreeMap<&'static str, f64>,
}

/// `settle`: whether each timed variant starts from settled tables ([`Bench::settle`]; the
/// timed bench only, not `cargo test --benches`).
async fn measure(
    bench: &Bench,
    concurrency: usize,
    n: usize,
    rounds: usize,
    settle: bool,
) -> Vec<Round> {
    let db = bench.db.name();
    // Warm-up: every variant's statements prepared, the pool full, the caches warm.
    for v in Variant::ALL {
        bench
            .drive(v, &run_prefix(), n / 5 + 20, concurrency)
            .await
            .unwrap_or_else(|e| panic!("{db} {} warm-up: {e}", v.name()));
    }
    let mut out = Vec::new();
    for r in 0..rounds {
        let mut round = Round {
            rps: BTreeMap::new(),
            p50: BTreeMap::new(),
            p99: BTreeMap::new(),
            cpu_us: BTreeMap::new(),
            switches: BTreeMap::new(),
        };
        // Alternated, and the starting variant rotates, so no variant always runs first.
        for k in 0..3 {
            let v = Variant::ALL[(r + k) % 3];
            // Every variant starts from the same tables (see `Bench::settle`).
            if settle {
                bench
                    .settle()
                    .await
                    .unwrap_or_else(|e| panic!("{db} settle: {e}"));
            }
            let prefix = run_prefix();
            let cpu = cpu_seconds();
            let cs = context_switches();
            let (t, lat) = bench
                .drive_timed(v, &prefix, n, concurrency)
                .await
                .unwrap_or_else(|e| panic!("{db} {}: {e}", v.name()));
            round.p50.insert(v.name(), pct_ms(&lat, 0.50));
            round.p99.insert(v.name(), pct_ms(&lat, 0.99));
            round
                .switches
                .insert(v.name(), (context_switches() - cs) / n as f64);
            round
                .cpu_us
                .insert(v.name(), (cpu_seconds() - cpu) * 1e6 / n as f64);
            round.rps.insert(v.name(), n as f64 / t.as_secs_f64());
            if v == Variant::Layer {
                // The replays of the same keys, at once, before the next variant's
                // `settle` deletes them.
                let cpu = cpu_seconds();
                let cs = context_switches();
                let (t, lat) = bench
                    .drive_timed(Variant::Layer, &prefix, n, concurrency)
                    .await
                    .unwrap_or_else(|e| panic!("{db} replay: {e}"));
                round.p50.insert("replay", pct_ms(&lat, 0.50));
                round.p99.insert("replay", pct_ms(&lat, 0.99));
                round
                    .switches
                    .insert("replay", (context_switches() - cs) / n as f64);
                round
                    .cpu_us
                    .insert("replay", (cpu_seconds() - cpu) * 1e6 / n as f64);
                round.rps.insert("replay", n as f64 / t.as_secs_f64());
            }
        }
        eprintln!(
            "{db} c={concurrency} round {}: baseline {:.0}/s floor {:.0}/s layer {:.0}/s replay {:.0}/s",
            r + 1,
            round.rps["baseline"],
            round.rps["floor"],
            round.rps["layer"],
            round.rps["replay"]
        );
        out.push(round);
    }
    out
}

fn report(db: Db, rtt: &str, concurrency: usize, n: usize, rounds: &[Round]) {
    let col = |k: &str| -> Vec<f64> { rounds.iter().map(|r| r.rps[k]).collect() };
    let ratio =
        |a: &str, b: &str| -> Vec<f64> { rounds.iter().map(|r| r.rps[a] / r.rps[b]).collect() };
    let cpu = |k: &str| -> Vec<f64> { rounds.iter().map(|r| r.cpu_us[k]).collect() };
    let switches = |k: &str| -> Vec<f64> { rounds.iter().map(|r| r.switches[k]).collect() };
    println!(
        "\n### {}{rtt} at concurrency {concurrency} ({n} requests per variant per round, {} rounds)\n",
        db.name(),
        rounds.len()
    );
    println!("| figure | rounds | min | median | max |\n|---|---|---|---|---|");
    for k in ["baseline", "floor", "layer", "replay"] {
        println!("{}", fmt_row(&format!("{k}, requests/s"), &col(k), 0));
    }
    println!(
        "{}",
        fmt_row(
            "**layer / floor** (target >= 0.95)",
            &ratio("layer", "floor"),
            2
        )
    );
    println!(
        "{}",
        fmt_row(
            "**layer / baseline** (stretch >= 0.85)",
            &ratio("layer", "baseline"),
            2
        )
    );
    println!(
        "{}",
        fmt_row("floor / baseline", &ratio("floor", "baseline"), 2)
    );
    println!(
        "{}",
        fmt_row(
            "**replay / layer** (target >= 2)",
            &ratio("replay", "layer"),
            2
        )
    );
    let p50 = |k: &str| -> Vec<f64> { rounds.iter().map(|r| r.p50[k]).collect() };
    let p99 = |k: &str| -> Vec<f64> { rounds.iter().map(|r| r.p99[k]).collect() };
    for k in ["baseline", "floor", "layer", "replay"] {
        println!("{}", fmt_row(&format!("{k}, p50 ms"), &p50(k), 3));
        println!("{}", fmt_row(&format!("{k}, p99 ms"), &p99(k), 3));
    }
    for k in ["floor", "layer", "replay"] {
        let d50: Vec<f64> = rounds
            .iter()
            .map(|r| r.p50[k] - r.p50["baseline"])
            .collect();
        let d99: Vec<f64> = rounds
            .iter()
            .map(|r| r.p99[k] - r.p99["baseline"])
            .collect();
        println!(
            "{}",
            fmt_row(&format!("{k} - baseline, p50 ms added"), &d50, 3)
        );
        println!(
            "{}",
            fmt_row(&format!("{k} - baseline, p99 ms added"), &d99, 3)
        );
    }
    for k in ["baseline", "floor", "layer", "replay"] {
        println!(
            "{}",
            fmt_row(&format!("{k}, process CPU µs/request"), &cpu(k), 0)
        );
    }
    for k in ["baseline", "floor", "layer", "replay"] {
        println!(
            "{}",
            fmt_row(&format!("{k}, context switches/request"), &switches(k), 1)
        );
    }
}

/// The transaction control sqlx sends without logging it, by construction: `BEGIN`
/// (PostgreSQL and SQLite), SQLite's `COMMIT`, and the `ROLLBACK` sqlx queues when a PostgreSQL
/// or MySQL transaction is dropped (the layer's replay), which goes out with the connection's
/// next statement. MySQL's `BEGIN` and `COMMIT` go through sqlx's executor and are logged (the
/// layer's `BEGIN` is one message of three statements, `SET SESSION
/// innodb_lock_wait_timeout = 4; BEGIN; SAVEPOINT oncely_tx`, logged as one). The
/// SQLite layer's `BEGIN IMMEDIATE` rides in its first logged statement (the lock-free read,
/// then the write lock and the claim, in one hop); what sqlx sends unlogged instead is the
/// `SAVEPOINT` that hands that transaction to sqlx's bookkeeping.
fn unlogged(db: Db, variant: &str) -> (&'static str, usize, usize) {
    match (db, variant) {
        (Db::Postgres, "layer replay") => ("BEGIN; ROLLBACK (queued on drop)", 2, 0),
        (Db::Postgres, _) => ("BEGIN", 1, 0),
        (Db::Mysql, "layer replay") => ("ROLLBACK (queued on drop)", 1, 0),
        (Db::Mysql, _) => ("", 0, 0),
        (Db::Sqlite, "layer replay") => ("", 0, 0),
        (Db::Sqlite, "layer") => ("SAVEPOINT oncely_tx; COMMIT", 2, 1),
        (Db::Sqlite, _) => ("BEGIN IMMEDIATE; COMMIT", 2, 1),
    }
}

async fn count_statements(bench: &Bench) {
    const N: usize = 50;
    println!(
        "\n### {}: statements per request ({N} requests at concurrency 1)\n",
        bench.db.name()
    );
    println!(
        "| variant | logged by sqlx / request | + not logged | statements / request | commits / request | one request's logged statements |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, v, replay) in [
        ("baseline", Variant::Baseline, false),
        ("floor", Variant::Floor, false),
        ("layer", Variant::Layer, false),
        ("layer replay", Variant::Layer, true),
    ] {
        let prefix = run_prefix();
        if replay {
            bench
                .drive(v, &prefix, N, 1)
                .await
                .expect("first executions");
        }
        count::start();
        bench
            .drive(v, &prefix, N, 1)
            .await
            .expect("counted requests");
        let seen = count::stop();
        bench
            .verify(v, &prefix, N)
            .await
            .expect("one order row and a complete record per key");
        let (extra, extra_n, extra_commits) = unlogged(bench.db, name);
        let per = seen.len() as f64 / N as f64;
        let commits = (count::commits(&seen) + extra_commits * N) as f64 / N as f64;
        let one = seen.len() / N;
        println!(
            "| {name} | {per:.2} | {extra_n} (`{extra}`) | {:.2} | {commits:.2} | `{}` |",
            per + extra_n as f64,
            seen[..one.min(seen.len())].join("`; `")
        );
    }
}

/// Round trips per request, counted by the latency proxy (PostgreSQL through it only), at
/// concurrency 1: they do not depend on the load, unlike the timings.
async fn count_round_trips(bench: &Bench, label: &str) {
    const N: usize = 50;
    let Some(trips) = bench.round_trips() else {
        return;
    };
    println!(
        "\n### {}{label}: round trips per request ({N} requests at concurrency 1, counted by the proxy)\n",
        bench.db.name()
    );
    println!("| variant | round trips / request |\n|---|---|");
    for (name, v, replay) in [
        ("baseline", Variant::Baseline, false),
        ("floor", Variant::Floor, false),
        ("layer first execution", Variant::Layer, false),
        ("layer replay", Variant::Layer, true),
    ] {
        let prefix = run_prefix();
        if replay {
            bench
                .drive(v, &prefix, N, 1)
                .await
                .expect("first executions");
        }
        let before = trips.total();
        bench
            .drive(v, &prefix, N, 1)
            .await
            .expect("counted requests");
        let per = (trips.total() - before) as f64 / N as f64;
        println!("| {name} | {per:.2} |");
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then one tiny round, so
    // that the target is exercised without spending minutes.
    let timed = std::env::args().any(|a| a == "--bench");
    let (rounds, requests) = if timed {
        (
            env_usize("ONCELY_BENCH_ROUNDS", 5).max(1),
            env_usize("ONCELY_BENCH_REQUESTS", 1500).max(20),
        )
    } else {
        (1, 40)
    };
    let dbs = std::env::var("ONCELY_BENCH_DBS").unwrap_or_else(|_| "postgres,sqlite".into());
    let rtts: Vec<f64> = std::env::var("ONCELY_BENCH_RTT_MS")
        .unwrap_or_else(|_| "0".into())
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .unwrap_or_else(|| panic!("ONCELY_BENCH_RTT_MS: {v:?} is not milliseconds >= 0"))
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        // (bench, its label: the round trip the proxy adds, or none).
        let mut benches: Vec<(Bench, String)> = Vec::new();
        for db in Db::ALL {
            if !dbs.split(',').any(|d| d.trim() == db.name()) {
                continue;
            }
            // SQLite runs in process: there is no network to add a round trip to. MySQL is
            // measured direct only (the proxy is not wired for it yet).
            let rtts = if db == Db::Postgres { rtts.clone() } else { vec![0.0] };
            for rtt in rtts {
                let opened = match db {
                    Db::Postgres if rtt > 0.0 => {
                        Bench::postgres_with_rtt(Some(Duration::from_secs_f64(rtt / 1e3))).await
                    }
                    Db::Postgres => Bench::postgres().await,
                    Db::Mysql => Bench::mysql().await,
                    Db::Sqlite => Bench::sqlite().await,
                };
                let label = match db {
                    Db::Postgres if rtt > 0.0 => format!(", {rtt} ms round trip (proxy)"),
                    Db::Postgres | Db::Mysql => ", direct".to_owned(),
                    Db::Sqlite => ", in process (no proxy)".to_owned(),
                };
                match opened {
                    Ok(b) => benches.push((b, label)),
                    Err(why) => eprintln!("transactional/{}: skipped: {why}", db.name()),
                }
            }
        }
        // The tables' autovacuum setting and resident rows are changed on a database of the
        // bench's own only, never on the test database the URL falls back to.
        let own_db =
            |db: Db| db.own_url_var().is_none_or(|var| std::env::var_os(var).is_some());
        for (bench, _) in &benches {
            if timed && !own_db(bench.db) {
                eprintln!(
                    "transactional/{}: {} is unset: on the test database, no resident rows are added and the tables' settings stay (the figures are less comparable)",
                    bench.db.name(),
                    bench.db.own_url_var().unwrap_or_default()
                );
            }
        }
        for (bench, label) in &benches {
            if timed && own_db(bench.db) {
                bench
                    .autovacuum(false)
                    .await
                    .unwrap_or_else(|e| panic!("{}: autovacuum off: {e}", bench.db.name()));
                bench
                    .populate()
                    .await
                    .unwrap_or_else(|e| panic!("{}: resident rows: {e}", bench.db.name()));
            }
            for (concurrency, n) in [(16, requests), (1, requests / 4)] {
                let r = measure(bench, concurrency, n, rounds, timed).await;
                report(bench.db, label, concurrency, n, &r);
            }
        }
        // Last, so that the timed runs went without a subscriber.
        if count::install() {
            for (bench, _) in &benches {
                count_statements(bench).await;
            }
        }
        for (bench, label) in &benches {
            count_round_trips(bench, label).await;
        }
        for (bench, _) in &benches {
            if let Err(e) = bench.cleanup().await {
                eprintln!("transactional/{}: cleanup failed: {e}", bench.db.name());
            }
            if timed
                && own_db(bench.db)
                && let Err(e) = bench.autovacuum(true).await
            {
                eprintln!(
                    "transactional/{}: autovacuum back on failed: {e}",
                    bench.db.name()
                );
            }
        }
    });
}
