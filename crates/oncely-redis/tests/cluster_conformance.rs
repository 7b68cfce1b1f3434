//! The shared backend conformance suite (its concurrency scenarios included) on a real Redis
//! Cluster of 3 primaries and 3 replicas, with `WAIT` for 1 replica after every claim, renewal,
//! recovery point and completion (the cluster default). Application clock: the suite drives a
//! `ManualClock`. Skips, with a printed reason, when `ONCELY_TEST_REDIS_CLUSTER_URL` is unset
//! (`.ci/redis-cluster.sh` starts the cluster and prints the URL).

mod common;

use oncely_core::ManualClock;
use oncely_redis::{ClockSource, RedisConfig, RedisStore};
use std::sync::Arc;
use std::time::Duration;

async fn make(clock: ManualClock) -> Option<RedisStore> {
    let url = common::cluster_url()?;
    let config = RedisConfig::new().with_namespace(format!("oncely-test-{}", uuid::Uuid::new_v4()));
    let store = RedisStore::connect_with(&url, config)
        .await
        .expect("connect to ONCELY_TEST_REDIS_CLUSTER_URL");
    assert!(store.is_cluster());
    assert_eq!(
        store.replica_wait(),
        Some((1, Duration::from_millis(500))),
        "a cluster waits for one replica by default"
    );
    Some(store.with_clock_source(ClockSource::Application(Arc::new(clock))))
}

oncely_conformance::conformance_tests!(make);
oncely_conformance::operator_conformance_tests!(make);
