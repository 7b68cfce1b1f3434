//! The [`Maintenance`] operations (`docs/DESIGN.md`, "Replay window, retention, reaper and
//! completer"): the reaper, the abandoned list, the completer's attempts and the mark for a
//! person.
//!
//! Each scenario runs its clock in a year of its own (2000, 2002, 2004, plus a random offset),
//! so that on a shared database each only ever touches its own records.

use crate::fixtures::{LEASE, RETENTION, claim_req, expect_claimed, fresh_id, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, FencingToken, KeyStore, Maintenance, ManualClock, RecordKey,
    RedriveNote, Redrives, StoreError, UnixMillis,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A clock in the year 2000 (plus a random offset under 350 days), so that reaping only
/// reaches this scenario's records even in a shared database.
fn clock_in_2000() -> ManualClock {
    let offset: UnixMillis = (uuid::Uuid::new_v4().as_u128() % 500_000) as i64 * 60_000;
    ManualClock::new(946_684_800_000 + offset)
}

/// A clock in the year 2002 (plus a random offset): later than anything the reaper scenario's
/// clock (year 2000, plus at most 350 days and 2 hours) can reach, so that scenario, running at
/// the same time on a shared database, never deletes these records; and still long before any
/// real-time record's lease lapses, so the abandoned list only sees old records.
fn clock_in_2002() -> ManualClock {
    let offset: UnixMillis = (uuid::Uuid::new_v4().as_u128() % 500_000) as i64 * 60_000;
    ManualClock::new(1_009_843_200_000 + offset)
}

/// The reaper deletes exactly what is past retention, in bounded batches, and counts in-flight
/// orphans; nothing inside retention is removed.
pub async fn reaper_respects_retention_and_batches<S, F, Fut>(make: &F)
where
    S: Maintenance,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2000();
    let store = skip_unless!(make, &clock);
    let hour = Duration::from_secs(3600);
    let mut expiring = Vec::new();
    for _ in 0..5 {
        let id = fresh_id();
        let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
        store
            .complete(&id, c.token, tricky_response(), hour)
            .await
            .unwrap();
        expiring.push(id);
    }
    // An abandoned in-flight record whose retention also ends.
    let orphan = fresh_id();
    let mut req = claim_req(&orphan, "{}");
    req.retention = hour;
    expect_claimed(store.claim(req).await.unwrap());
    // A record well inside retention.
    let keep = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&keep, "{}")).await.unwrap());
    store
        .complete(&keep, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();

    clock.advance(2 * hour);
    let first = store.reap(4).await.unwrap();
    assert_eq!(first.deleted, 4, "a batch is bounded");
    let mut total = first;
    loop {
        let r = store.reap(4).await.unwrap();
        total.deleted += r.deleted;
        total.orphaned += r.orphaned;
        if r.deleted < 4 {
            break;
        }
    }
    assert!(total.deleted >= 6, "{total:?}");
    assert!(total.orphaned >= 1, "{total:?}");
    for id in expiring.iter().chain([&orphan]) {
        assert_eq!(store.get(id).await.unwrap(), None);
    }
    assert!(store.get(&keep).await.unwrap().is_some());
}

/// Abandoned in-flight records (lease lapsed past a grace) are listed for the completer,
/// oldest first; live and complete ones are not.
pub async fn list_abandoned_finds_lapsed_leases<S, F, Fut>(make: &F)
where
    S: Maintenance,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2002();
    let store = skip_unless!(make, &clock);
    let old = fresh_id();
    let c_old = expect_claimed(store.claim(claim_req(&old, r#"{"o":1}"#)).await.unwrap());
    store
        .checkpoint(&old, c_old.token, "payment_recorded", LEASE)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    let newer = fresh_id();
    expect_claimed(store.claim(claim_req(&newer, "{}")).await.unwrap());
    let done = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&done, "{}")).await.unwrap());
    store
        .complete(&done, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    // 60 s after the first claim: the old lease lapsed 30 s ago, the newer one 20 s ago.
    clock.advance(Duration::from_secs(50));
    let ours = |v: Vec<oncely_core::Record>| -> Vec<RecordKey> {
        v.into_iter()
            .map(|r| RecordKey::new(r.scope, r.key))
            .filter(|k| [&old, &newer, &done].contains(&k))
            .collect()
    };
    let listed = store
        .list_abandoned(Duration::from_secs(25), 1000)
        .await
        .unwrap();
    assert_eq!(ours(listed), vec![old.clone()]);
    let listed = store
        .list_abandoned(Duration::from_secs(5), 1000)
        .await
        .unwrap();
    let found = listed
        .iter()
        .find(|r| r.scope == old.scope)
        .expect("old listed");
    assert_eq!(found.recovery_point(), Some("payment_recorded"));
    assert_eq!(found.request, claim_req(&old, r#"{"o":1}"#).request);
    assert_eq!(ours(listed), vec![old.clone(), newer.clone()]);
}

/// A clock in the year 2004 (plus a random offset under 350 days): after everything the
/// abandoned-list scenario's clock (2002) reaches, so the completer scenarios' records never show
/// up in its listing and its records, whose leases lapsed long before, are simply filtered out
/// here; and never reached by the reaper scenario (2000).
fn clock_in_2004() -> ManualClock {
    let offset: UnixMillis = (uuid::Uuid::new_v4().as_u128() % 500_000) as i64 * 60_000;
    ManualClock::new(1_072_915_200_000 + offset)
}

fn only<'a>(ids: &'a [&'a RecordKey]) -> impl Fn(Vec<oncely_core::Record>) -> Vec<RecordKey> + 'a {
    move |v| {
        v.into_iter()
            .map(|r| RecordKey::new(r.scope, r.key))
            .filter(|k| ids.contains(&k))
            .collect()
    }
}

/// The completer's attempts are counted in the record by one compare-and-set: only on an
/// abandoned record (lease lapsed) with the current token and the attempt count the completer
/// saw, so 16 concurrent completers that listed the same record count exactly one attempt. The
/// backoff hides the record from the abandoned list until it ends; a takeover keeps the count
/// (the same request resumes), a new claim starts it again.
pub async fn redrive_attempts_are_counted_once_and_kept<S, F, Fut>(make: &F)
where
    S: Maintenance,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2004();
    let store = Arc::new(skip_unless!(make, &clock));
    let id = fresh_id();
    let ids = [&id];
    let ours = only(&ids);
    let c = expect_claimed(store.claim(claim_req(&id, r#"{"r":1}"#)).await.unwrap());
    store
        .checkpoint(&id, c.token, "payment_recorded", LEASE)
        .await
        .unwrap();
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().redrives,
        Redrives::default()
    );
    let attempt = RedriveNote::Attempt {
        backoff: Duration::from_secs(30),
    };
    // A live lease is not abandoned.
    assert!(matches!(
        store.note_redrive(&id, c.token, 0, attempt).await,
        Err(StoreError::Fenced)
    ));
    clock.advance(LEASE + Duration::from_secs(1));
    assert!(matches!(
        store
            .note_redrive(&id, FencingToken(c.token.0 - 1), 0, attempt)
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.note_redrive(&id, c.token, 1, attempt).await,
        Err(StoreError::Fenced)
    ));
    let now = clock.now_millis();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        let id = id.clone();
        let token = c.token;
        tasks.push(tokio::spawn(async move {
            store.note_redrive(&id, token, 0, attempt).await
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(r) => won.push(r),
            Err(StoreError::Fenced) => {}
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let first = Redrives::new(1, Some(now + 30_000), None);
    assert_eq!(won, vec![first], "exactly one of 16 counts the attempt");
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.redrives, first);
    assert_eq!(rec.recovery_point(), Some("payment_recorded"));
    assert_eq!(rec.token, c.token, "counting an attempt is not a claim");
    // Inside its backoff the record is not listed, after it it is.
    let list = || store.list_abandoned(Duration::ZERO, 1000);
    assert_eq!(ours(list().await.unwrap()), Vec::<RecordKey>::new());
    clock.advance(Duration::from_secs(30) - Duration::from_millis(1));
    assert_eq!(ours(list().await.unwrap()), Vec::<RecordKey>::new());
    clock.advance(Duration::from_millis(1));
    let listed = list().await.unwrap();
    let found = listed
        .iter()
        .find(|r| r.scope == id.scope)
        .expect("listed after its backoff");
    assert_eq!(found.redrives, first);
    // The re-drive takes the key over: the count stays with the record.
    let t = expect_claimed(store.claim(claim_req(&id, r#"{"r":1}"#)).await.unwrap());
    assert_eq!(t.kind, ClaimKind::Takeover);
    assert_eq!(store.get(&id).await.unwrap().unwrap().redrives, first);
    assert!(matches!(
        store.note_redrive(&id, t.token, 1, attempt).await,
        Err(StoreError::Fenced)
    ));
    clock.advance(LEASE);
    let second = store
        .note_redrive(
            &id,
            t.token,
            1,
            RedriveNote::Attempt {
                backoff: Duration::from_secs(60),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        second,
        Redrives::new(2, Some(clock.now_millis() + 60_000), None)
    );
    // A released key claimed again is a new request: nothing of the old count is left.
    store.release(&id, t.token).await.unwrap();
    let anew = expect_claimed(store.claim(claim_req(&id, r#"{"r":2}"#)).await.unwrap());
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().redrives,
        Redrives::default()
    );
    store.release(&id, anew.token).await.unwrap();
}

/// A record the completer marks for a person is never claimed again: every request with its
/// key and fingerprint is answered `NeedsAttention` (with the attempts and the recovery point),
/// however long ago its lease lapsed; another fingerprint is still a mismatch. It leaves the
/// abandoned list, is listed (oldest mark first) by `list_marked`, and refuses further notes.
/// Its owner, should it be alive after all, can still complete it (its token still holds): the
/// record then replays and is no longer marked.
pub async fn marked_record_is_never_claimed_again<S, F, Fut>(make: &F)
where
    S: Maintenance,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2004();
    let store = skip_unless!(make, &clock);
    let first = fresh_id();
    let second = fresh_id();
    let ids = [&first, &second];
    let ours = only(&ids);
    let c1 = expect_claimed(store.claim(claim_req(&first, r#"{"m":1}"#)).await.unwrap());
    store
        .checkpoint(&first, c1.token, "charge_created", LEASE)
        .await
        .unwrap();
    let c2 = expect_claimed(store.claim(claim_req(&second, r#"{"m":2}"#)).await.unwrap());
    clock.advance(LEASE);
    let attempt = RedriveNote::Attempt {
        backoff: Duration::from_secs(30),
    };
    let counted = store
        .note_redrive(&first, c1.token, 0, attempt)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(30));
    let marked_at = clock.now_millis();
    let marked = store
        .note_redrive(&first, c1.token, 1, RedriveNote::Mark)
        .await
        .unwrap();
    assert_eq!(
        marked,
        Redrives::new(counted.attempts, counted.next_attempt_at, Some(marked_at))
    );
    for note in [RedriveNote::Mark, attempt] {
        assert!(matches!(
            store.note_redrive(&first, c1.token, 1, note).await,
            Err(StoreError::Fenced)
        ));
    }
    let needs_attention = ClaimOutcome::NeedsAttention {
        marked_at,
        attempts: 1,
        recovery_point: Some("charge_created".into()),
    };
    assert_eq!(
        store.claim(claim_req(&first, r#"{"m":1}"#)).await.unwrap(),
        needs_attention
    );
    clock.advance(Duration::from_secs(6 * 3600));
    assert_eq!(
        store.claim(claim_req(&first, r#"{"m":1}"#)).await.unwrap(),
        needs_attention,
        "a lease that lapsed hours ago is still not taken over"
    );
    assert_eq!(
        store.claim(claim_req(&first, r#"{"m":9}"#)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    let rec = store.get(&first).await.unwrap().unwrap();
    assert!(rec.is_marked());
    assert_eq!(rec.token, c1.token);
    assert_eq!(rec.redrives, marked);
    // The second record, marked later (with no attempt: say it kept no request).
    let second_marked = store
        .note_redrive(&second, c2.token, 0, RedriveNote::Mark)
        .await
        .unwrap();
    assert_eq!(second_marked.attempts, 0);
    assert_eq!(
        ours(store.list_abandoned(Duration::ZERO, 1000).await.unwrap()),
        Vec::<RecordKey>::new(),
        "marked records are not abandoned work any more"
    );
    let listed = store.list_marked(1000).await.unwrap();
    let found = listed
        .iter()
        .find(|r| r.scope == first.scope)
        .expect("first listed");
    assert_eq!(found.redrives, marked);
    assert_eq!(found.recovery_point(), Some("charge_created"));
    assert_eq!(found.request, claim_req(&first, r#"{"m":1}"#).request);
    assert_eq!(ours(listed), vec![first.clone(), second.clone()]);
    // The owner finishes after all: a replay, and no longer marked.
    store
        .complete(&first, c1.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    assert!(matches!(
        store.claim(claim_req(&first, r#"{"m":1}"#)).await.unwrap(),
        ClaimOutcome::Replay { .. }
    ));
    assert!(!store.get(&first).await.unwrap().unwrap().is_marked());
    assert_eq!(
        ours(store.list_marked(1000).await.unwrap()),
        vec![second.clone()]
    );
    store
        .complete(&second, c2.token, tricky_response(), RETENTION)
        .await
        .unwrap();
}
