//! The paused owner, on the server's clock with a real (short) lease and a real sleep; plus
//! the storage layout details the fencing depends on. Skips when `ONCELY_TEST_REDIS_URL` is
//! unset.

mod common;

use common::{claim_req, fresh_id, redis_url, response};
use oncely_core::{
    ClaimKind, ClaimOutcome, FencingToken, IdempotencyKey, KeyStore, RecordKey, RecordState, Scope,
    StoreError,
};
use oncely_redis::{ClockSource, RedisStore};
use std::time::Duration;

const LEASE: Duration = Duration::from_millis(200);

async fn server_time_ms(url: &str) -> i64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    s * 1000 + us / 1000
}

/// Owner A claims and stops past its lease; B takes over and completes; A's late writes are
/// all fenced and B's stored response is unchanged. Two separate connections, server clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_owner_is_fenced_after_takeover() {
    let Some(url) = redis_url() else { return };
    let a = RedisStore::connect(&url).await.unwrap();
    let b = RedisStore::connect(&url).await.unwrap();
    assert!(matches!(a.clock_source(), ClockSource::Server));
    let id = fresh_id("paused");

    let before = server_time_ms(&url).await;
    let ClaimOutcome::Claimed(owner_a) = a.claim(claim_req(&id, "{}", LEASE)).await.unwrap() else {
        panic!("A must win an absent key")
    };
    let after = server_time_ms(&url).await;
    assert_eq!(owner_a.token, FencingToken(1));
    assert_eq!(owner_a.kind, ClaimKind::New);
    // The lease is measured on the server's clock.
    assert!(
        (before + 200..=after + 200).contains(&owner_a.lease_expires_at),
        "lease {} not within server time [{before}, {after}] + 200 ms",
        owner_a.lease_expires_at
    );
    // While A's lease is alive, B is told "in flight".
    assert_eq!(
        b.claim(claim_req(&id, "{}", LEASE)).await.unwrap(),
        ClaimOutcome::InFlight {
            lease_expires_at: owner_a.lease_expires_at
        }
    );
    a.checkpoint(&id, owner_a.token, "charge_created", LEASE)
        .await
        .unwrap();

    // A is paused (GC, stalled VM) past its lease.
    tokio::time::sleep(LEASE + Duration::from_millis(150)).await;

    let ClaimOutcome::Claimed(owner_b) = b.claim(claim_req(&id, "{}", LEASE * 50)).await.unwrap()
    else {
        panic!("B must take over a lapsed lease")
    };
    assert_eq!(owner_b.kind, ClaimKind::Takeover);
    assert_eq!(owner_b.token, FencingToken(2));
    assert_eq!(owner_b.recovery_point.as_deref(), Some("charge_created"));
    b.complete(&id, owner_b.token, response("B"), Duration::from_secs(60))
        .await
        .unwrap();

    // A wakes up and tries every write with its stale token.
    assert!(matches!(
        a.complete(&id, owner_a.token, response("A"), Duration::from_secs(60))
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        a.renew(&id, owner_a.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        a.checkpoint(&id, owner_a.token, "late", LEASE).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        a.release(&id, owner_a.token).await,
        Err(StoreError::Fenced)
    ));

    let rec = a.get(&id).await.unwrap().expect("record kept");
    assert_eq!(rec.token, FencingToken(2));
    match rec.state {
        RecordState::Complete { response: r, .. } => assert_eq!(r, response("B")),
        other => panic!("expected B's completion, got {other:?}"),
    }
    match a.claim(claim_req(&id, "{}", LEASE)).await.unwrap() {
        ClaimOutcome::Replay { response: r, .. } => assert_eq!(r.body, b"B"),
        other => panic!("expected B's replay, got {other:?}"),
    }
}

/// Every write sets the hash's TTL to the retention end; a released record stays as a
/// tombstone that keeps the token, so the next claim continues from it.
#[tokio::test]
async fn ttl_follows_retention_and_tombstones_keep_tokens() {
    let Some(url) = redis_url() else { return };
    let store = RedisStore::connect(&url).await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let id = fresh_id("ttl");
    let key = store.key_of(&id);

    let ClaimOutcome::Claimed(first) = store
        .claim(claim_req(&id, "{}", Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!()
    };
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let retention_ms = 72 * 3_600_000;
    assert!(
        (retention_ms - 2_000..=retention_ms).contains(&pttl),
        "PTTL {pttl}"
    );
    store.release(&id, first.token).await.unwrap();
    let state: String = redis::cmd("HGET")
        .arg(&key)
        .arg("state")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(state, "released");
    let ClaimOutcome::Claimed(second) = store
        .claim(claim_req(&id, r#"{"other":1}"#, Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(second.kind, ClaimKind::New);
    assert_eq!(second.token, FencingToken(2));

    store
        .complete(&id, second.token, response("x"), Duration::from_secs(10))
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        (8_000..=10_000).contains(&pttl),
        "PTTL after complete {pttl}"
    );

    // A retention shorter than the lease never lets the record expire under a live owner.
    let short = fresh_id("ttl-short");
    let mut req = claim_req(&short, "{}", Duration::from_secs(30));
    req.retention = Duration::from_secs(1);
    let ClaimOutcome::Claimed(c) = store.claim(req).await.unwrap() else {
        panic!()
    };
    let rec = store.get(&short).await.unwrap().unwrap();
    assert_eq!(rec.expires_at, c.lease_expires_at);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(store.key_of(&short))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!((28_000..=30_000).contains(&pttl), "PTTL {pttl}");
}

/// `(scope "a:b", key "c")` and `(scope "a", key "b:c")` are two records, and braces in a
/// scope or key stay inside the hash tag.
#[tokio::test]
async fn identities_with_separators_never_collide() {
    let Some(url) = redis_url() else { return };
    let store = RedisStore::connect(&url).await.unwrap();
    let base = uuid::Uuid::new_v4().to_string();
    let one = RecordKey::new(
        Scope::new(format!("{base}:b}}")),
        IdempotencyKey::new("c{").unwrap(),
    );
    let two = RecordKey::new(
        Scope::new(base.clone()),
        IdempotencyKey::new("b}:c{").unwrap(),
    );
    assert_ne!(store.key_of(&one), store.key_of(&two));
    let ClaimOutcome::Claimed(c1) = store
        .claim(claim_req(&one, r#"{"n":1}"#, Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!()
    };
    store
        .complete(&one, c1.token, response("one"), Duration::from_secs(60))
        .await
        .unwrap();
    // The other identity is absent: a first attempt, not a mismatch or a replay.
    let ClaimOutcome::Claimed(c2) = store
        .claim(claim_req(&two, r#"{"n":2}"#, Duration::from_secs(30)))
        .await
        .unwrap()
    else {
        panic!("the second identity must be independent")
    };
    assert_eq!((c2.kind, c2.token), (ClaimKind::New, FencingToken(1)));
    let rec = store.get(&one).await.unwrap().unwrap();
    assert_eq!((rec.scope, rec.key), (one.scope.clone(), one.key.clone()));
}
