//! Claim + complete (a first execution) and claim of a completed key (a replay), through each
//! key store in-process: memory, SQLite on a temporary file, PostgreSQL and Redis when their
//! URLs are set (`ONCELY_BENCH_POSTGRES_URL`, `ONCELY_BENCH_REDIS_URL`, or the test variables).
//!
//! Run: `ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncely_bench \
//! ONCELY_BENCH_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p oncely-bench`.
//! Each benchmark measures one operation at a time (latency, not concurrent throughput; see
//! `oncely bench` for throughput under concurrency).
//!
//! `ONCELY_BENCH_RTT_MS` (default `0`; e.g. `0,0.2,1`): for each round trip above 0, PostgreSQL
//! and Redis are measured again through the latency proxy (`oncely_bench::proxy`, half of it
//! each way; the benchmark's name ends in `@<rtt>ms`), and the round trips per first execution
//! and per replay it counted are printed. Memory and SQLite run in process: no proxy.

#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use oncely_bench::{Backend, Opened, claim_request, open_with_rtt, response, run_prefix};
use oncely_core::ClaimOutcome;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group("store");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(20);
    let rtts: Vec<f64> = std::env::var("ONCELY_BENCH_RTT_MS")
        .unwrap_or_else(|_| "0".into())
        .split(',')
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .filter(|x| x.is_finite() && *x >= 0.0)
        .collect();
    let mut runs = Vec::new();
    for backend in Backend::ALL {
        let networked = matches!(backend, Backend::Postgres | Backend::Redis);
        for &rtt in &rtts {
            if rtt > 0.0 && !networked {
                continue;
            }
            runs.push((backend, rtt));
        }
    }
    for (backend, rtt) in runs {
        let proxied = (rtt > 0.0).then(|| Duration::from_secs_f64(rtt / 1e3));
        let name = match proxied {
            Some(_) => format!("{}@{rtt}ms", backend.name()),
            None => backend.name().to_owned(),
        };
        let opened = match rt.block_on(open_with_rtt(backend, proxied)) {
            Ok(o) => o,
            Err(why) => {
                eprintln!("store/{}: skipped: {why}", backend.name());
                continue;
            }
        };
        let store = opened.store.clone();
        let prefix = run_prefix();
        let n = AtomicU64::new(0);
        let resp = response(256);

        group.bench_function(BenchmarkId::new("claim_complete", &name), |b| {
            b.to_async(&rt).iter(|| {
                let key = format!("{prefix}-{}", n.fetch_add(1, Ordering::Relaxed));
                let store = store.clone();
                let resp = resp.clone();
                async move {
                    let req = claim_request(&key);
                    let ClaimOutcome::Claimed(claim) = store.claim(req.clone()).await.unwrap()
                    else {
                        panic!("a fresh key is claimed");
                    };
                    store
                        .complete(&req.id, claim.token, resp, req.retention)
                        .await
                        .unwrap();
                }
            });
        });

        // One completed key, replayed over and over.
        let replay_req = claim_request(&format!("{prefix}-replayed"));
        rt.block_on(async {
            let ClaimOutcome::Claimed(claim) = store.claim(replay_req.clone()).await.unwrap()
            else {
                panic!("a fresh key is claimed");
            };
            store
                .complete(
                    &replay_req.id,
                    claim.token,
                    resp.clone(),
                    replay_req.retention,
                )
                .await
                .unwrap();
        });
        group.bench_function(BenchmarkId::new("replay", &name), |b| {
            b.to_async(&rt).iter(|| {
                let store = store.clone();
                let req = replay_req.clone();
                async move {
                    let out = store.claim(req).await.unwrap();
                    assert!(matches!(out, ClaimOutcome::Replay { .. }), "{out:?}");
                }
            });
        });
        rt.block_on(count_round_trips(&opened, &name, &prefix));
        drop(opened);
    }
    group.finish();
}

/// Round trips per first execution (claim + complete) and per replay, counted by the proxy
/// (when the store is reached through one), one operation at a time.
async fn count_round_trips(opened: &Opened, name: &str, prefix: &str) {
    const N: u64 = 50;
    let Some(trips) = opened.round_trips() else {
        return;
    };
    let store = &opened.store;
    let (mut first, mut replay) = (0, 0);
    for i in 0..N {
        let req = claim_request(&format!("{prefix}-counted-{i}"));
        let before = trips.total();
        let ClaimOutcome::Claimed(claim) = store.claim(req.clone()).await.unwrap() else {
            panic!("a fresh key is claimed");
        };
        store
            .complete(&req.id, claim.token, response(256), req.retention)
            .await
            .unwrap();
        first += trips.total() - before;
        let before = trips.total();
        let out = store.claim(req).await.unwrap();
        assert!(matches!(out, ClaimOutcome::Replay { .. }), "{out:?}");
        replay += trips.total() - before;
    }
    eprintln!(
        "store/{name}: round trips per first execution (claim + complete) {:.2}, per replay {:.2} (counted by the proxy, {N} each)",
        first as f64 / N as f64,
        replay as f64 / N as f64
    );
}

criterion_group!(stores, benches);
criterion_main!(stores);
