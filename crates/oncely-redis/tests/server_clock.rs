//! The jobs' operations on the server clock (the default): `list_abandoned` reads the server's
//! `TIME`, and `reap` has nothing to do because Redis expiry already removes records at their
//! retention end on that same clock. Skips when `ONCELY_TEST_REDIS_URL` is unset.

mod common;

use common::{claim_req, fresh_id, redis_url, response};
use oncely_core::{ClaimOutcome, KeyStore, Maintenance, ReapReport, RecordKey};
use oncely_redis::{RedisConfig, RedisStore};
use std::time::Duration;

#[tokio::test]
async fn abandoned_listing_and_expiry_on_the_server_clock() {
    let Some(url) = redis_url() else { return };
    // A namespace of its own, so the listing only sees this test's records.
    let ns = format!("oncely-test-{}", uuid::Uuid::new_v4());
    let store = RedisStore::connect_with(&url, RedisConfig::new().with_namespace(ns))
        .await
        .unwrap();
    let abandoned = fresh_id("abandoned");
    let live = fresh_id("live");
    let done = fresh_id("done");
    let ClaimOutcome::Claimed(a) = store
        .claim(claim_req(&abandoned, "{}", Duration::from_millis(100)))
        .await
        .unwrap()
    else {
        panic!()
    };
    store
        .checkpoint(&abandoned, a.token, "step-1", Duration::from_millis(100))
        .await
        .unwrap();
    store
        .claim(claim_req(&live, "{}", Duration::from_secs(30)))
        .await
        .unwrap();
    let ClaimOutcome::Claimed(d) = store
        .claim(claim_req(&done, "{}", Duration::from_millis(100)))
        .await
        .unwrap()
    else {
        panic!()
    };
    // Retention of 300 ms: Redis itself deletes the completed record.
    store
        .complete(&done, d.token, response("d"), Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    let listed: Vec<RecordKey> = store
        .list_abandoned(Duration::from_millis(100), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| RecordKey::new(r.scope, r.key))
        .collect();
    assert_eq!(listed, vec![abandoned.clone()]);
    // A grace longer than the lapse lists nothing.
    assert!(
        store
            .list_abandoned(Duration::from_secs(60), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.get(&done).await.unwrap(), None, "expired by Redis");
    assert_eq!(store.reap(100).await.unwrap(), ReapReport::default());
    assert!(store.get(&abandoned).await.unwrap().is_some());
}
