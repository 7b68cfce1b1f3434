//! The reaper on PostgreSQL: 100,000 expired records removed in bounded batches while
//! concurrent claims keep succeeding, nothing inside retention removed; and the in-process
//! `Reaper` task and the completer on a real database. Skipped when `ONCELY_TEST_POSTGRES_URL`
//! is unset.
//!
//! Isolation in a shared database: the records live in scopes of their own, and the reaping
//! store's clock stands in 1975, so it can only reach records that expired before 1975, i.e.
//! these; every other test's records expire in 2000 or later. The tests of this file reach
//! into one another's years (a reaper in 1975 reaches 1974), so they take turns through
//! [`SERIAL`], and each begins by deleting what an earlier run of this file left behind (a run
//! that failed before its clean-up): every record that expires before 2000 ([`forget_leftovers`]).
//! Counts that the database makes over every scope (the reaper's `marked`, every record marked
//! for a person) are not asserted: only this file's own records are counted.

mod common;

use async_trait::async_trait;
use oncely_conformance::{LEASE, RETENTION, claim_req};
use oncely_core::{
    ClaimOutcome, ClaimRequest, Clock, IdempotencyKey, KeyStore, Maintenance, ManualClock,
    ReapReport, Record, RecordKey, Scope, StoreError, StoredResponse, SystemClock, UnixMillis,
};
use oncely_jobs::{
    CompleterReport, Reaper, Redrive, RedriveError, RedrivePolicy, complete_abandoned, reap_all,
};
use oncely_postgres::PostgresStore;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Held by each test of this file for its whole run.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// 1975-01-01T00:00:00Z in epoch milliseconds.
const T1975: UnixMillis = 157_766_400_000;

/// Test-only bulk loader: `$2` records in scope `$1` with keys `k-1..k-$2`, expiring at
/// `$3 + g` milliseconds; every 100th is an in-flight orphan, the rest are complete.
const BULK_INSERT: &str = "INSERT INTO oncely_idempotency_keys \
    (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, \
     completed_at, response_status, response_headers, response_body, response_body_retained, \
     created_at, expires_at) \
    SELECT $1, 'k-' || g, 1, decode(repeat('ab', 32), 'hex'), 1, \
           CASE WHEN g % 100 = 0 THEN 'in_flight' ELSE 'complete' END, \
           CASE WHEN g % 100 = 0 THEN $3 END, \
           CASE WHEN g % 100 = 0 THEN NULL ELSE $3 END, \
           201, convert_to('[]', 'UTF8'), convert_to('{}', 'UTF8'), TRUE, $3, $3 + g \
    FROM generate_series(1, $2::BIGINT) AS g";
const COUNT_SCOPE: &str = "SELECT count(*) FROM oncely_idempotency_keys WHERE scope = $1";
const DELETE_SCOPE: &str = "DELETE FROM oncely_idempotency_keys WHERE scope = $1";

/// 2000-01-01T00:00:00Z in epoch milliseconds: every other test's records expire later.
const T2000: UnixMillis = 946_684_800_000;

/// Deletes the records an earlier run of this file left behind (all that expire before 2000),
/// so that a rerun against a used database reaps and re-drives only its own.
async fn forget_leftovers() {
    let Some(store) = common::store(SystemClock).await else {
        return;
    };
    sqlx::query("DELETE FROM oncely_idempotency_keys WHERE expires_at < $1")
        .bind(T2000)
        .execute(store.pool())
        .await
        .unwrap();
}

async fn bulk(store: &PostgresStore, scope: &str, n: i64, base: UnixMillis) {
    sqlx::query(BULK_INSERT)
        .bind(scope)
        .bind(n)
        .bind(base)
        .execute(store.pool())
        .await
        .unwrap();
}

async fn count(store: &PostgresStore, scope: &str) -> i64 {
    sqlx::query_scalar(COUNT_SCOPE)
        .bind(scope)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Times every `reap` call (one batch = one `DELETE` statement = the time its row locks are
/// held, plus one round trip).
struct Timed {
    inner: PostgresStore,
    batches: Mutex<Vec<(u64, Duration)>>,
}

#[async_trait]
impl oncely_core::StoreWrapper for Timed {
    type Inner = PostgresStore;
    fn inner(&self) -> Result<&PostgresStore, StoreError> {
        Ok(&self.inner)
    }
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let started = Instant::now();
        let r = self.inner.reap(batch).await?;
        self.batches
            .lock()
            .unwrap()
            .push((r.deleted, started.elapsed()));
        Ok(r)
    }
}

const BATCH: usize = 1_000;
const EXPIRED: i64 = 100_000;
const KEPT: i64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaps_100k_in_bounded_batches_while_claims_succeed() {
    let _serial = SERIAL.lock().await;
    forget_leftovers().await;
    let clock = ManualClock::new(T1975);
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    let expired_scope = common::fresh_scope("reap-expired");
    let kept_scope = common::fresh_scope("reap-kept");
    // Expired: expires_at in T1975 - 100_001 ..= T1975 - 1. Kept: an hour after "now".
    bulk(&store, expired_scope.as_str(), EXPIRED, T1975 - EXPIRED - 1).await;
    bulk(&store, kept_scope.as_str(), KEPT, T1975 + 3_600_000).await;
    assert_eq!(count(&store, expired_scope.as_str()).await, EXPIRED);

    // Claimers on another instance (present-day clock), claiming fresh keys in a loop.
    let claimer = Arc::new(common::store(SystemClock).await.unwrap());
    let claim_scope = common::fresh_scope("reap-claims");
    let stop = Arc::new(AtomicBool::new(false));
    let mut claimers = Vec::new();
    for task in 0..8 {
        let (claimer, stop, scope) = (claimer.clone(), stop.clone(), claim_scope.clone());
        claimers.push(tokio::spawn(async move {
            let (mut n, mut worst) = (0u64, Duration::ZERO);
            while !stop.load(Ordering::SeqCst) || n == 0 {
                let id = RecordKey::new(
                    scope.clone(),
                    IdempotencyKey::new(&format!("t{task}-{n}")).unwrap(),
                );
                let started = Instant::now();
                match claimer.claim(claim_req(&id, "{}")).await {
                    Ok(ClaimOutcome::Claimed(_)) => {}
                    other => panic!("a claim during reaping failed: {other:?}"),
                }
                worst = worst.max(started.elapsed());
                n += 1;
            }
            (n, worst)
        }));
    }

    let timed = Timed {
        inner: store.clone(),
        batches: Mutex::default(),
    };
    let started = Instant::now();
    let report = reap_all(&timed, BATCH, Duration::from_millis(5))
        .await
        .unwrap();
    let total = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (mut claims, mut worst_claim) = (0, Duration::ZERO);
    for c in claimers {
        let (n, worst) = c.await.unwrap();
        claims += n;
        worst_claim = worst_claim.max(worst);
    }

    // Its own records only: `marked` counts every record marked for a person in the database
    // (the pass logs them all), other tests' among them, and none of this test's is marked.
    assert_eq!(
        (report.deleted, report.orphaned),
        (EXPIRED as u64, (EXPIRED / 100) as u64)
    );
    let batches = timed.batches.lock().unwrap().clone();
    // 100 full batches, then one that finds nothing left and ends the pass.
    assert_eq!(batches.len(), 101);
    assert!(batches[..100].iter().all(|(n, _)| *n == BATCH as u64));
    assert_eq!(batches[100].0, 0);
    assert_eq!(count(&store, expired_scope.as_str()).await, 0);
    assert_eq!(
        count(&store, kept_scope.as_str()).await,
        KEPT,
        "inside retention: untouched"
    );
    assert!(
        claims >= 8,
        "claims kept succeeding during the reap: {claims}"
    );

    let mut times: Vec<Duration> = batches.iter().map(|(_, d)| *d).collect();
    times.sort();
    eprintln!(
        "reaped {} records ({} orphans) in {} batches of {BATCH} in {total:?}; per batch \
         (one DELETE, row locks held): min {:?}, median {:?}, max {:?}; {claims} concurrent \
         claims succeeded, slowest {worst_claim:?}",
        report.deleted,
        report.orphaned,
        batches.len(),
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
    );
    for scope in [&kept_scope, &claim_scope] {
        sqlx::query(DELETE_SCOPE)
            .bind(scope.as_str())
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// The in-process `Reaper` task on PostgreSQL: it reaps everything due in batches, leaves
/// what is inside retention, and returns its totals when its stop signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_task_on_postgres() {
    let _serial = SERIAL.lock().await;
    forget_leftovers().await;
    // Another year than the 100k test, so the two never reach each other's records.
    let clock = ManualClock::new(T1975 - 365 * 86_400_000);
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    let now = clock.now_millis();
    let expired = common::fresh_scope("reaper-task-expired");
    let kept = common::fresh_scope("reaper-task-kept");
    bulk(&store, expired.as_str(), 2_000, now - 10_000).await;
    bulk(&store, kept.as_str(), 30, now + 60_000).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = Reaper::new(Arc::new(store.clone()), Duration::from_secs(3600), 250)
        .with_pause(Duration::from_millis(1))
        .spawn(async {
            stopped.await.ok();
        });
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&store, expired.as_str()).await > 0 {
        assert!(Instant::now() < deadline, "the reaper did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    let totals = tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .expect("stops promptly")
        .unwrap();
    // Its own records only (see the 100k test on `marked`).
    assert_eq!((totals.deleted, totals.orphaned), (2_000, 20));
    assert_eq!(count(&store, kept.as_str()).await, 30);
    sqlx::query(DELETE_SCOPE)
        .bind(kept.as_str())
        .execute(store.pool())
        .await
        .unwrap();
}

/// A stand-in for the service behind the CLI's HTTP re-drive, on PostgreSQL's transactional
/// mode: it takes the key over, resumes at the recovery point, and completes in a phase.
struct Service {
    store: PostgresStore,
    calls: AtomicU64,
}

#[async_trait]
impl Redrive for Service {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let request = record.request.clone().ok_or(RedriveError::NoRequest)?;
        let id = RecordKey::new(record.scope.clone(), record.key.clone());
        let req = ClaimRequest::new(
            id.clone(),
            record.fingerprint,
            LEASE,
            oncely_conformance::WINDOW,
            RETENTION,
        )
        .with_request(Some(request.clone()));
        let claim = match self.store.claim(req).await {
            Ok(ClaimOutcome::Claimed(c)) => c,
            Ok(ClaimOutcome::InFlight { .. }) => return Ok(409),
            Ok(ClaimOutcome::Replay { response, .. }) => return Ok(response.status),
            Ok(ClaimOutcome::Mismatch) => return Ok(422),
            Ok(ClaimOutcome::NeedsAttention { .. }) => return Ok(409),
            // An outcome this test does not know: fail closed, run nothing.
            Ok(_) => return Ok(503),
            Err(e) => return Err(RedriveError::Unreachable(Box::new(e))),
        };
        assert_eq!(claim.recovery_point.as_deref(), Some("charge_created"));
        let unreachable = |e: StoreError| RedriveError::Unreachable(Box::new(e));
        let mut phase = self.store.begin_tx().await.map_err(unreachable)?;
        self.store
            .renew_in(&mut phase, &id, claim.token, LEASE)
            .await
            .map_err(unreachable)?;
        let response = StoredResponse::new(201, vec![], request.body);
        self.store
            .complete_in(&mut phase, &id, claim.token, &response, RETENTION)
            .await
            .map_err(unreachable)?;
        phase
            .commit()
            .await
            .map_err(|e| unreachable(StoreError::unavailable(e)))?;
        Ok(201)
    }
}

/// The completer on PostgreSQL: abandoned requests (lease lapsed past the grace) are re-driven
/// once each and end complete; a live one is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completer_on_postgres() {
    let _serial = SERIAL.lock().await;
    forget_leftovers().await;
    // 1976: list_abandoned reads every scope, and no other test has in-flight records with
    // leases before 2000 while this one runs.
    let clock = ManualClock::new(T1975 + 365 * 86_400_000);
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    let mut abandoned = Vec::new();
    for i in 0..3 {
        let id = RecordKey::new(
            Scope::new(format!("pg-completer-{}", uuid::Uuid::new_v4())),
            IdempotencyKey::new("K").unwrap(),
        );
        let body = format!(r#"{{"n":{i}}}"#);
        let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, &body)).await.unwrap() else {
            panic!()
        };
        store
            .checkpoint(&id, c.token, "charge_created", LEASE)
            .await
            .unwrap();
        abandoned.push((id, body));
    }
    clock.advance(Duration::from_secs(300));
    let live = RecordKey::new(
        common::fresh_scope("completer-live"),
        IdempotencyKey::new("K").unwrap(),
    );
    assert!(matches!(
        store.claim(claim_req(&live, "{}")).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
    let service = Service {
        store: store.clone(),
        calls: AtomicU64::new(0),
    };
    let policy = RedrivePolicy::default();
    let report = complete_abandoned(&store, &service, Duration::from_secs(60), 100, &policy).await;
    assert_eq!(
        (
            report.attempted,
            report.completed,
            report.failed,
            report.marked
        ),
        (3, 3, 0, 0)
    );
    assert_eq!(service.calls.load(Ordering::SeqCst), 3);
    for (id, body) in &abandoned {
        match store.claim(claim_req(id, body)).await.unwrap() {
            ClaimOutcome::Replay { response, .. } => {
                assert_eq!(response.status, 201);
                assert_eq!(response.body, body.as_bytes());
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        store.get(&live).await.unwrap().unwrap().state_name(),
        "in_flight"
    );
    let again = complete_abandoned(&store, &service, Duration::from_secs(60), 100, &policy).await;
    assert_eq!(again, CompleterReport::default());
    for scope in abandoned
        .iter()
        .map(|(id, _)| &id.scope)
        .chain([&live.scope])
    {
        sqlx::query(DELETE_SCOPE)
            .bind(scope.as_str())
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// A re-drive whose service never finishes the request; counts the calls for one scope (a
/// shared database may hold other tests' leftovers).
struct Down(Scope, AtomicU64);

#[async_trait]
impl Redrive for Down {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        if record.scope == self.0 {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
        Err(RedriveError::Unreachable("connection refused".into()))
    }
}

/// The completer's attempt count lives in the database: three completers, each on its own
/// store (a process restarted between passes), give one record its 2 attempts in total and the
/// third marks it for a person; then no completer re-drives it again, the reaper counts it, and a
/// retry is answered `NeedsAttention`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completer_attempts_survive_a_restart() {
    let _serial = SERIAL.lock().await;
    forget_leftovers().await;
    // 1977: after completer_on_postgres's year, before every other test's leases (2000 on).
    let clock = ManualClock::new(T1975 + 2 * 365 * 86_400_000);
    if common::url().is_none() {
        return;
    }
    let id = RecordKey::new(
        common::fresh_scope("completer-restart"),
        IdempotencyKey::new("K").unwrap(),
    );
    let body = r#"{"restart":1}"#;
    {
        let store = common::store(clock.clone()).await.unwrap();
        let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, body)).await.unwrap() else {
            panic!()
        };
        store
            .checkpoint(&id, c.token, "payment_recorded", LEASE)
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(300));
    let policy = RedrivePolicy::new(2, Duration::from_secs(10), Duration::from_secs(10));
    let down = Down(id.scope.clone(), AtomicU64::new(0));
    for pass in 1..=3_u32 {
        // A new pool each time: nothing is remembered in memory between passes.
        let store = common::store(clock.clone()).await.unwrap();
        complete_abandoned(&store, &down, Duration::from_secs(60), 100_000, &policy).await;
        let rec = store.get(&id).await.unwrap().unwrap();
        assert_eq!(rec.redrives.attempts, pass.min(2), "pass {pass}");
        assert_eq!(rec.is_marked(), pass == 3, "pass {pass}");
        store.pool().close().await;
        clock.advance(Duration::from_secs(10));
    }
    assert_eq!(down.1.load(Ordering::SeqCst), 2);
    let store = common::store(clock.clone()).await.unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    assert!(rec.is_marked(), "{rec:?}");
    assert_eq!(rec.redrives.attempts, 2);
    let again = complete_abandoned(&store, &down, Duration::from_secs(60), 100_000, &policy).await;
    assert_eq!(again.marked, 0);
    assert_eq!(down.1.load(Ordering::SeqCst), 2);
    assert!(matches!(
        store.claim(claim_req(&id, body)).await.unwrap(),
        ClaimOutcome::NeedsAttention { attempts: 2, .. }
    ));
    let listed = store.list_marked(100_000).await.unwrap();
    assert!(listed.iter().any(|r| r.scope == id.scope));
    sqlx::query(DELETE_SCOPE)
        .bind(id.scope.as_str())
        .execute(store.pool())
        .await
        .unwrap();
}
