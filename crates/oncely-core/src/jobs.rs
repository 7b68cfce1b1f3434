//! The background jobs, generic over any [`KeyStore`] (feature `jobs`).
//!
//! - The **reaper** deletes records whose retention ended, in bounded batches with a pause
//!   between them, so that it never holds a store's locks (or its mutex) for long and claims
//!   keep flowing while it runs. It logs in-flight records it deleted (orphans: requests that
//!   were abandoned and never finished, whose effects may be half-done).
//! - The **completer** finds abandoned in-flight requests (lease lapsed at least a grace period
//!   ago) and re-drives each stored request through the service with the same key, through a
//!   [`Redrive`] implementation (the CLI's is an HTTP call to the server with the same
//!   `Idempotency-Key` and the scope's credentials). The service then takes the key over,
//!   resumes from the recovery point and stores the final response, exactly as a client retry
//!   would.
//!
//! Both run once ([`reap_all`], [`complete_abandoned`]) or as in-process tokio tasks
//! ([`Reaper`], [`Completer`]).
//!
//! # How the tasks stop
//!
//! [`Reaper::spawn`] and [`Completer::spawn`] take a `shutdown` future, like axum's graceful
//! shutdown: any `Future<Output = ()>` works, e.g. `token.cancelled_owned()` of a
//! `tokio_util::sync::CancellationToken`, `async { rx.await.ok(); }` for a
//! `tokio::sync::oneshot::Receiver`, or a `tokio::sync::watch` change. The task checks it only
//! *between* store operations (while sleeping between batches and between passes), never in
//! the middle of one, so a stop never abandons a database statement halfway; it then returns
//! the totals of everything it did through its [`JoinHandle`]. Aborting the handle instead
//! also stops it, at the cost of possibly dropping an operation in flight (every store
//! operation is atomic, so nothing is left half-written either way).
//!
//! ```
//! use oncely_core::jobs::Reaper;
//! use oncely_core::{KeyStore, MemoryStore};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let reaper = Reaper::new(store, Duration::from_secs(60), 1_000)
//!     .spawn(async { stopped.await.ok(); });
//! // ... serve requests ...
//! stop.send(()).ok();
//! let totals = reaper.await.unwrap();
//! assert_eq!(totals.deleted, 0);
//! # });
//! ```

use crate::record::{Record, RecordState};
use crate::store::{KeyStore, ReapReport, StoreError};
use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The pause between reaper batches when none is given: 10 milliseconds, enough for waiting
/// claims to get the connection, the rows or the mutex between two batches.
pub const DEFAULT_REAP_PAUSE: Duration = Duration::from_millis(10);

/// Reaps everything past retention: calls [`KeyStore::reap`] with `batch` (0 is raised to 1)
/// until a call deletes fewer than `batch` records, sleeping `pause` between calls so that
/// claims are never blocked for longer than one batch. Logs (at `warn`) every batch that
/// deleted in-flight orphans.
///
/// Returns the totals.
///
/// # Errors
///
/// The first [`StoreError`] of a batch; records deleted by earlier batches stay deleted (each
/// batch is atomic on its own), and a later call simply continues.
pub async fn reap_all(
    store: &dyn KeyStore,
    batch: usize,
    pause: Duration,
) -> Result<ReapReport, StoreError> {
    let mut shutdown = std::pin::pin!(std::future::pending::<()>());
    reap_pass(store, batch, pause, &mut shutdown)
        .await
        .map(|(report, _)| report)
}

/// One reaper pass; stops early (between batches) when `shutdown` completes. Returns the
/// totals and whether it was stopped.
async fn reap_pass<F: Future<Output = ()>>(
    store: &dyn KeyStore,
    batch: usize,
    pause: Duration,
    shutdown: &mut std::pin::Pin<&mut F>,
) -> Result<(ReapReport, bool), StoreError> {
    let batch = batch.max(1);
    let mut total = ReapReport::default();
    loop {
        let r = store.reap(batch).await?;
        total.deleted += r.deleted;
        total.orphaned += r.orphaned;
        if r.orphaned > 0 {
            tracing::warn!(
                orphaned = r.orphaned,
                deleted = r.deleted,
                "reaper deleted in-flight records past retention: their requests were abandoned \
                 and never finished, and may have left a half-done effect"
            );
        }
        if r.deleted < batch as u64 {
            return Ok((total, false));
        }
        tokio::select! {
            () = shutdown.as_mut() => return Ok((total, true)),
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The reaper as an in-process tokio task: a pass of [`reap_all`] at start and then every
/// `every` (measured from the end of one pass to the start of the next).
///
/// See the [module docs](self) for how it stops.
#[derive(Clone)]
pub struct Reaper {
    store: Arc<dyn KeyStore>,
    every: Duration,
    batch: usize,
    pause: Duration,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("every", &self.every)
            .field("batch", &self.batch)
            .field("pause", &self.pause)
            .finish_non_exhaustive()
    }
}

impl Reaper {
    /// A reaper over `store` that runs a pass every `every`, deleting up to `batch` records per
    /// store call, pausing [`DEFAULT_REAP_PAUSE`] (10 milliseconds) between calls.
    pub fn new(store: Arc<dyn KeyStore>, every: Duration, batch: usize) -> Self {
        Self {
            store,
            every,
            batch,
            pause: DEFAULT_REAP_PAUSE,
        }
    }

    /// Sets the pause between batches of one pass.
    #[must_use]
    pub fn with_pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Runs passes until `shutdown` completes; returns the totals. A failed pass is logged (at
    /// `warn`) and retried at the next tick: the reaper never gives up on its own.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> ReapReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = ReapReport::default();
        loop {
            match reap_pass(&*self.store, self.batch, self.pause, &mut shutdown).await {
                Ok((r, stopped)) => {
                    total.deleted += r.deleted;
                    total.orphaned += r.orphaned;
                    if r.deleted > 0 {
                        tracing::info!(
                            deleted = r.deleted,
                            orphaned = r.orphaned,
                            "reaper pass done"
                        );
                    }
                    if stopped {
                        return total;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reaper pass failed; retrying next tick"),
            }
            tokio::select! {
                () = shutdown.as_mut() => return total,
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// Spawns [`Reaper::run`] on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<ReapReport> {
        tokio::spawn(self.run(shutdown))
    }
}

/// Why a re-drive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// The record kept no request (its claim carried `request: None`), so there is nothing to
    /// re-drive.
    #[error("the record kept no request to re-drive")]
    NoRequest,
    /// The service could not be reached or did not answer.
    #[error("the service could not be reached: {0}")]
    Unreachable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The scope's credentials could not be obtained.
    #[error("no credentials for scope {0}")]
    NoCredentials(String),
}

/// Re-drives one abandoned request through the service with the same key.
///
/// The CLI's implementation sends [`Record::request`] over HTTP to the server with the same
/// `Idempotency-Key` and the scope's credentials; the server's layer then takes the key over
/// (the lease lapsed), resumes at the recovery point, and stores the final response.
#[async_trait]
pub trait Redrive: Send + Sync {
    /// Sends the request; returns the HTTP status the service answered.
    ///
    /// # Errors
    ///
    /// [`RedriveError`] when the request could not be sent or answered.
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError>;
}

/// What one completer pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompleterReport {
    /// Abandoned records found and re-driven (or skipped for lack of a stored request).
    pub attempted: u64,
    /// Of those, records that are no longer in flight after their re-drive (complete, released
    /// or gone).
    pub completed: u64,
    /// Of those, records whose re-drive failed or that are still in flight afterwards (for
    /// instance the service answered `409` because another request took the key over first);
    /// the next pass tries them again.
    pub failed: u64,
}

/// Lists up to `limit` abandoned records (in flight, lease lapsed at least `grace` ago, oldest
/// first) and re-drives each through `redrive`, one at a time. A record counts as completed
/// when, after its re-drive answered, the store no longer holds it in flight. Failures are
/// logged (at `warn`) and counted, never returned: one bad record does not stop the others.
///
/// A store error while listing is logged and yields an empty report.
pub async fn complete_abandoned(
    store: &dyn KeyStore,
    redrive: &dyn Redrive,
    grace: Duration,
    limit: usize,
) -> CompleterReport {
    let mut report = CompleterReport::default();
    let records = match store.list_abandoned(grace, limit).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "completer could not list abandoned records");
            return report;
        }
    };
    for record in records {
        report.attempted += 1;
        let id = crate::key::RecordKey::new(record.scope.clone(), record.key.clone());
        if record.request.is_none() {
            tracing::warn!(scope = %record.scope, key = %record.key,
                "abandoned record kept no request; it cannot be re-driven and will be reaped");
            report.failed += 1;
            continue;
        }
        let status = match redrive.redrive(&record).await {
            Ok(status) => status,
            Err(e) => {
                tracing::warn!(scope = %record.scope, key = %record.key, error = %e,
                    "re-drive failed");
                report.failed += 1;
                continue;
            }
        };
        match store.get(&id).await {
            Ok(Some(Record {
                state: RecordState::InFlight { .. },
                ..
            })) => {
                tracing::warn!(scope = %record.scope, key = %record.key, status,
                    "re-driven request is still in flight");
                report.failed += 1;
            }
            Ok(_) => {
                tracing::info!(scope = %record.scope, key = %record.key, status,
                    recovery_point = record.recovery_point(), "completed abandoned request");
                report.completed += 1;
            }
            Err(e) => {
                tracing::warn!(scope = %record.scope, key = %record.key, error = %e,
                    "could not read the record after its re-drive");
                report.failed += 1;
            }
        }
    }
    report
}

/// The completer as an in-process tokio task: a pass of [`complete_abandoned`] at start and
/// then every `every` (from the end of one pass to the start of the next).
///
/// See the [module docs](self) for how it stops; it checks `shutdown` only between passes, so
/// a re-drive in progress is finished first.
#[derive(Clone)]
pub struct Completer {
    store: Arc<dyn KeyStore>,
    redrive: Arc<dyn Redrive>,
    every: Duration,
    grace: Duration,
    limit: usize,
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer")
            .field("every", &self.every)
            .field("grace", &self.grace)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Completer {
    /// A completer over `store` that re-drives through `redrive`, every `every`, the records
    /// whose lease lapsed at least `grace` ago, up to `limit` per pass.
    ///
    /// Choose `grace` longer than a client's whole retry schedule, so that a client still
    /// retrying gets the first chance to resume its own request.
    pub fn new(
        store: Arc<dyn KeyStore>,
        redrive: Arc<dyn Redrive>,
        every: Duration,
        grace: Duration,
        limit: usize,
    ) -> Self {
        Self {
            store,
            redrive,
            every,
            grace,
            limit,
        }
    }

    /// Runs passes until `shutdown` completes; returns the totals.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> CompleterReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = CompleterReport::default();
        loop {
            let r = complete_abandoned(&*self.store, &*self.redrive, self.grace, self.limit).await;
            total.attempted += r.attempted;
            total.completed += r.completed;
            total.failed += r.failed;
            tokio::select! {
                () = shutdown.as_mut() => return total,
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// Spawns [`Completer::run`] on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<CompleterReport> {
        tokio::spawn(self.run(shutdown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::conformance::{LEASE, RETENTION, claim_req, fresh_id, tricky_response};
    use crate::key::RecordKey;
    use crate::record::{FencingToken, StoredResponse, UnixMillis};
    use crate::store::memory::MemoryStore;
    use crate::store::{ClaimOutcome, ClaimRequest};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts reap calls and their batch sizes, to prove the batching.
    struct CountingStore {
        inner: MemoryStore,
        reaps: Mutex<Vec<u64>>,
    }
    use std::sync::Mutex;

    #[async_trait]
    impl KeyStore for CountingStore {
        async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
            self.inner.claim(req).await
        }
        async fn renew(
            &self,
            id: &RecordKey,
            token: FencingToken,
            lease: Duration,
        ) -> Result<UnixMillis, StoreError> {
            self.inner.renew(id, token, lease).await
        }
        async fn checkpoint(
            &self,
            id: &RecordKey,
            token: FencingToken,
            rp: &str,
            lease: Duration,
        ) -> Result<(), StoreError> {
            self.inner.checkpoint(id, token, rp, lease).await
        }
        async fn complete(
            &self,
            id: &RecordKey,
            token: FencingToken,
            response: StoredResponse,
            retention: Duration,
        ) -> Result<(), StoreError> {
            self.inner.complete(id, token, response, retention).await
        }
        async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
            self.inner.release(id, token).await
        }
        async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
            self.inner.get(id).await
        }
        async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
            let r = self.inner.reap(batch).await?;
            self.reaps.lock().unwrap().push(r.deleted);
            Ok(r)
        }
        async fn list_abandoned(
            &self,
            grace: Duration,
            limit: usize,
        ) -> Result<Vec<Record>, StoreError> {
            self.inner.list_abandoned(grace, limit).await
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// 25 completed records and 2 in-flight orphans past retention, 3 records inside it.
    async fn populate(
        store: &dyn KeyStore,
        clock: &ManualClock,
    ) -> (Vec<RecordKey>, Vec<RecordKey>) {
        let mut doomed = Vec::new();
        for _ in 0..25 {
            let id = fresh_id();
            let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, "{}")).await.unwrap() else {
                panic!()
            };
            store
                .complete(&id, c.token, tricky_response(), HOUR)
                .await
                .unwrap();
            doomed.push(id);
        }
        for _ in 0..2 {
            let id = fresh_id();
            let mut req = claim_req(&id, "{}");
            req.retention = HOUR;
            assert!(matches!(
                store.claim(req).await.unwrap(),
                ClaimOutcome::Claimed(_)
            ));
            doomed.push(id);
        }
        let mut kept = Vec::new();
        for _ in 0..3 {
            let id = fresh_id();
            let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, "{}")).await.unwrap() else {
                panic!()
            };
            store
                .complete(&id, c.token, tricky_response(), RETENTION)
                .await
                .unwrap();
            kept.push(id);
        }
        clock.advance(2 * HOUR);
        (doomed, kept)
    }

    #[tokio::test]
    async fn reap_all_deletes_in_bounded_batches() {
        let clock = ManualClock::starting_now();
        let store = CountingStore {
            inner: MemoryStore::with_clock(Arc::new(clock.clone())),
            reaps: Mutex::default(),
        };
        let (doomed, kept) = populate(&store, &clock).await;
        let report = reap_all(&store, 10, Duration::ZERO).await.unwrap();
        assert_eq!(
            report,
            ReapReport {
                deleted: 27,
                orphaned: 2
            }
        );
        assert_eq!(*store.reaps.lock().unwrap(), vec![10, 10, 7]);
        for id in &doomed {
            assert_eq!(store.get(id).await.unwrap(), None);
        }
        for id in &kept {
            assert!(store.get(id).await.unwrap().is_some());
        }
        // An exact multiple of the batch needs one more (empty) call to know it is done.
        let report = reap_all(&store, 3, Duration::ZERO).await.unwrap();
        assert_eq!(report, ReapReport::default());
    }

    #[tokio::test]
    async fn reaper_task_reaps_then_stops_on_signal() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let (doomed, kept) = populate(&*store, &clock).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A long period: after its first pass the task sleeps, and the stop signal must wake it.
        let handle = Reaper::new(store.clone(), Duration::from_secs(3600), 4)
            .with_pause(Duration::from_millis(1))
            .spawn(async {
                stopped.await.ok();
            });
        // Wait for the first pass to finish (every doomed record gone).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut left = 0;
            for id in &doomed {
                left += usize::from(store.get(id).await.unwrap().is_some());
            }
            if left == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "reaper did not run");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(()).unwrap();
        let totals = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the reaper stops promptly on its signal")
            .unwrap();
        assert_eq!(
            totals,
            ReapReport {
                deleted: 27,
                orphaned: 2
            }
        );
        for id in &kept {
            assert!(store.get(id).await.unwrap().is_some());
        }
    }

    /// A stand-in for the service behind the CLI's HTTP re-drive: it takes the key over through
    /// the store (as the layer would), "resumes", and completes with 201.
    struct FakeService {
        store: Arc<MemoryStore>,
        calls: AtomicU64,
        resumed_from: Mutex<Vec<Option<String>>>,
    }

    #[async_trait]
    impl Redrive for FakeService {
        async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let request = record.request.as_ref().ok_or(RedriveError::NoRequest)?;
            let id = RecordKey::new(record.scope.clone(), record.key.clone());
            let req = ClaimRequest {
                id: id.clone(),
                fingerprint: record.fingerprint,
                lease: LEASE,
                replay_window: crate::conformance::WINDOW,
                retention: RETENTION,
                request: Some(request.clone()),
            };
            match self.store.claim(req).await.unwrap() {
                ClaimOutcome::Claimed(c) => {
                    self.resumed_from.lock().unwrap().push(c.recovery_point);
                    let resp = StoredResponse {
                        status: 201,
                        headers: vec![],
                        body: request.body.clone(),
                        body_retained: true,
                        trailers: Vec::new(),
                    };
                    self.store
                        .complete(&id, c.token, resp, RETENTION)
                        .await
                        .unwrap();
                    Ok(201)
                }
                ClaimOutcome::InFlight { .. } => Ok(409),
                ClaimOutcome::Replay { response, .. } => Ok(response.status),
                ClaimOutcome::Mismatch => Ok(422),
            }
        }
    }

    struct Unreachable;
    #[async_trait]
    impl Redrive for Unreachable {
        async fn redrive(&self, _: &Record) -> Result<u16, RedriveError> {
            Err(RedriveError::Unreachable("connection refused".into()))
        }
    }

    #[tokio::test]
    async fn completer_redrives_abandoned_requests_only() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        // Two requests abandoned mid-way (one after a committed phase), one without a stored
        // request, then (later) one whose lease lapsed too recently and one alive.
        let a = fresh_id();
        let ClaimOutcome::Claimed(ca) = store.claim(claim_req(&a, r#"{"n":1}"#)).await.unwrap()
        else {
            panic!()
        };
        store
            .checkpoint(&a, ca.token, "charge_created", LEASE)
            .await
            .unwrap();
        // One second apart, so "oldest lease first" has one right answer.
        clock.advance(Duration::from_secs(1));
        let b = fresh_id();
        assert!(matches!(
            store.claim(claim_req(&b, r#"{"n":2}"#)).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        let bare = fresh_id();
        let mut req = claim_req(&bare, "{}");
        req.request = None;
        assert!(matches!(
            store.claim(req).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        clock.advance(Duration::from_secs(90));
        let recent = fresh_id();
        assert!(matches!(
            store.claim(claim_req(&recent, "{}")).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
        clock.advance(Duration::from_secs(40)); // recent: lapsed 10 s ago; a, b: 100 s ago
        let alive = fresh_id();
        assert!(matches!(
            store.claim(claim_req(&alive, "{}")).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));

        // The service is down: every attempt fails, nothing changes.
        let down = complete_abandoned(&*store, &Unreachable, Duration::from_secs(60), 100).await;
        assert_eq!(
            down,
            CompleterReport {
                attempted: 3,
                completed: 0,
                failed: 3
            }
        );

        let service = FakeService {
            store: store.clone(),
            calls: AtomicU64::new(0),
            resumed_from: Mutex::default(),
        };
        let r = complete_abandoned(&*store, &service, Duration::from_secs(60), 100).await;
        assert_eq!(
            r,
            CompleterReport {
                attempted: 3,
                completed: 2,
                failed: 1
            }
        );
        assert_eq!(
            service.calls.load(Ordering::SeqCst),
            2,
            "no call without a request"
        );
        assert_eq!(
            *service.resumed_from.lock().unwrap(),
            vec![Some("charge_created".to_owned()), None],
            "oldest lease first, resumed at its recovery point"
        );
        for (id, body) in [(&a, r#"{"n":1}"#), (&b, r#"{"n":2}"#)] {
            match store.claim(claim_req(id, body)).await.unwrap() {
                ClaimOutcome::Replay { response, .. } => {
                    assert_eq!(response.status, 201);
                    assert_eq!(response.body, body.as_bytes());
                }
                other => panic!("{other:?}"),
            }
        }
        for id in [&recent, &alive, &bare] {
            assert_eq!(
                store.get(id).await.unwrap().unwrap().state_name(),
                "in_flight"
            );
        }
        // A second pass finds only the record it cannot re-drive.
        let again = complete_abandoned(&*store, &service, Duration::from_secs(60), 100).await;
        assert_eq!(
            again,
            CompleterReport {
                attempted: 1,
                completed: 0,
                failed: 1
            }
        );
        // The limit bounds a pass.
        clock.advance(Duration::from_secs(3600));
        let limited = complete_abandoned(&*store, &service, Duration::from_secs(60), 2).await;
        assert_eq!(limited.attempted, 2);
    }

    #[tokio::test]
    async fn completer_task_runs_and_stops_on_signal() {
        let clock = ManualClock::starting_now();
        let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
        let ids: Vec<RecordKey> = (0..5).map(|_| fresh_id()).collect();
        for id in &ids {
            assert!(matches!(
                store.claim(claim_req(id, "{}")).await.unwrap(),
                ClaimOutcome::Claimed(_)
            ));
        }
        clock.advance(Duration::from_secs(120));
        let service = Arc::new(FakeService {
            store: store.clone(),
            calls: AtomicU64::new(0),
            resumed_from: Mutex::default(),
        });
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let handle = Completer::new(
            store.clone(),
            service.clone(),
            Duration::from_millis(5),
            Duration::from_secs(60),
            2,
        )
        .spawn(async move {
            stopped.wait_for(|s| *s).await.ok();
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while service.calls.load(Ordering::SeqCst) < 5 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "completer did not run"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(true).unwrap();
        let totals = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the completer stops promptly on its signal")
            .unwrap();
        assert_eq!(
            totals,
            CompleterReport {
                attempted: 5,
                completed: 5,
                failed: 0
            }
        );
        assert_eq!(
            service.calls.load(Ordering::SeqCst),
            5,
            "each record re-driven once"
        );
        for id in &ids {
            assert_eq!(
                store.get(id).await.unwrap().unwrap().state_name(),
                "complete"
            );
        }
    }
}
