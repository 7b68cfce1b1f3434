//! `oncely-latency-proxy`: the bench crate's latency proxy ([`oncely_bench::proxy`]) on its own,
//! for benches that run servers as processes (`crates/oncely-bench/scripts/http.sh`).
//!
//! `oncely-latency-proxy --upstream 127.0.0.1:5432 --rtt-ms 1 --stats 127.0.0.1:0` forwards
//! every connection to PostgreSQL with 0.5 milliseconds added in each direction, and prints
//! `oncely-latency-proxy: listening on ADDR` and `oncely-latency-proxy: stats on
//! http://ADDR/stats`, where `GET /stats` answers
//! `{"round_trips": N, "connections": M, "per_connection": [...]}` (counts since the start; see
//! the module for what a round trip is). Runs until killed.

use axum::Json;
use axum::routing::get;
use clap::Parser;
use oncely_bench::proxy::LatencyProxy;
use std::net::SocketAddr;
use std::time::Duration;

/// Adds a fixed delay to every byte in each direction between clients and one upstream server,
/// and counts round trips.
#[derive(Parser)]
#[command(name = "oncely-latency-proxy")]
struct Args {
    /// The server to forward to, `host:port`.
    #[arg(long)]
    upstream: String,
    /// Where to accept clients (port 0: one the system picks).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The round trip to add, in milliseconds (half of it in each direction); 0 forwards
    /// without delay, still counting.
    #[arg(long, default_value_t = 1.0)]
    rtt_ms: f64,
    /// Where to serve `GET /stats` (JSON round-trip counts); none when not given.
    #[arg(long)]
    stats: Option<SocketAddr>,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    if !(args.rtt_ms.is_finite() && args.rtt_ms >= 0.0) {
        eprintln!("oncely-latency-proxy: --rtt-ms must be a number of milliseconds >= 0");
        std::process::exit(2);
    }
    let one_way = Duration::from_secs_f64(args.rtt_ms / 2_000.0);
    let proxy = LatencyProxy::bind(args.listen, &args.upstream, one_way).await?;
    println!("oncely-latency-proxy: listening on {}", proxy.local_addr());
    if let Some(addr) = args.stats {
        let rt = proxy.round_trips();
        let app = axum::Router::new().route(
            "/stats",
            get(move || {
                let rt = rt.clone();
                async move {
                    Json(serde_json::json!({
                        "round_trips": rt.total(),
                        "connections": rt.connections(),
                        "per_connection": rt.per_connection(),
                    }))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!(
            "oncely-latency-proxy: stats on http://{}/stats",
            listener.local_addr()?
        );
        axum::serve(listener, app).await?;
    } else {
        std::future::pending::<()>().await;
    }
    drop(proxy);
    Ok(())
}
