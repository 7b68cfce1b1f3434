//! One completer pass and one reaper pass on Redis, with many completed records held and 100
//! abandoned ones: what a pass costs as the records kept grow (`docs/DESIGN.md`, "The
//! maintenance index"). The target: a pass at 1,000,000 records held costs at most twice what
//! it costs at 10,000.
//!
//! The bench starts its own `redis-server` on a free port (nothing persisted, so it loads fast;
//! killed at the end) and loads completed records through the store (claim + complete, 256 at a
//! time, the server's default policy). For each size it reports, besides the pass times (the
//! median of 5 passes, each on 100 fresh abandoned records), the Redis commands a pass ran
//! (`INFO commandstats`), which do not depend on the machine's load, and the time of the
//! namespace walk (the index's backstop, at most once an hour), the only maintenance that
//! reads every record.
//!
//! Run (the sizes are the records held; 10,000 when none is given):
//! `cargo bench -p oncely-bench --bench maintenance -- 10000 100000 1000000`
//! (1,000,000 records take about 1 GB of Redis memory and a few minutes to load).

#![allow(missing_docs)]

use async_trait::async_trait;
use futures::StreamExt;
use oncely_bench::{claim_request, response, run_prefix};
use oncely_core::{ClaimOutcome, ClaimRequest, KeyStore, Record, RecordKey, StoredRequest};
use oncely_jobs::{
    DEFAULT_REAP_PAUSE, Redrive, RedriveError, RedrivePolicy, complete_abandoned, reap_all,
};
use oncely_redis::{RedisConfig, RedisStore};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The abandoned records of every pass.
const ABANDONED: usize = 100;
/// Passes per size (the median is reported).
const PASSES: usize = 5;

/// A `redis-server` of the bench's own, killed when dropped (its directory deleted after).
struct Server(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Server, u16) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Server(child, dir), port)
}

/// A re-drive as the server's would end: the key taken over (its lease lapsed) and completed.
struct CompleteThroughStore(RedisStore);

#[async_trait]
impl Redrive for CompleteThroughStore {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        let id = RecordKey::new(record.scope.clone(), record.key.clone());
        let req = ClaimRequest::new(
            id.clone(),
            record.fingerprint,
            Duration::from_secs(30),
            Duration::from_secs(86_400),
            Duration::from_secs(259_200),
        );
        match self.0.claim(req).await {
            Ok(ClaimOutcome::Claimed(c)) => {
                self.0
                    .complete(&id, c.token, response(256), Duration::from_secs(259_200))
                    .await
                    .map_err(|e| RedriveError::Unreachable(e.into()))?;
                Ok(201)
            }
            Ok(other) => Err(RedriveError::Unreachable(
                format!("not claimed: {other:?}").into(),
            )),
            Err(e) => Err(RedriveError::Unreachable(e.into())),
        }
    }
}

/// Stores `n` more completed records, 256 at a time.
async fn load(store: &RedisStore, prefix: &str, from: usize, n: usize) {
    let body = response(256);
    futures::stream::iter(from..from + n)
        .for_each_concurrent(256, |i| {
            let body = body.clone();
            async move {
                let req = claim_request(&format!("{prefix}-{i}"));
                let ClaimOutcome::Claimed(c) = store.claim(req.clone()).await.expect("claim")
                else {
                    panic!("a fresh key is claimed");
                };
                store
                    .complete(&req.id, c.token, body, req.retention)
                    .await
                    .expect("complete");
            }
        })
        .await;
}

/// Claims 100 fresh keys with a 1-millisecond lease and a stored request, and waits until
/// their leases lapsed: the abandoned requests of the next pass.
async fn abandon(store: &RedisStore, prefix: &str, round: usize) {
    for i in 0..ABANDONED {
        let mut req = claim_request(&format!("{prefix}-abandoned-{round}-{i}")).with_request(Some(
            StoredRequest::new("POST", "/v1/orders", vec![], b"{}".to_vec()),
        ));
        req.lease = Duration::from_millis(1);
        assert!(matches!(
            store.claim(req).await.expect("claim"),
            ClaimOutcome::Claimed(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// The calls of every command since the last `CONFIG RESETSTAT`, summed (the statistics
/// commands left out).
async fn commands(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls: u64 = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("config") && name != "info").then_some(calls)
        })
        .sum()
}

async fn reset(raw: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(raw)
        .await
        .expect("CONFIG RESETSTAT");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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
    let (_server, port) = start_redis();
    let url = format!("redis://127.0.0.1:{port}?accept_volatile=true");
    let store = RedisStore::connect_with(&url, RedisConfig::new())
        .await
        .expect("connect to the bench's redis-server");
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a URL");
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let redrive = CompleteThroughStore(store.clone());
    let policy = RedrivePolicy::default();
    let prefix = run_prefix();
    let mut held = 0;
    let mut round = 0;
    let mut rows = Vec::new();
    for size in sizes {
        let started = Instant::now();
        load(&store, &prefix, held, size - held.min(size)).await;
        held = held.max(size);
        eprintln!(
            "{size} completed records held (loaded in {:.1} s)",
            started.elapsed().as_secs_f64()
        );
        let started = Instant::now();
        let walk = store.rebuild_index().await.expect("walk");
        let walk_time = started.elapsed();
        assert!(walk.records >= size as u64, "{walk:?}");
        // The first pass ever on the namespace walks it too; this one is not measured.
        abandon(&store, &prefix, round).await;
        round += 1;
        complete_abandoned(&store, &redrive, Duration::ZERO, ABANDONED, &policy).await;
        let (mut completer, mut reaper) = (Vec::new(), Vec::new());
        let (mut completer_cmds, mut reaper_cmds) = (0, 0);
        for _ in 0..PASSES {
            abandon(&store, &prefix, round).await;
            round += 1;
            reset(&mut raw).await;
            let started = Instant::now();
            let report =
                complete_abandoned(&store, &redrive, Duration::ZERO, ABANDONED, &policy).await;
            completer.push(started.elapsed());
            completer_cmds = commands(&mut raw).await;
            assert_eq!(report.completed, ABANDONED as u64, "{report:?}");
            reset(&mut raw).await;
            let started = Instant::now();
            let report = reap_all(&store, 1000, DEFAULT_REAP_PAUSE)
                .await
                .expect("reap");
            reaper.push(started.elapsed());
            reaper_cmds = commands(&mut raw).await;
            assert_eq!(report.deleted, 0, "{report:?}");
        }
        rows.push((
            size,
            median(completer),
            completer_cmds,
            median(reaper),
            reaper_cmds,
            walk_time,
        ));
    }
    let (_, base_c, _, base_r, _, _) = rows[0];
    println!(
        "| records held | completer pass (100 abandoned) | commands | reaper pass | commands | walk of the namespace |"
    );
    println!("|---|---|---|---|---|---|");
    for (size, c, cc, r, rc, w) in &rows {
        println!(
            "| {size} | {:.2} ms ({:.2}x) | {cc} | {:.2} ms ({:.2}x) | {rc} | {:.2} s |",
            ms(*c),
            c.as_secs_f64() / base_c.as_secs_f64(),
            ms(*r),
            r.as_secs_f64() / base_r.as_secs_f64(),
            w.as_secs_f64()
        );
    }
}
