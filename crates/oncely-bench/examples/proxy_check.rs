//! The latency proxy's own check (`src/proxy.rs`; docs/PERFORMANCE.md, "Over a network: the
//! latency proxy"): a bare `SELECT 1` on PostgreSQL over one
//! connection, direct and through [`oncely_bench::proxy::LatencyProxy`] at a 1 millisecond round
//! trip (0.5 milliseconds each way), alternated in rounds; prints the median and p99 of each, the
//! added latency (which on a quiet machine is the round trip within 10%: the proxy's own two
//! loopback hops add tens of microseconds), and the round trips the proxy counted per `SELECT 1`
//! (1: sqlx prepares the statement once, then sends bind, execute and sync in one flight). A
//! timing, printed, never asserted.
//!
//! Run: `ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncely_bench \
//! cargo run --release -p oncely-bench --example proxy_check [RTT_MS] [QUERIES]` (defaults 1
//! and 2000).

#![allow(missing_docs)]

use oncely_bench::proxy::{LatencyProxy, upstream_of};
use sqlx::Connection;
use std::time::{Duration, Instant};

async fn select_ones(conn: &mut sqlx::PgConnection, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (one,): (i32,) = sqlx::query_as("SELECT 1")
            .fetch_one(&mut *conn)
            .await
            .expect("SELECT 1");
        assert_eq!(one, 1);
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rtt_ms: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let url = std::env::var("ONCELY_BENCH_POSTGRES_URL")
        .or_else(|_| std::env::var("ONCELY_TEST_POSTGRES_URL"))
        .expect("ONCELY_BENCH_POSTGRES_URL is not set");
    let proxy = LatencyProxy::start(
        &upstream_of(&url).expect("a PostgreSQL URL"),
        Duration::from_secs_f64(rtt_ms / 2_000.0),
    )
    .await
    .expect("the proxy starts");
    let mut direct = sqlx::PgConnection::connect(&url).await.expect("connects");
    let mut proxied = sqlx::PgConnection::connect(&proxy.url(&url).expect("a URL"))
        .await
        .expect("connects through the proxy");
    // Warm-up: the statement prepared on both connections.
    select_ones(&mut direct, 50).await;
    select_ones(&mut proxied, 50).await;
    let rounds = 5;
    let (mut d, mut p) = (Vec::new(), Vec::new());
    let before = proxy.round_trips().total();
    for _ in 0..rounds {
        d.extend(select_ones(&mut direct, n / rounds).await);
        p.extend(select_ones(&mut proxied, n / rounds).await);
    }
    let trips = proxy.round_trips().total() - before;
    let (d50, d99) = (pct(&mut d, 0.5), pct(&mut d, 0.99));
    let (p50, p99) = (pct(&mut p, 0.5), pct(&mut p, 0.99));
    println!("| SELECT 1, {} queries each | p50 ms | p99 ms |", p.len());
    println!("|---|---|---|");
    println!("| direct | {d50:.3} | {d99:.3} |");
    println!("| through the proxy ({rtt_ms} ms round trip) | {p50:.3} | {p99:.3} |");
    println!(
        "| **added** (target {rtt_ms} ms, within 10%) | **{:.3}** ({:.0}% of the round trip) | {:.3} |",
        p50 - d50,
        (p50 - d50) / rtt_ms * 100.0,
        p99 - d99
    );
    println!(
        "\nround trips counted by the proxy per SELECT 1: {:.2}; its calibration took {:.3} ms off each one-way delay",
        trips as f64 / p.len() as f64,
        proxy.compensation().as_secs_f64() * 1e3
    );
}
