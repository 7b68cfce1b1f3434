//! The store URL's `namespace=NAME`: a store connected with it keeps its records under that
//! key prefix, and a store of another namespace on the same Redis database neither reads them
//! nor finds them in its completer's walk (`list_abandoned`), so two deployments (or test runs)
//! sharing one Redis cannot take over each other's requests. Skips, with a printed reason, when
//! `ONCELY_TEST_REDIS_URL` is unset.

mod common;

use oncely_core::{ClaimOutcome, KeyStore, Maintenance};
use oncely_redis::RedisStore;
use std::time::Duration;

#[tokio::test]
async fn a_namespace_in_the_url_keeps_records_apart() {
    let Some(url) = common::redis_url() else {
        return;
    };
    let ours = format!("oncely-test-ns-{}", uuid::Uuid::new_v4().simple());
    let theirs = format!("oncely-test-ns-{}", uuid::Uuid::new_v4().simple());
    let a = RedisStore::connect(&common::with_param(&url, &format!("namespace={ours}")))
        .await
        .expect("connect with a namespace");
    let b = RedisStore::connect(&common::with_param(&url, &format!("namespace={theirs}")))
        .await
        .expect("connect with another namespace");
    assert_eq!(a.namespace(), ours);
    assert_eq!(b.namespace(), theirs);

    // An abandoned request in A's namespace: claimed with a lease that lapses at once.
    let id = common::fresh_id("namespace");
    let claimed = a
        .claim(common::claim_req(&id, "{}", Duration::from_millis(1)))
        .await
        .expect("claim in A");
    assert!(matches!(claimed, ClaimOutcome::Claimed(_)), "{claimed:?}");
    assert!(a.key_of(&id).starts_with(&format!("{ours}:")));
    tokio::time::sleep(Duration::from_millis(20)).await;

    let listed = |records: Vec<oncely_core::Record>| {
        records
            .iter()
            .filter(|r| r.scope == id.scope && r.key == id.key)
            .count()
    };
    assert_eq!(
        listed(a.list_abandoned(Duration::ZERO, 1_000).await.unwrap()),
        1,
        "A's completer finds its own abandoned request"
    );
    assert_eq!(
        listed(b.list_abandoned(Duration::ZERO, 1_000).await.unwrap()),
        0,
        "B's completer never sees it"
    );
    assert!(b.get(&id).await.unwrap().is_none(), "B does not read it");
    // B claims the same (scope, key) as a key of its own, leaving A's record as it was.
    let again = b
        .claim(common::claim_req(&id, "{}", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        matches!(&again, ClaimOutcome::Claimed(c) if c.token.0 == 1),
        "{again:?}"
    );
    let record = a.get(&id).await.unwrap().expect("A's record");
    assert_eq!(record.token.0, 1, "A's claim was not taken over");
}
