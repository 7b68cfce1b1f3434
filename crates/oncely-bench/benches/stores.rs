//! Claim + complete (a first execution) and claim of a completed key (a replay), through each
//! key store in-process: memory, SQLite on a temporary file, PostgreSQL and Redis when their
//! URLs are set (`ONCELY_BENCH_POSTGRES_URL`, `ONCELY_BENCH_REDIS_URL`, or the test variables).
//!
//! Run: `ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncely_bench \
//! ONCELY_BENCH_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p oncely-bench`.
//! Each benchmark measures one operation at a time (latency, not concurrent throughput; see
//! `oncely bench` for throughput under concurrency).

#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use oncely_bench::{Backend, claim_request, open, response, run_prefix};
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
    for backend in Backend::ALL {
        let opened = match rt.block_on(open(backend)) {
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

        group.bench_function(BenchmarkId::new("claim_complete", backend.name()), |b| {
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
        group.bench_function(BenchmarkId::new("replay", backend.name()), |b| {
            b.to_async(&rt).iter(|| {
                let store = store.clone();
                let req = replay_req.clone();
                async move {
                    let out = store.claim(req).await.unwrap();
                    assert!(matches!(out, ClaimOutcome::Replay { .. }), "{out:?}");
                }
            });
        });
        drop(opened);
    }
    group.finish();
}

criterion_group!(stores, benches);
criterion_main!(stores);
