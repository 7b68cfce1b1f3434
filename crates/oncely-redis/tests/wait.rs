//! `WAIT`: a write the required replicas did not acknowledge in time is answered
//! `StoreError::Unavailable` wrapping `ReplicasDidNotAcknowledge` (the layer's `503
//! idempotency_store_unavailable`), and the record it wrote stays on the primary as documented.
//! On one Redis without replicas (skips when `ONCELY_TEST_REDIS_URL` is unset) and on the test
//! cluster, which has one replica per primary (skips when `ONCELY_TEST_REDIS_CLUSTER_URL` is
//! unset).

mod common;

use common::{claim_req, cluster_url, fresh_id, redis_url, response, with_param};
use oncely_core::{ClaimOutcome, KeyStore, RecordState, StoreError};
use oncely_redis::{RedisStore, ReplicasDidNotAcknowledge};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

fn short_of_replicas(e: &StoreError, required: u32, acknowledged: i64) {
    let StoreError::Unavailable(inner) = e else {
        panic!("expected Unavailable, got {e:?}")
    };
    let r = inner
        .downcast_ref::<ReplicasDidNotAcknowledge>()
        .unwrap_or_else(|| panic!("expected ReplicasDidNotAcknowledge, got {inner}"));
    assert_eq!((r.required, r.acknowledged), (required, acknowledged));
    assert_eq!(r.timeout, Duration::from_millis(50));
}

/// Asks for one replica more than `url` has: every waited write is refused.
async fn too_few_replicas(url: &str, has: u32) {
    let want = has + 1;
    let strict = RedisStore::connect(&with_param(
        url,
        &format!("wait_replicas={want}&wait_timeout_ms=50"),
    ))
    .await
    .unwrap();
    assert_eq!(
        strict.replica_wait(),
        Some((want, Duration::from_millis(50)))
    );
    let id = fresh_id("wait");
    let e = strict.claim(claim_req(&id, "{}", LEASE)).await.unwrap_err();
    short_of_replicas(&e, want, i64::from(has));
    // The claim was applied on the primary (never acknowledged to the caller, so its handler
    // never ran): it holds the key until its lease lapses.
    let Some(rec) = strict.get(&id).await.unwrap() else {
        panic!("the claim is on the primary")
    };
    assert!(matches!(rec.state, RecordState::InFlight { .. }));

    // With the replicas the deployment has, the same operations are acknowledged.
    let ok = RedisStore::connect(&with_param(url, &format!("wait_replicas={has}")))
        .await
        .unwrap();
    let id = fresh_id("wait");
    let ClaimOutcome::Claimed(c) = ok.claim(claim_req(&id, "{}", LEASE)).await.unwrap() else {
        panic!("an absent key is claimed")
    };
    ok.checkpoint(&id, c.token, "charged", LEASE).await.unwrap();
    ok.renew(&id, c.token, LEASE).await.unwrap();
    // ... and a completion short of replicas is refused too.
    let e = strict
        .complete(&id, c.token, response("x"), Duration::from_secs(60))
        .await
        .unwrap_err();
    short_of_replicas(&e, want, i64::from(has));
    let e = strict.renew(&id, c.token, LEASE).await.unwrap_err();
    short_of_replicas(&e, want, i64::from(has));
}

#[tokio::test]
async fn a_single_redis_without_replicas_cannot_satisfy_wait() {
    let Some(url) = redis_url() else { return };
    too_few_replicas(&url, 0).await;
}

#[tokio::test]
async fn a_cluster_with_one_replica_per_primary_cannot_satisfy_wait_two() {
    let Some(url) = cluster_url() else { return };
    too_few_replicas(&url, 1).await;
}
