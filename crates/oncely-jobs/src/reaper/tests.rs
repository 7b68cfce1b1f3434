//! The reaper's tests, on the in-memory store.

use super::*;
use async_trait::async_trait;
use oncely_conformance::{RETENTION, claim_req, fresh_id, tricky_response};
use oncely_core::{ClaimOutcome, KeyStore, ManualClock, MemoryStore, RecordKey};
use std::sync::Mutex;

/// Counts reap calls and their batch sizes, to prove the batching.
struct CountingStore {
    inner: MemoryStore,
    reaps: Mutex<Vec<u64>>,
}

#[async_trait]
impl oncely_core::StoreWrapper for CountingStore {
    type Inner = MemoryStore;
    fn inner(&self) -> Result<&MemoryStore, StoreError> {
        Ok(&self.inner)
    }
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let r = self.inner.reap(batch).await?;
        self.reaps.lock().unwrap().push(r.deleted);
        Ok(r)
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// 25 completed records and 2 in-flight orphans past retention, 3 records inside it.
async fn populate(
    store: &dyn Maintenance,
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
    assert_eq!(report, ReapReport::new(27, 2, 0));
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
    let reaper = Reaper::new(store.clone(), Duration::from_secs(3600), 4)
        .with_pause(Duration::from_millis(1));
    let counters = reaper.counters();
    assert_eq!(counters.snapshot(), ReapReport::default());
    let handle = reaper.spawn(async {
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
    // The running totals are readable before the task stops, once its pass finished.
    while counters.snapshot().deleted < 27 {
        assert!(tokio::time::Instant::now() < deadline, "no running totals");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.send(()).unwrap();
    let totals = tokio::time::timeout(Duration::from_secs(5), handle)
        .await
        .expect("the reaper stops promptly on its signal")
        .unwrap();
    assert_eq!(totals, ReapReport::new(27, 2, 0));
    assert_eq!(counters.snapshot(), totals);
    for id in &kept {
        assert!(store.get(id).await.unwrap().is_some());
    }
}
