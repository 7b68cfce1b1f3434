//! Helpers shared by the Redis integration tests.
#![allow(dead_code, unreachable_pub)]

use oncely_conformance::{RETENTION, WINDOW, fp};
use oncely_core::{ClaimRequest, IdempotencyKey, RecordKey, Scope, StoredResponse};
use std::time::Duration;

/// `url` with the query parameter `param` (`name=value`) added.
pub fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// The shared test server's URL with `accept_volatile=true` (the CI's Redis on 6379 persists
/// nothing, on purpose), or `None` after printing why the test is skipped.
pub fn redis_url() -> Option<String> {
    match std::env::var("ONCELY_TEST_REDIS_URL") {
        Ok(url) => Some(with_param(&url, "accept_volatile=true")),
        Err(_) => {
            eprintln!("skipping: ONCELY_TEST_REDIS_URL is not set");
            None
        }
    }
}

/// The test Redis Cluster's URL (`redis+cluster://…`, from `.ci/redis-cluster.sh`), or `None`
/// after printing why the test is skipped.
pub fn cluster_url() -> Option<String> {
    match std::env::var("ONCELY_TEST_REDIS_CLUSTER_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            eprintln!(
                "skipping: ONCELY_TEST_REDIS_CLUSTER_URL is not set (start one with .ci/redis-cluster.sh)"
            );
            None
        }
    }
}

/// A `(scope, key)` in a scope nobody else uses.
pub fn fresh_id(test: &str) -> RecordKey {
    RecordKey::new(
        Scope::new(format!("redis-{test}-{}", uuid::Uuid::new_v4())),
        IdempotencyKey::new("key-1").unwrap(),
    )
}

/// A claim request for `body` with the given lease.
pub fn claim_req(id: &RecordKey, body: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest::new(id.clone(), fp(body), lease, WINDOW, RETENTION)
}

/// A response whose body says who wrote it.
pub fn response(body: &str) -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("x-multi".into(), b"1".to_vec()),
            ("x-multi".into(), b"2".to_vec()),
        ],
        body.as_bytes().to_vec(),
    )
}
