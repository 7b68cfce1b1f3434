//! A person's changes on Redis and Redis Cluster (`Operator` for `RedisStore`): each change
//! leaves the maintenance index answering what the record now is (a released record is not
//! abandoned work, a retried one is re-driven by the completer, a resolved one replays and is
//! in no list), and a listing pages through every record on every primary, from the index or
//! with `SCAN`.
//!
//! Application clock (a `ManualClock` in the year 2007, so leases lapse when the test says).
//! Skips, with a printed reason, when `ONCELY_TEST_REDIS_URL` and `ONCELY_TEST_REDIS_CLUSTER_URL`
//! are unset (each store separately).

mod common;

use async_trait::async_trait;
use common::{Raw, entry};
use oncely_conformance::claim_req;
use oncely_core::{
    ClaimKind, ClaimOutcome, IdempotencyKey, KeyStore, Maintenance, ManualClock, Operator,
    OperatorError, Record, RecordFilter, RecordKey, RecordState, RecordVersion, RedriveNote, Scope,
    StoreError, StoredResponse,
};
use oncely_jobs::{Redrive, RedriveError, RedrivePolicy, complete_abandoned};
use oncely_redis::{ClockSource, IndexKind, RedisConfig, RedisStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const LEASE: Duration = oncely_conformance::LEASE;

fn clock_in_2007() -> ManualClock {
    let offset = (uuid::Uuid::new_v4().as_u128() % 300_000) as i64 * 60_000;
    ManualClock::new(1_167_609_600_000 + offset)
}

/// A store (and a plain connection) on each test server that is configured, each in a
/// namespace of its own, never walking the namespace by itself (so the lists read the index
/// alone).
async fn stores(clock: &ManualClock) -> Vec<(RedisStore, Raw)> {
    let mut out = Vec::new();
    for url in [common::redis_url(), common::cluster_url()]
        .into_iter()
        .flatten()
    {
        let config = RedisConfig::new()
            .with_namespace(format!("oncely-operator-{}", uuid::Uuid::new_v4()))
            .with_index_walk_every(None);
        let store = RedisStore::connect_with(&url, config)
            .await
            .expect("connect")
            .with_clock_source(ClockSource::Application(Arc::new(clock.clone())));
        out.push((store, Raw::open(&url).await));
    }
    out
}

fn id(scope: &str, key: &str) -> RecordKey {
    RecordKey::new(Scope::new(scope), IdempotencyKey::new(key).unwrap())
}

fn ids(records: &[Record]) -> Vec<RecordKey> {
    records
        .iter()
        .map(|r| RecordKey::new(r.scope.clone(), r.key.clone()))
        .collect()
}

async fn claimed(store: &RedisStore, id: &RecordKey) -> oncely_core::Claim {
    match store.claim(claim_req(id, "{}")).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn version(store: &RedisStore, id: &RecordKey) -> RecordVersion {
    RecordVersion::of(&store.get(id).await.unwrap().expect("kept"))
}

fn answer(body: &str) -> StoredResponse {
    StoredResponse::new(
        200,
        vec![("content-type".into(), b"application/json".to_vec())],
        body.as_bytes().to_vec(),
    )
}

/// What the server does with a re-driven request: takes the key over with the stored request
/// and completes it. Counts the re-drives.
struct Server {
    store: RedisStore,
    redrives: AtomicU32,
}

#[async_trait]
impl Redrive for Server {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        self.redrives.fetch_add(1, Ordering::SeqCst);
        let id = RecordKey::new(record.scope.clone(), record.key.clone());
        match self.store.claim(claim_req(&id, "{}")).await {
            Ok(ClaimOutcome::Claimed(c)) => {
                assert_eq!(c.kind, ClaimKind::Takeover);
                self.store
                    .complete(&id, c.token, answer("redriven"), Duration::from_secs(3600))
                    .await
                    .map_err(|e| RedriveError::Unreachable(Box::new(e)))?;
                Ok(201)
            }
            other => panic!("a re-drive must take the key over, got {other:?}"),
        }
    }
}

/// Release, resolve and retry each leave the record's index entries right, and the jobs'
/// lists (which read only the index) answer accordingly.
#[tokio::test]
async fn changes_leave_the_index_answering_what_the_record_is() {
    let clock = clock_in_2007();
    for (store, mut raw) in stores(&clock).await {
        let raw = &mut raw;
        let scope = format!("op-{}", uuid::Uuid::new_v4());
        let (rel, res, ret) = (id(&scope, "rel"), id(&scope, "res"), id(&scope, "ret"));
        let mut claims = Vec::new();
        for i in [&rel, &res, &ret] {
            claims.push(claimed(&store, i).await);
        }
        clock.advance(LEASE + Duration::from_secs(1));
        for (i, c) in [&rel, &res, &ret].into_iter().zip(&claims) {
            store
                .note_redrive(i, c.token, 0, RedriveNote::Mark)
                .await
                .unwrap();
            assert!(entry(raw, &store, IndexKind::Marked, i).await.is_some());
        }
        let marked = RecordFilter::default().with_marked(true);
        let page = store.list_records(&marked, 10, None).await.unwrap();
        assert_eq!(
            ids(&page.records),
            vec![rel.clone(), res.clone(), ret.clone()]
        );
        assert_eq!(page.next, None);

        // Released: a tombstone with the next token, in no index, not abandoned work; the next
        // request with the key executes anew.
        let seen = version(&store, &rel).await;
        let after = store.release_record(&rel, seen, false).await.unwrap();
        assert_eq!(after.state, RecordState::Released);
        assert_eq!(after.token, seen.next_token());
        assert_eq!(after.request, None);
        for kind in [IndexKind::Lease, IndexKind::Marked] {
            assert_eq!(entry(raw, &store, kind, &rel).await, None, "{kind:?}");
        }
        assert!(!ids(&store.list_abandoned(Duration::ZERO, 100).await.unwrap()).contains(&rel));
        assert!(!ids(&store.list_marked(100).await.unwrap()).contains(&rel));
        assert!(matches!(
            store.release_record(&rel, seen, false).await,
            Err(OperatorError::Changed {
                state: "released",
                ..
            })
        ));

        // Resolved: complete with the person's answer, in no index, and it replays.
        let seen = version(&store, &res).await;
        let after = store
            .resolve_record(
                &res,
                seen,
                answer("decided"),
                Duration::from_secs(3600),
                false,
            )
            .await
            .unwrap();
        assert_eq!(after.token, seen.next_token());
        for kind in [IndexKind::Lease, IndexKind::Marked] {
            assert_eq!(entry(raw, &store, kind, &res).await, None, "{kind:?}");
        }
        match store.claim(claim_req(&res, "{}")).await.unwrap() {
            ClaimOutcome::Replay { response, .. } => assert_eq!(response, answer("decided")),
            other => panic!("a resolved record replays, got {other:?}"),
        }

        // Retried: out of the marked index, into the lease index at its (lapsed) lease end, and
        // the completer re-drives it once.
        let seen = version(&store, &ret).await;
        let after = store.retry_record(&ret, seen, 0).await.unwrap();
        assert_eq!(after.token, seen.next_token());
        assert!(!after.redrives.is_marked());
        let RecordState::InFlight {
            lease_expires_at, ..
        } = after.state
        else {
            panic!("a retried record stays in flight: {after:?}");
        };
        assert_eq!(entry(raw, &store, IndexKind::Marked, &ret).await, None);
        assert_eq!(
            entry(raw, &store, IndexKind::Lease, &ret).await,
            Some(lease_expires_at)
        );
        assert_eq!(
            ids(&store.list_abandoned(Duration::ZERO, 100).await.unwrap()),
            vec![ret.clone()]
        );
        assert!(store.list_marked(100).await.unwrap().is_empty());
        let server = Server {
            store: store.clone(),
            redrives: AtomicU32::new(0),
        };
        let report = complete_abandoned(
            &store,
            &server,
            Duration::ZERO,
            100,
            &RedrivePolicy::new(1, Duration::from_secs(30), Duration::from_secs(60)),
        )
        .await;
        assert_eq!((report.attempted, report.completed), (1, 1), "{report:?}");
        assert_eq!(server.redrives.load(Ordering::SeqCst), 1);
        match store.claim(claim_req(&ret, "{}")).await.unwrap() {
            ClaimOutcome::Replay { response, .. } => assert_eq!(response, answer("redriven")),
            other => panic!("a re-driven record replays, got {other:?}"),
        }
        for kind in [IndexKind::Lease, IndexKind::Marked] {
            assert_eq!(entry(raw, &store, kind, &ret).await, None, "{kind:?}");
        }
        assert!(
            store
                .list_records(&marked, 10, None)
                .await
                .unwrap()
                .records
                .is_empty()
        );
    }
}

/// A forced change on a live lease fences the owner still running it; an unforced one is
/// refused, and so is a change made from a stale reading.
#[tokio::test]
async fn a_forced_change_fences_the_running_owner() {
    let clock = clock_in_2007();
    for (store, mut raw) in stores(&clock).await {
        let raw = &mut raw;
        let scope = format!("op-{}", uuid::Uuid::new_v4());
        let (a, b) = (id(&scope, "a"), id(&scope, "b"));
        let ca = claimed(&store, &a).await;
        let seen = version(&store, &a).await;
        assert!(matches!(
            store.release_record(&a, seen, false).await,
            Err(OperatorError::LeaseLive { lease_expires_at }) if lease_expires_at == ca.lease_expires_at
        ));
        let stale = RecordVersion::new(oncely_core::FencingToken(ca.token.0 - 1), "in_flight");
        assert!(matches!(
            store.release_record(&a, stale, true).await,
            Err(OperatorError::Changed { state: "in_flight", token }) if token == ca.token.0
        ));
        store.release_record(&a, seen, true).await.unwrap();
        assert!(matches!(
            store.complete(&a, ca.token, answer("late"), LEASE).await,
            Err(StoreError::Fenced)
        ));
        assert_eq!(entry(raw, &store, IndexKind::Lease, &a).await, None);
        match store.claim(claim_req(&a, "{}")).await.unwrap() {
            ClaimOutcome::Claimed(c) => {
                assert_eq!((c.kind, c.token.0), (ClaimKind::New, ca.token.0 + 2));
            }
            other => panic!("a released key is claimed anew, got {other:?}"),
        }

        let cb = claimed(&store, &b).await;
        let seen = version(&store, &b).await;
        assert!(matches!(
            store
                .resolve_record(&b, seen, answer("x"), LEASE, false)
                .await,
            Err(OperatorError::LeaseLive { .. })
        ));
        assert!(matches!(
            store.retry_record(&b, seen, 0).await,
            Err(OperatorError::NotAllowed { .. })
        ));
        store
            .resolve_record(&b, seen, answer("forced"), LEASE, true)
            .await
            .unwrap();
        assert!(matches!(
            store.renew(&b, cb.token, LEASE).await,
            Err(StoreError::Fenced)
        ));
        assert_eq!(entry(raw, &store, IndexKind::Lease, &b).await, None);
        assert!(matches!(
            store.release_record(&id(&scope, "none"), seen, true).await,
            Err(OperatorError::NotFound)
        ));
    }
}

/// Every page through `filter` with pages of `limit`: the records, each page at most `limit`.
async fn every_page(store: &RedisStore, filter: &RecordFilter, limit: usize) -> Vec<RecordKey> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let page = store
            .list_records(filter, limit, cursor.as_deref())
            .await
            .unwrap();
        assert!(
            page.records.len() <= limit,
            "{} > {limit}",
            page.records.len()
        );
        out.extend(ids(&page.records));
        match page.next {
            None => return out,
            next => cursor = next,
        }
    }
    panic!("the listing did not end");
}

/// `ids` in `(scope, key)` order.
fn sorted(ids: &[RecordKey]) -> Vec<RecordKey> {
    let mut v = ids.to_vec();
    v.sort_by(|x, y| (x.scope.as_str(), x.key.as_str()).cmp(&(y.scope.as_str(), y.key.as_str())));
    v
}

/// A listing pages through every record it should, once, in `(scope, key)` order, on every
/// primary: from the index (marked, in flight, abandoned, route), and with `SCAN` (scope, older
/// than, nothing; the shared server holds other namespaces' keys, never listed).
#[tokio::test]
async fn listings_page_through_every_primary() {
    let clock = clock_in_2007();
    for (store, mut raw) in stores(&clock).await {
        let run = uuid::Uuid::new_v4();
        let scopes = [format!("a-{run}"), format!("b-{run}")];
        let mut live = Vec::new();
        let mut lapsed = Vec::new();
        let mut marked = Vec::new();
        let mut done = Vec::new();
        // 2 scopes x 7 keys lapse and 3 of them are marked; then 2 x 3 live ones and 2 x 2
        // complete ones.
        for scope in &scopes {
            for k in 0..7 {
                let i = id(scope, &format!("lapsed-{k}"));
                claimed(&store, &i).await;
                lapsed.push(i);
            }
        }
        clock.advance(LEASE + Duration::from_secs(1));
        for i in lapsed.iter().step_by(5) {
            let token = store.get(i).await.unwrap().unwrap().token;
            store
                .note_redrive(i, token, 0, RedriveNote::Mark)
                .await
                .unwrap();
            marked.push(i.clone());
        }
        lapsed.retain(|i| !marked.contains(i));
        for scope in &scopes {
            for k in 0..3 {
                let i = id(scope, &format!("live-{k}"));
                claimed(&store, &i).await;
                live.push(i);
            }
            for k in 0..2 {
                let i = id(scope, &format!("done-{k}"));
                let c = claimed(&store, &i).await;
                store
                    .complete(&i, c.token, answer("ok"), Duration::from_secs(3600))
                    .await
                    .unwrap();
                done.push(i);
            }
        }
        let all: Vec<RecordKey> = [&live, &lapsed, &marked, &done]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let in_scope = |v: &[RecordKey]| -> Vec<RecordKey> {
            v.iter()
                .filter(|i| i.scope.as_str() == scopes[0])
                .cloned()
                .collect()
        };

        let f = RecordFilter::default();
        let by_index = [
            (f.clone().with_marked(true), marked.clone()),
            (f.clone().with_abandoned(true), lapsed.clone()),
            (
                f.clone().with_in_flight(true),
                [&live, &lapsed, &marked]
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect(),
            ),
            (
                f.clone()
                    .with_marked(true)
                    .with_scope(Some(Scope::new(&scopes[0]))),
                in_scope(&marked),
            ),
        ];
        for (filter, want) in by_index {
            for limit in [1, 3, 100] {
                let got = every_page(&store, &filter, limit).await;
                assert_eq!(sorted(&got), sorted(&want), "{filter:?} by {limit}");
                assert_eq!(got, sorted(&got), "(scope, key) order");
            }
        }
        let by_scan = [
            (
                f.clone().with_scope(Some(Scope::new(&scopes[0]))),
                in_scope(&all),
            ),
            (
                f.clone()
                    .with_scope(Some(Scope::new(&scopes[1])))
                    .with_route(Some("/v1/payments".into())),
                [&live, &lapsed, &marked]
                    .into_iter()
                    .flatten()
                    .filter(|i| i.scope.as_str() == scopes[1])
                    .cloned()
                    .collect(),
            ),
            (f.clone(), all.clone()),
            (
                f.clone().with_older_than(Some(LEASE)),
                [&lapsed, &marked].into_iter().flatten().cloned().collect(),
            ),
        ];
        for (filter, want) in by_scan {
            for limit in [2, 1000] {
                let got = every_page(&store, &filter, limit).await;
                assert_eq!(got, sorted(&want), "{filter:?} by {limit}");
            }
        }
        assert!(matches!(
            store.list_records(&f, 1, Some("not a cursor")).await,
            Err(OperatorError::BadCursor)
        ));
        // An entry whose record is gone (Redis expired it) is not listed, and is repaired.
        let gone = id(&scopes[0], "gone");
        let _: i64 = raw
            .query(
                redis::cmd("ZADD")
                    .arg(store.index_key_of(&gone, IndexKind::Lease))
                    .arg(1)
                    .arg(store.key_of(&gone)),
            )
            .await;
        let in_flight = f
            .clone()
            .with_in_flight(true)
            .with_scope(Some(Scope::new(&scopes[0])));
        let got = every_page(&store, &in_flight, 100).await;
        assert!(!got.contains(&gone));
        assert_eq!(entry(&mut raw, &store, IndexKind::Lease, &gone).await, None);
    }
}
