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

oncely_conformance::conformance_tests!(make);
oncely_conformance::operator_conformance_tests!(make);

/// A record written before responses kept trailers (its `headers` field in the oldest form)
/// still replays; a gRPC response keeps its trailers.
#[tokio::test]
async fn legacy_headers_field_still_replays() {
    let Some(store) = make(ManualClock::starting_now()).await else {
        return;
    };
    let url = common::redis_url().expect("set when the store was made");
    let client = redis::Client::open(url.split('?').next().unwrap_or(&url)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    oncely_conformance::legacy_record_still_replays(
        &store,
        async |id: &oncely_core::RecordKey, column: Vec<u8>| {
            let written: i64 = redis::cmd("HSET")
                .arg(store.key_of(id))
                .arg("headers")
                .arg(column)
                .query_async(&mut conn)
                .await
                .unwrap();
            // 0: the field existed and was overwritten.
            assert_eq!(written, 0);
        },
    )
    .await;
}
