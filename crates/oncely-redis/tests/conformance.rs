//! The shared backend conformance suite on Redis (application clock: the suite drives a
//! `ManualClock`). Skips, with a printed reason, when `ONCELY_TEST_REDIS_URL` is unset.
//!
//! Each store gets its own namespace, so the year-2000 reaper scenario can only ever reap its
//! own records, never another scenario's running at the same time on the shared server.

mod common;

use oncely_core::ManualClock;
use oncely_redis::{ClockSource, RedisConfig, RedisStore};
use std::sync::Arc;

async fn make(clock: ManualClock) -> Option<RedisStore> {
    let url = common::redis_url()?;
    let config = RedisConfig::new().with_namespace(format!("oncely-test-{}", uuid::Uuid::new_v4()));
    let store = RedisStore::connect_with(&url, config)
        .await
        .expect("connect to ONCELY_TEST_REDIS_URL");
    Some(store.with_clock_source(ClockSource::Application(Arc::new(clock))))
}

oncely_core::conformance_tests!(make);
