//! 500 concurrent claims of one key from 4 separate connections: exactly one winner, in each of
//! 20 runs, counted as side effects; on one Redis (skips when `ONCELY_TEST_REDIS_URL` is unset)
//! and on a Redis Cluster with `WAIT` for one replica (skips when
//! `ONCELY_TEST_REDIS_CLUSTER_URL` is unset).

mod common;

use common::{claim_req, cluster_url, fresh_id, redis_url, response};
use oncely_core::{ClaimOutcome, KeyStore};
use oncely_redis::RedisStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const RUNS: usize = 20;
const CLAIMS: usize = 500;
const CONNECTIONS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_claims_four_connections_one_winner() {
    let Some(url) = redis_url() else { return };
    race(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_claims_four_connections_one_winner_on_a_cluster() {
    let Some(url) = cluster_url() else { return };
    race(&url).await;
}

async fn race(url: &str) {
    let mut stores = Vec::new();
    for _ in 0..CONNECTIONS {
        // Each store owns its own connection (on a cluster: its own connection per node).
        stores.push(Arc::new(RedisStore::connect(url).await.unwrap()));
    }
    for run in 0..RUNS {
        let id = fresh_id("race");
        let executions = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(tokio::sync::Barrier::new(CLAIMS));
        let mut tasks = Vec::with_capacity(CLAIMS);
        for i in 0..CLAIMS {
            let store = stores[i % CONNECTIONS].clone();
            let req = claim_req(&id, r#"{"amount":100}"#, Duration::from_secs(30));
            let executions = executions.clone();
            let start = start.clone();
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let outcome = store.claim(req).await.expect("claim");
                if let ClaimOutcome::Claimed(_) = &outcome {
                    // The "handler": the side effect that must happen once.
                    executions.fetch_add(1, Ordering::SeqCst);
                }
                (i % CONNECTIONS, outcome)
            }));
        }
        let mut winners = Vec::new();
        let mut in_flight = 0;
        let mut per_connection = [0usize; CONNECTIONS];
        for t in tasks {
            let (conn, outcome) = t.await.unwrap();
            per_connection[conn] += 1;
            match outcome {
                ClaimOutcome::Claimed(c) => winners.push(c),
                ClaimOutcome::InFlight { .. } => in_flight += 1,
                other => panic!("run {run}: unexpected {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "run {run}: {winners:?}");
        assert_eq!(in_flight, CLAIMS - 1, "run {run}");
        assert_eq!(executions.load(Ordering::SeqCst), 1, "run {run}");
        assert_eq!(per_connection, [CLAIMS / CONNECTIONS; CONNECTIONS]);
        // The winner completes; every later duplicate replays its response.
        stores[0]
            .complete(
                &id,
                winners[0].token,
                response("once"),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        match stores[3]
            .claim(claim_req(&id, r#"{"amount":100}"#, Duration::from_secs(30)))
            .await
            .unwrap()
        {
            ClaimOutcome::Replay { response: r, .. } => assert_eq!(r, response("once")),
            other => panic!("run {run}: expected a replay, got {other:?}"),
        }
    }
}
