//! Redis restarted in the middle of a run: the test starts its own `redis-server` (AOF with
//! `appendfsync always`, so records survive), kills it with SIGKILL, checks that every
//! operation during the outage fails closed with `StoreError::Unavailable` within the
//! operation timeout, restarts it on the same port and checks that the *same* store object
//! works again and that every record written before the outage is intact.
//!
//! Skips when `ONCELY_TEST_REDIS_URL` is unset or `redis-server` is not installed.

mod common;

use common::{PrivateRedis, claim_req, fresh_id, redis_url, response};
use oncely_core::{ClaimKind, ClaimOutcome, KeyStore, RecordKey, RecordState, StoreError};
use oncely_redis::{RedisConfig, RedisStore};
use std::time::{Duration, Instant};

const OP_TIMEOUT: Duration = Duration::from_millis(500);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(400);
const LEASE: Duration = Duration::from_secs(30);

async fn claimed(store: &RedisStore, id: &RecordKey) -> oncely_core::Claim {
    match store.claim(claim_req(id, "{}", LEASE)).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_fails_closed_and_recovers_without_a_new_store() {
    if redis_url().is_none() {
        return;
    }
    if !PrivateRedis::installed() {
        return;
    }
    // Every acknowledged write on disk first, so records survive a SIGKILL.
    const AOF: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut server = PrivateRedis::start_at(port, dir.path(), &AOF);
    let url = server.url();
    let store =
        RedisStore::connect_with(&url, RedisConfig::new().with_operation_timeout(OP_TIMEOUT))
            .await
            .unwrap();

    // Before the outage: three completed records and one in flight at a recovery point.
    let done: Vec<RecordKey> = (0..3).map(|_| fresh_id("restart")).collect();
    for (i, id) in done.iter().enumerate() {
        let c = claimed(&store, id).await;
        store
            .complete(
                id,
                c.token,
                response(&format!("done {i}")),
                Duration::from_secs(600),
            )
            .await
            .unwrap();
    }
    let running = fresh_id("restart");
    let owner = claimed(&store, &running).await;
    store
        .checkpoint(&running, owner.token, "charged", LEASE)
        .await
        .unwrap();
    let running_before = store.get(&running).await.unwrap().unwrap();

    server.kill();

    // During the outage every operation fails closed, each within the operation timeout.
    let fresh = fresh_id("restart");
    for attempt in 0..4 {
        for op in 0..4 {
            let started = Instant::now();
            let r = match op {
                0 => store.claim(claim_req(&fresh, "{}", LEASE)).await.map(drop),
                1 => store.get(&done[0]).await.map(drop),
                2 => {
                    store
                        .complete(
                            &running,
                            owner.token,
                            response("x"),
                            Duration::from_secs(600),
                        )
                        .await
                }
                _ => store.renew(&running, owner.token, LEASE).await.map(drop),
            };
            let took = started.elapsed();
            assert!(
                matches!(r, Err(StoreError::Unavailable(_))),
                "attempt {attempt}, op {op}: expected Unavailable, got {r:?}"
            );
            assert!(
                took <= OP_TIMEOUT + SLACK,
                "attempt {attempt}, op {op}: took {took:?}"
            );
        }
    }

    // Restart on the same port, same data directory.
    let _server = PrivateRedis::start_at(port, dir.path(), &AOF);

    // The same store object recovers by itself (the connection manager reconnects); allow the
    // first calls to fail while it does, and count them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut failures_after_restart = 0;
    loop {
        match store.ping().await {
            Ok(()) => break,
            Err(StoreError::Unavailable(_)) => {
                failures_after_restart += 1;
                assert!(Instant::now() < deadline, "no recovery within 10 s");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    eprintln!("calls failed while reconnecting after the restart: {failures_after_restart}");
    assert!(failures_after_restart <= 3, "{failures_after_restart}");

    // Every record written before the outage is intact and behaves as before.
    for (i, id) in done.iter().enumerate() {
        match store.claim(claim_req(id, "{}", LEASE)).await.unwrap() {
            ClaimOutcome::Replay { response: r, .. } => {
                assert_eq!(r, response(&format!("done {i}")));
            }
            other => panic!("record {i}: expected a replay, got {other:?}"),
        }
    }
    assert_eq!(store.get(&running).await.unwrap().unwrap(), running_before);
    assert!(matches!(
        store.get(&running).await.unwrap().unwrap().state,
        RecordState::InFlight { recovery_point: Some(ref rp), .. } if rp == "charged"
    ));
    // The owner's token still works after the restart (the scripts are reloaded by EVALSHA's
    // fallback), and a duplicate still sees the claim.
    assert!(matches!(
        store.claim(claim_req(&running, "{}", LEASE)).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    store
        .complete(
            &running,
            owner.token,
            response("after"),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    // Nothing attempted during the outage was applied, and new keys work.
    let c = claimed(&store, &fresh).await;
    assert_eq!(c.kind, ClaimKind::New);
    assert_eq!(c.token.0, 1);
}
