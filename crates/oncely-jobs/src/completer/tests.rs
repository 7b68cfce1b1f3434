//! The completer's tests, on the in-memory store, with stand-ins for the service.

use super::*;
use crate::reaper::reap_all;
use crate::redrive::RedriveError;
use async_trait::async_trait;
use oncely_conformance::{LEASE, RETENTION, WINDOW, claim_req, fresh_id};
use oncely_core::{
    ClaimOutcome, ClaimRequest, Clock, KeyStore, ManualClock, MemoryStore, StoredResponse,
};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
        let req = ClaimRequest::new(id.clone(), record.fingerprint, LEASE, WINDOW, RETENTION)
            .with_request(Some(request.clone()));
        match self.store.claim(req).await.unwrap() {
            ClaimOutcome::Claimed(c) => {
                self.resumed_from.lock().unwrap().push(c.recovery_point);
                let resp = StoredResponse::new(201, vec![], request.body.clone());
                self.store
                    .complete(&id, c.token, resp, RETENTION)
                    .await
                    .unwrap();
                Ok(201)
            }
            ClaimOutcome::InFlight { .. } => Ok(409),
            ClaimOutcome::Replay { response, .. } => Ok(response.status),
            ClaimOutcome::Mismatch => Ok(422),
            ClaimOutcome::NeedsAttention { .. } => Ok(409),
            other => panic!("unexpected {other:?}"),
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
    let ClaimOutcome::Claimed(ca) = store.claim(claim_req(&a, r#"{"n":1}"#)).await.unwrap() else {
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
    let policy = RedrivePolicy::default();
    let grace = Duration::from_secs(60);

    // The service is down: both attempts fail and are counted; the record without a
    // request cannot be re-driven at all and is marked for a person at once.
    let down = complete_abandoned(&*store, &Unreachable, grace, 100, &policy).await;
    assert_eq!(
        down,
        CompleterReport {
            attempted: 2,
            completed: 0,
            failed: 2,
            marked: 1
        }
    );
    for id in [&a, &b] {
        let r = store.get(id).await.unwrap().unwrap().redrives;
        assert_eq!(r.attempts, 1);
        assert_eq!(r.next_attempt_at, Some(clock.now_millis() + 30_000));
    }
    assert!(store.get(&bare).await.unwrap().unwrap().is_marked());

    let service = FakeService {
        store: store.clone(),
        calls: AtomicU64::new(0),
        resumed_from: Mutex::default(),
    };
    // Inside the 30 s backoff nothing is re-driven.
    clock.advance(Duration::from_secs(29));
    let early = complete_abandoned(&*store, &service, grace, 100, &policy).await;
    assert_eq!(early, CompleterReport::default());
    assert_eq!(service.calls.load(Ordering::SeqCst), 0);
    clock.advance(Duration::from_secs(1));
    let r = complete_abandoned(&*store, &service, grace, 100, &policy).await;
    assert_eq!(
        r,
        CompleterReport {
            attempted: 2,
            completed: 2,
            failed: 0,
            marked: 0
        }
    );
    assert_eq!(
        service.calls.load(Ordering::SeqCst),
        2,
        "no call for a record without a request"
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
    // A marked record is not listed again.
    let again = complete_abandoned(&*store, &service, grace, 100, &policy).await;
    assert_eq!(again, CompleterReport::default());
    // The limit bounds a pass.
    clock.advance(Duration::from_secs(3600));
    let limited = complete_abandoned(&*store, &service, grace, 1, &policy).await;
    assert_eq!(limited.attempted, 1);
}

/// A re-drive that never finishes the request.
struct AlwaysFails(AtomicU64);
#[async_trait]
impl Redrive for AlwaysFails {
    async fn redrive(&self, _: &Record) -> Result<u16, RedriveError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(RedriveError::Unreachable("connection refused".into()))
    }
}

#[tokio::test]
async fn completer_backs_off_then_gives_up_and_never_redrives_a_marked_record() {
    let clock = ManualClock::starting_now();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let id = fresh_id();
    let ClaimOutcome::Claimed(c) = store.claim(claim_req(&id, r#"{"x":1}"#)).await.unwrap() else {
        panic!()
    };
    store
        .checkpoint(&id, c.token, "payment_recorded", LEASE)
        .await
        .unwrap();
    clock.advance(LEASE);
    let policy = RedrivePolicy::new(3, Duration::from_secs(10), Duration::from_secs(15));
    assert_eq!(
        (1..=4).map(|n| policy.backoff(n)).collect::<Vec<_>>(),
        [10, 15, 15, 15].map(Duration::from_secs)
    );
    let service = AlwaysFails(AtomicU64::new(0));
    let pass = || complete_abandoned(&*store, &service, Duration::ZERO, 10, &policy);
    let t0 = clock.now_millis();
    // Attempts at t0, t0 + 10 s and t0 + 25 s (pauses 10 s, 15 s, 15 s); nothing between.
    // Every pass is a fresh call: the count lives in the store only, as it would across a
    // restart of the process that runs the completer.
    for (at, attempts) in [(0, 1), (10_000, 2), (25_000, 3)] {
        clock.advance(Duration::from_millis(
            (t0 + at - 1 - clock.now_millis()).max(0) as u64,
        ));
        if at > 0 {
            assert_eq!(pass().await, CompleterReport::default(), "backoff at {at}");
        }
        clock.advance(Duration::from_millis((t0 + at - clock.now_millis()) as u64));
        let r = pass().await;
        assert_eq!((r.attempted, r.failed, r.marked), (1, 1, 0), "at {at}");
        assert_eq!(
            store.get(&id).await.unwrap().unwrap().redrives.attempts,
            attempts
        );
    }
    clock.advance(Duration::from_millis(14_999));
    assert_eq!(pass().await, CompleterReport::default());
    clock.advance(Duration::from_millis(1));
    let gave_up = pass().await;
    assert_eq!(
        gave_up,
        CompleterReport {
            marked: 1,
            ..CompleterReport::default()
        }
    );
    assert_eq!(
        service.0.load(Ordering::SeqCst),
        3,
        "three attempts, no more"
    );
    let rec = store.get(&id).await.unwrap().unwrap();
    assert!(rec.is_marked());
    assert_eq!(rec.redrives.attempts, 3);
    assert_eq!(rec.redrives.marked_at, Some(clock.now_millis()));
    // Never again: not re-driven, and a client retry is answered "needs attention".
    clock.advance(Duration::from_secs(3600));
    assert_eq!(pass().await, CompleterReport::default());
    assert_eq!(service.0.load(Ordering::SeqCst), 3);
    assert_eq!(
        store.claim(claim_req(&id, r#"{"x":1}"#)).await.unwrap(),
        ClaimOutcome::NeedsAttention {
            marked_at: rec.redrives.marked_at.unwrap(),
            attempts: 3,
            recovery_point: Some("payment_recorded".into()),
        }
    );
    // The reaper logs it on every pass, and counts it.
    for _ in 0..2 {
        let r = reap_all(&*store, 100, Duration::ZERO).await.unwrap();
        assert_eq!(r.marked, 1);
        assert_eq!(r.deleted, 0);
    }
    // Past retention it is reaped like any orphan, and no longer counted.
    clock.advance(RETENTION);
    let r = reap_all(&*store, 100, Duration::ZERO).await.unwrap();
    assert_eq!((r.deleted, r.orphaned, r.marked), (1, 1, 0));
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
    let completer = Completer::new(
        store.clone(),
        service.clone(),
        Duration::from_millis(5),
        Duration::from_secs(60),
        2,
    );
    let counters = completer.counters();
    let handle = completer.spawn(async move {
        stopped.wait_for(|s| *s).await.ok();
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while counters.snapshot().completed < 5 {
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
    let five = CompleterReport {
        attempted: 5,
        completed: 5,
        failed: 0,
        marked: 0,
    };
    assert_eq!(totals, five);
    assert_eq!(counters.snapshot(), five);
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

/// A re-drive that takes until the test lets it go, and says when it started.
struct Gated {
    started: tokio::sync::mpsc::UnboundedSender<()>,
    go: tokio::sync::Semaphore,
    calls: AtomicU64,
}
#[async_trait]
impl Redrive for Gated {
    async fn redrive(&self, _: &Record) -> Result<u16, RedriveError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.started.send(()).ok();
        self.go.acquire().await.expect("open").forget();
        Err(RedriveError::Unreachable("shutting down".into()))
    }
}

#[tokio::test]
async fn completer_stops_between_records_on_signal() {
    let clock = ManualClock::starting_now();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    for _ in 0..3 {
        assert!(matches!(
            store.claim(claim_req(&fresh_id(), "{}")).await.unwrap(),
            ClaimOutcome::Claimed(_)
        ));
    }
    clock.advance(Duration::from_secs(120));
    let (started, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let service = Arc::new(Gated {
        started,
        go: tokio::sync::Semaphore::new(0),
        calls: AtomicU64::new(0),
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = Completer::new(
        store.clone(),
        service.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(60),
        10,
    )
    .spawn(async {
        stopped.await.ok();
    });
    // The signal arrives while the first re-drive runs: that one is finished, no other
    // starts.
    started_rx.recv().await.unwrap();
    stop.send(()).unwrap();
    service.go.add_permits(10);
    let totals = tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .expect("the completer stops on its signal")
        .unwrap();
    assert_eq!(service.calls.load(Ordering::SeqCst), 1);
    assert_eq!((totals.attempted, totals.failed), (1, 1));
}
