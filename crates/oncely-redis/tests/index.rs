//! The maintenance index (`RedisStore`, "The maintenance index"), on Redis and on Redis
//! Cluster: every script that changes a record keeps its entries right; the completer's and the
//! reaper's lists read them and no other record; entries that no longer match their record are
//! repaired by the reader; records that have no entry (written before the index existed) are
//! found by the walk of the namespace, which is not the per-pass path; and one pass costs the
//! same commands however many records Redis holds (counted on a private `redis-server`).
//!
//! Application clock (a `ManualClock` in the year 2006, so leases lapse when the test says).
//! Skips, with a printed reason, when `ONCELY_TEST_REDIS_URL` and `ONCELY_TEST_REDIS_CLUSTER_URL`
//! are unset (each store separately), or `redis-server` is not installed (the count).

mod common;

use common::{PrivateRedis, Raw, claim_req, entry, fresh_id, response};
use oncely_core::{
    ClaimOutcome, Clock, KeyStore, Maintenance, ManualClock, RecordKey, RecordState, RedriveNote,
    UnixMillis,
};
use oncely_redis::{ClockSource, IndexKind, RedisConfig, RedisStore};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

fn clock_in_2006() -> ManualClock {
    let offset = (uuid::Uuid::new_v4().as_u128() % 300_000) as i64 * 60_000;
    ManualClock::new(1_136_073_600_000 + offset)
}

/// A store on `url` in a namespace of its own, on `clock`, walking the namespace by itself as
/// `walk` says.
async fn store_at(url: &str, clock: &ManualClock, walk: Option<Duration>) -> RedisStore {
    let config = RedisConfig::new()
        .with_namespace(format!("oncely-index-{}", uuid::Uuid::new_v4()))
        .with_index_walk_every(walk);
    RedisStore::connect_with(url, config)
        .await
        .expect("connect")
        .with_clock_source(ClockSource::Application(Arc::new(clock.clone())))
}

/// A store (and a plain connection) on each test server that is configured.
async fn stores(clock: &ManualClock, walk: Option<Duration>) -> Vec<(RedisStore, Raw)> {
    let mut out = Vec::new();
    for url in [common::redis_url(), common::cluster_url()]
        .into_iter()
        .flatten()
    {
        out.push((store_at(&url, clock, walk).await, Raw::open(&url).await));
    }
    out
}

async fn claimed(store: &RedisStore, id: &RecordKey) -> oncely_core::Claim {
    match store.claim(claim_req(id, "{}", LEASE)).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn ids(records: Vec<oncely_core::Record>) -> Vec<RecordKey> {
    records
        .into_iter()
        .map(|r| RecordKey::new(r.scope, r.key))
        .collect()
}

/// The records `store` lists as abandoned (no grace).
async fn abandoned(store: &RedisStore) -> Vec<RecordKey> {
    ids(store.list_abandoned(Duration::ZERO, 100).await.unwrap())
}

async fn expires_at(store: &RedisStore, id: &RecordKey) -> UnixMillis {
    store.get(id).await.unwrap().expect("kept").expires_at
}

/// Every state change moves the record's entries, and the lists find abandoned and marked
/// records through them alone (the walk is off).
#[tokio::test]
async fn entries_follow_the_record_and_the_lists_read_them() {
    let clock = clock_in_2006();
    for (store, mut raw) in stores(&clock, None).await {
        let raw = &mut raw;
        let (a, b, c) = (fresh_id("ix"), fresh_id("ix"), fresh_id("ix"));
        // Claimed: in the lease index at its lease end, and in the retention index.
        let ca = claimed(&store, &a).await;
        assert_eq!(
            entry(raw, &store, IndexKind::Lease, &a).await,
            Some(ca.lease_expires_at)
        );
        assert_eq!(entry(raw, &store, IndexKind::Marked, &a).await, None);
        assert_eq!(
            entry(raw, &store, IndexKind::Retention, &a).await,
            Some(expires_at(&store, &a).await)
        );
        // Renewed and checkpointed: the entry moves with the lease.
        clock.advance(Duration::from_secs(5));
        let renewed = store.renew(&a, ca.token, LEASE).await.unwrap();
        assert_eq!(renewed, ca.lease_expires_at + 5_000);
        assert_eq!(
            entry(raw, &store, IndexKind::Lease, &a).await,
            Some(renewed)
        );
        clock.advance(Duration::from_secs(1));
        store
            .checkpoint(&a, ca.token, "charged", LEASE)
            .await
            .unwrap();
        let lease_a = renewed + 1_000;
        assert_eq!(
            entry(raw, &store, IndexKind::Lease, &a).await,
            Some(lease_a)
        );
        // Completed and released: out of the lease index.
        let cb = claimed(&store, &b).await;
        store
            .complete(&b, cb.token, response("b"), Duration::from_secs(7200))
            .await
            .unwrap();
        assert_eq!(entry(raw, &store, IndexKind::Lease, &b).await, None);
        assert_eq!(
            entry(raw, &store, IndexKind::Retention, &b).await,
            Some(expires_at(&store, &b).await)
        );
        let cc = claimed(&store, &c).await;
        assert!(entry(raw, &store, IndexKind::Lease, &c).await.is_some());
        store.release(&c, cc.token).await.unwrap();
        assert_eq!(entry(raw, &store, IndexKind::Lease, &c).await, None);

        // Abandoned: listed, from the index.
        clock.advance(LEASE + Duration::from_secs(1));
        let listed = store.list_abandoned(Duration::ZERO, 100).await.unwrap();
        assert_eq!(ids(listed), vec![a.clone()]);
        assert!(store.list_marked(100).await.unwrap().is_empty());
        // Marked: from the lease index to the marked one.
        let marked = store
            .note_redrive(&a, ca.token, 0, RedriveNote::Mark)
            .await
            .unwrap();
        assert_eq!(entry(raw, &store, IndexKind::Lease, &a).await, None);
        assert_eq!(
            entry(raw, &store, IndexKind::Marked, &a).await,
            marked.marked_at
        );
        assert!(abandoned(&store).await.is_empty());
        assert_eq!(ids(store.list_marked(100).await.unwrap()), vec![a.clone()]);
        // Its owner completes it after all: in no list any more.
        store
            .complete(&a, ca.token, response("a"), Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(entry(raw, &store, IndexKind::Marked, &a).await, None);
        assert!(store.list_marked(100).await.unwrap().is_empty());

        // Past every retention: the reaper reads the due entries, deletes the records and
        // their entries.
        clock.advance(Duration::from_secs(3 * 24 * 3600 + 60));
        let report = store.reap(100).await.unwrap();
        assert_eq!(report.deleted, 3, "{report:?}");
        for id in [&a, &b, &c] {
            assert_eq!(store.get(id).await.unwrap(), None);
            for kind in [IndexKind::Lease, IndexKind::Marked, IndexKind::Retention] {
                assert_eq!(entry(raw, &store, kind, id).await, None, "{kind:?}");
            }
        }
        assert_eq!(store.reap(100).await.unwrap().deleted, 0);
    }
}

/// An entry whose record is gone (Redis expired it) or no longer matches it (left by an older
/// version's write) is not listed, and the reader repairs it.
#[tokio::test]
async fn entries_that_no_longer_match_are_repaired_by_the_reader() {
    let clock = clock_in_2006();
    for (store, mut raw) in stores(&clock, None).await {
        let raw = &mut raw;
        let (gone, done) = (fresh_id("ix"), fresh_id("ix"));
        let c = claimed(&store, &done).await;
        store
            .complete(&done, c.token, response("done"), Duration::from_secs(3600))
            .await
            .unwrap();
        let old = clock.now_millis() - 60_000;
        for id in [&gone, &done] {
            let _: i64 = raw
                .query(
                    redis::cmd("ZADD")
                        .arg(store.index_key_of(id, IndexKind::Lease))
                        .arg(old)
                        .arg(store.key_of(id)),
                )
                .await;
            assert_eq!(entry(raw, &store, IndexKind::Lease, id).await, Some(old));
        }
        assert!(abandoned(&store).await.is_empty());
        for id in [&gone, &done] {
            assert_eq!(entry(raw, &store, IndexKind::Lease, id).await, None);
        }
    }
}

/// A record without index entries (as one written before the index existed) is not seen by a
/// pass, which reads only the index; the walk of the namespace finds it and writes its entries:
/// called by hand, and by the first pass on a namespace, then not again within the interval.
#[tokio::test]
async fn records_without_entries_are_found_by_the_walk() {
    let clock = clock_in_2006();
    let mut urls: Vec<String> = Vec::new();
    urls.extend(common::redis_url());
    urls.extend(common::cluster_url());
    for url in urls {
        let mut raw = Raw::open(&url).await;
        let raw = &mut raw;
        // Takes a record's entries away, as an older version never wrote them.
        async fn unindex(raw: &mut Raw, store: &RedisStore, id: &RecordKey) {
            for kind in [IndexKind::Lease, IndexKind::Marked, IndexKind::Retention] {
                let _: i64 = raw
                    .query(
                        redis::cmd("ZREM")
                            .arg(store.index_key_of(id, kind))
                            .arg(store.key_of(id)),
                    )
                    .await;
            }
        }

        let by_hand = store_at(&url, &clock, None).await;
        let (x, m) = (fresh_id("walk"), fresh_id("walk"));
        claimed(&by_hand, &x).await;
        let cm = claimed(&by_hand, &m).await;
        clock.advance(LEASE + Duration::from_secs(1));
        let marked = by_hand
            .note_redrive(&m, cm.token, 0, RedriveNote::Mark)
            .await
            .unwrap();
        for id in [&x, &m] {
            unindex(raw, &by_hand, id).await;
        }
        assert!(
            abandoned(&by_hand).await.is_empty(),
            "a pass reads only the index"
        );
        assert!(by_hand.list_marked(100).await.unwrap().is_empty());
        let walk = by_hand.rebuild_index().await.unwrap();
        // Both records (SCAN may return a key twice); under the application clock every
        // record is indexed (for the retention index).
        assert!(walk.records >= 2, "{walk:?}");
        assert_eq!(walk.indexed, walk.records, "{walk:?}");
        let lease_x = match by_hand.get(&x).await.unwrap().unwrap().state {
            RecordState::InFlight {
                lease_expires_at, ..
            } => lease_expires_at,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            entry(raw, &by_hand, IndexKind::Lease, &x).await,
            Some(lease_x)
        );
        assert_eq!(
            entry(raw, &by_hand, IndexKind::Marked, &m).await,
            marked.marked_at
        );
        assert_eq!(abandoned(&by_hand).await, vec![x.clone()]);
        assert_eq!(
            ids(by_hand.list_marked(100).await.unwrap()),
            vec![m.clone()]
        );

        // The first pass on a namespace walks it; the next passes within the hour do not.
        let hourly = store_at(&url, &clock, Some(Duration::from_secs(3600))).await;
        let (y, z) = (fresh_id("walk"), fresh_id("walk"));
        claimed(&hourly, &y).await;
        unindex(raw, &hourly, &y).await;
        clock.advance(LEASE + Duration::from_secs(1));
        assert_eq!(
            abandoned(&hourly).await,
            vec![y.clone()],
            "the first pass walked"
        );
        claimed(&hourly, &z).await;
        unindex(raw, &hourly, &z).await;
        clock.advance(LEASE + Duration::from_secs(1));
        assert_eq!(
            abandoned(&hourly).await,
            vec![y.clone()],
            "no walk within the hour"
        );
        let next_walk_ms: i64 = raw
            .query(redis::cmd("PTTL").arg(format!("{}:index:walk", hourly.namespace())))
            .await;
        assert!(
            next_walk_ms > 0 && next_walk_ms <= 3_600_000,
            "{next_walk_ms}"
        );
        hourly.rebuild_index().await.unwrap();
        assert_eq!(abandoned(&hourly).await, vec![y.clone(), z.clone()]);
    }
}

/// Every command a private Redis ran since the last `CONFIG RESETSTAT`, by name, with its
/// number of calls (the statistics commands themselves left out).
async fn commands(raw: &mut Raw) -> BTreeMap<String, u64> {
    let info: String = raw.query(redis::cmd("INFO").arg("commandstats")).await;
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("config") && name != "info").then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// Stores `n` completed records, 100 at a time.
async fn completed(store: &RedisStore, n: usize) {
    for _ in 0..n.div_ceil(100) {
        futures::future::join_all((0..100).map(|_| async {
            let id = fresh_id("kept");
            let c = claimed(store, &id).await;
            store
                .complete(&id, c.token, response("kept"), Duration::from_secs(3600))
                .await
                .unwrap();
        }))
        .await;
    }
}

/// One completer pass and one reaper pass run the same commands with 1,000 and with 10,000
/// completed records held: no `SCAN`, and one `HGETALL` per abandoned or marked record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pass_costs_the_work_not_the_records_held() {
    if common::redis_url().is_none() || !PrivateRedis::installed() {
        return;
    }
    let server = PrivateRedis::start(&[]);
    let url = format!("{}?accept_volatile=true", server.url());
    let clock = clock_in_2006();
    let store = store_at(&url, &clock, Some(Duration::from_secs(3600))).await;
    let mut raw = Raw::open(&server.url()).await;
    // 5 abandoned records and 2 marked ones.
    let mut work = Vec::new();
    for _ in 0..7 {
        let id = fresh_id("work");
        let c = claimed(&store, &id).await;
        work.push((id, c.token));
    }
    clock.advance(LEASE + Duration::from_secs(1));
    for (id, token) in &work[5..] {
        store
            .note_redrive(id, *token, 0, RedriveNote::Mark)
            .await
            .unwrap();
    }
    let pass = || async {
        let abandoned = store.list_abandoned(Duration::ZERO, 100).await.unwrap();
        let marked = store.list_marked(100).await.unwrap();
        let reaped = store.reap(100).await.unwrap();
        (abandoned.len(), marked.len(), reaped.deleted)
    };
    completed(&store, 1_000).await;
    assert_eq!(pass().await, (5, 2, 0), "the first pass also walks");
    let mut counts = Vec::new();
    for more in [0, 9_000] {
        completed(&store, more).await;
        let _: () = raw.query(redis::cmd("CONFIG").arg("RESETSTAT")).await;
        assert_eq!(pass().await, (5, 2, 0));
        counts.push(commands(&mut raw).await);
    }
    let keys: i64 = raw.query(&redis::cmd("DBSIZE")).await;
    assert!(keys >= 10_007, "{keys} keys held");
    eprintln!(
        "one pass with 1,000 and with 10,000 records held: {:?}",
        counts[0]
    );
    assert_eq!(counts[0], counts[1], "the same commands whatever is held");
    assert_eq!(counts[0].get("scan"), None);
    assert_eq!(counts[0].get("hgetall"), Some(&7));
    assert_eq!(counts[0].get("zrange"), Some(&3));
}
