//! The [`Operator`] operations: what a person does to a record (list, release, resolve, retry),
//! each fenced like a store write. A store opts in with
//! [`operator_conformance_tests!`](crate::operator_conformance_tests) once it implements
//! [`Operator`].
//!
//! Each scenario runs its clock in the year 2006 (plus a random offset), later than every
//! other scenario's, and lists only its own fresh scope, so that on a shared database it only
//! ever touches its own records; it completes or releases what it leaves in flight.

use crate::fixtures::{LEASE, RETENTION, claim_req, expect_claimed, fresh_id, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, KeyStore, ManualClock, Operator, OperatorError, Record,
    RecordFilter, RecordKey, RecordState, RecordVersion, RedriveNote, Redrives, StoreError,
    StoredRequest, StoredResponse, UnixMillis,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A clock in the year 2006 (plus a random offset under 350 days).
fn clock_in_2006() -> ManualClock {
    let offset: UnixMillis = (uuid::Uuid::new_v4().as_u128() % 500_000) as i64 * 60_000;
    ManualClock::new(1_136_073_600_000 + offset)
}

/// Every record of `filter` (its scope set), page by page of `limit`, as `(scope, key)`s in
/// order; asserts that no page is longer than `limit`.
async fn list_all<S: Operator>(store: &S, filter: &RecordFilter, limit: usize) -> Vec<Record> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let page = store
            .list_records(filter, limit, cursor.as_deref())
            .await
            .unwrap();
        assert!(page.records.len() <= limit, "a page of at most the limit");
        out.extend(page.records);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return out,
        }
    }
    panic!("the listing never ended");
}

fn keys(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| r.key.as_str().to_owned()).collect()
}

fn in_scope(scope: &RecordKey, key: &str) -> RecordKey {
    RecordKey::new(
        scope.scope.clone(),
        oncely_core::IdempotencyKey::new(key).unwrap(),
    )
}

/// Claims `id`, lets its lease lapse and has the completer mark it (one attempt first), with
/// the recovery point `charge_created`. Returns the marked record.
async fn marked<S: Operator>(store: &S, clock: &ManualClock, id: &RecordKey, body: &str) -> Record {
    let c = expect_claimed(store.claim(claim_req(id, body)).await.unwrap());
    store
        .checkpoint(id, c.token, "charge_created", LEASE)
        .await
        .unwrap();
    clock.advance(LEASE);
    let backoff = Duration::from_secs(30);
    store
        .note_redrive(id, c.token, 0, RedriveNote::Attempt { backoff })
        .await
        .unwrap();
    store
        .note_redrive(id, c.token, 1, RedriveNote::Mark)
        .await
        .unwrap();
    let rec = store.get(id).await.unwrap().unwrap();
    assert!(rec.is_marked());
    rec
}

/// The listing's filters (marked, in flight, abandoned, scope, route, older than) combine with
/// AND, released records are never listed, and the cursor walks every record once in
/// `(scope, key)` order with pages of at most the limit.
pub async fn operator_lists_with_filters_and_pages<S, F, Fut>(make: &F)
where
    S: Operator,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2006();
    let store = skip_unless!(make, &clock);
    let base = fresh_id();
    let (a, b, c, d, e, f) = (
        in_scope(&base, "a-live"),
        in_scope(&base, "b-abandoned"),
        in_scope(&base, "c-marked"),
        in_scope(&base, "d-complete"),
        in_scope(&base, "e-released"),
        in_scope(&base, "f-refund"),
    );
    // The oldest claims first: c, then b, then the rest an hour later.
    let marked_c = marked(&store, &clock, &c, r#"{"c":1}"#).await;
    let cb = expect_claimed(store.claim(claim_req(&b, r#"{"b":1}"#)).await.unwrap());
    clock.advance(LEASE + Duration::from_secs(1));
    clock.advance(Duration::from_secs(3600));
    let ca = expect_claimed(store.claim(claim_req(&a, r#"{"a":1}"#)).await.unwrap());
    let cd = expect_claimed(store.claim(claim_req(&d, r#"{"d":1}"#)).await.unwrap());
    store
        .complete(&d, cd.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    let ce = expect_claimed(store.claim(claim_req(&e, r#"{"e":1}"#)).await.unwrap());
    store.release(&e, ce.token).await.unwrap();
    let refund = claim_req(&f, r#"{"f":1}"#).with_request(Some(StoredRequest::new(
        "POST",
        "/v1/refunds/re_1?expand=charge",
        vec![],
        b"{}".to_vec(),
    )));
    let cf = expect_claimed(store.claim(refund).await.unwrap());

    let scope = RecordFilter::default().with_scope(Some(base.scope.clone()));
    let all = list_all(&store, &scope, 100).await;
    assert_eq!(
        keys(&all),
        [
            "a-live",
            "b-abandoned",
            "c-marked",
            "d-complete",
            "f-refund"
        ],
        "every record but the released one, in key order"
    );
    assert_eq!(all[2], marked_c, "a listed record is the whole record");
    for limit in [1, 2, 3] {
        assert_eq!(
            keys(&list_all(&store, &scope, limit).await),
            keys(&all),
            "pages of {limit}"
        );
    }
    let first = store.list_records(&scope, 2, None).await.unwrap();
    assert_eq!(keys(&first.records), ["a-live", "b-abandoned"]);
    assert!(first.next.is_some(), "a full page has a next cursor");
    assert!(matches!(
        store.list_records(&scope, 2, Some("not a cursor")).await,
        Err(OperatorError::BadCursor)
    ));

    let only = |f: RecordFilter| f.with_scope(Some(base.scope.clone()));
    let cases: [(RecordFilter, &[&str]); 7] = [
        (
            only(RecordFilter::default().with_in_flight(true)),
            &["a-live", "b-abandoned", "c-marked", "f-refund"],
        ),
        (
            only(RecordFilter::default().with_marked(true)),
            &["c-marked"],
        ),
        (
            only(RecordFilter::default().with_abandoned(true)),
            &["b-abandoned"],
        ),
        (
            only(RecordFilter::default().with_route(Some("/v1/refunds".into()))),
            &["f-refund"],
        ),
        (
            only(RecordFilter::default().with_route(Some("/v1/payments".into()))),
            &["a-live", "b-abandoned", "c-marked"],
        ),
        (
            only(RecordFilter::default().with_older_than(Some(Duration::from_secs(1800)))),
            &["b-abandoned", "c-marked"],
        ),
        (
            only(
                RecordFilter::default()
                    .with_in_flight(true)
                    .with_older_than(Some(Duration::from_secs(1800)))
                    .with_marked(true),
            ),
            &["c-marked"],
        ),
    ];
    for (filter, want) in cases {
        assert_eq!(
            keys(&list_all(&store, &filter, 2).await),
            want,
            "{filter:?}"
        );
    }
    // Another scope's records are not listed under this one.
    let other = fresh_id();
    let filter = RecordFilter::default().with_scope(Some(other.scope.clone()));
    assert!(list_all(&store, &filter, 10).await.is_empty());

    for (id, token) in [
        (&a, ca.token),
        (&b, cb.token),
        (&c, marked_c.token),
        (&f, cf.token),
    ] {
        store.release(id, token).await.unwrap();
    }
}

/// `release_record` forgets a record: refused while the lease is live unless forced; forced,
/// it raises the fencing token first, so the owner still running the old claim can neither
/// renew nor complete it, and the next request with the key executes anew. A complete record
/// released no longer replays. Unknown records, a stale reading and a released record are
/// refused with their own errors, and nothing changes.
pub async fn operator_release_fences_the_old_owner<S, F, Fut>(make: &F)
where
    S: Operator,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2006();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let owner = expect_claimed(store.claim(claim_req(&id, r#"{"r":1}"#)).await.unwrap());
    let seen = store.get(&id).await.unwrap().unwrap();
    let v = RecordVersion::of(&seen);
    assert_eq!(v, RecordVersion::new(owner.token, "in_flight"));
    match store.release_record(&id, v, false).await {
        Err(OperatorError::LeaseLive { lease_expires_at }) => {
            assert_eq!(lease_expires_at, owner.lease_expires_at)
        }
        other => panic!("a live lease is refused without force, got {other:?}"),
    }
    assert_eq!(
        store.get(&id).await.unwrap().unwrap(),
        seen,
        "nothing changed"
    );
    let after = store.release_record(&id, v, true).await.unwrap();
    assert_eq!(after.state, RecordState::Released);
    assert_eq!(after.token.0, owner.token.0 + 1, "the token is raised");
    assert_eq!(after.request, None);
    assert_eq!(store.get(&id).await.unwrap().unwrap(), after);
    // The owner of the old claim is fenced off.
    assert!(matches!(
        store.renew(&id, owner.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store
            .complete(&id, owner.token, tricky_response(), RETENTION)
            .await,
        Err(StoreError::Fenced)
    ));
    // A second change from the same reading lost the race: the record changed.
    assert!(matches!(
        store.release_record(&id, v, true).await,
        Err(OperatorError::Changed {
            state: "released",
            ..
        })
    ));
    assert!(matches!(
        store
            .release_record(&id, RecordVersion::of(&after), true)
            .await,
        Err(OperatorError::NotAllowed {
            state: "released",
            ..
        })
    ));
    // The next request executes anew, with a token above every earlier one.
    let anew = expect_claimed(store.claim(claim_req(&id, r#"{"r":1}"#)).await.unwrap());
    assert_eq!(anew.kind, ClaimKind::New);
    assert!(anew.token > after.token);
    // A complete record released (no force needed) no longer replays.
    store
        .complete(&id, anew.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    let done = store.get(&id).await.unwrap().unwrap();
    store
        .release_record(&id, RecordVersion::of(&done), false)
        .await
        .unwrap();
    let again = expect_claimed(store.claim(claim_req(&id, r#"{"r":1}"#)).await.unwrap());
    assert_eq!(again.kind, ClaimKind::New);
    // A lapsed lease needs no force.
    clock.advance(LEASE);
    let lapsed = store.get(&id).await.unwrap().unwrap();
    store
        .release_record(&id, RecordVersion::of(&lapsed), false)
        .await
        .unwrap();
    // An unknown record.
    assert!(matches!(
        store
            .release_record(&fresh_id(), RecordVersion::of(&lapsed), true)
            .await,
        Err(OperatorError::NotFound)
    ));
}

/// `resolve_record` completes a marked record with the answer a person decided: every later
/// request with its key and fingerprint replays it byte for byte (a different fingerprint is
/// still a mismatch), it leaves the marked list, and the owner of the old claim cannot
/// complete it any more. A live lease is refused unless forced; a complete record is refused.
pub async fn operator_resolve_replays_the_decided_answer<S, F, Fut>(make: &F)
where
    S: Operator,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2006();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let rec = marked(&store, &clock, &id, r#"{"p":1}"#).await;
    assert!(matches!(
        store.claim(claim_req(&id, r#"{"p":1}"#)).await.unwrap(),
        ClaimOutcome::NeedsAttention { .. }
    ));
    let decided = tricky_response();
    clock.advance(Duration::from_secs(60));
    let resolved_at = clock.now_millis();
    let after = store
        .resolve_record(
            &id,
            RecordVersion::of(&rec),
            decided.clone(),
            RETENTION,
            false,
        )
        .await
        .unwrap();
    assert_eq!(after.token.0, rec.token.0 + 1);
    assert_eq!(
        after.state,
        RecordState::Complete {
            response: decided.clone(),
            completed_at: resolved_at
        }
    );
    assert_eq!(
        after.expires_at,
        resolved_at + i64::try_from(RETENTION.as_millis()).unwrap()
    );
    assert_eq!(after.request, None);
    assert!(!after.is_marked());
    assert_eq!(store.get(&id).await.unwrap().unwrap(), after);
    match store.claim(claim_req(&id, r#"{"p":1}"#)).await.unwrap() {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => {
            assert_eq!(response, decided);
            assert_eq!(completed_at, resolved_at);
        }
        other => panic!("the resolved answer replays, got {other:?}"),
    }
    assert_eq!(
        store.claim(claim_req(&id, r#"{"p":2}"#)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    assert!(matches!(
        store
            .complete(
                &id,
                rec.token,
                StoredResponse::new(500, vec![], vec![]),
                RETENTION
            )
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(
        !store
            .list_marked(1000)
            .await
            .unwrap()
            .iter()
            .any(|r| r.scope == id.scope)
    );
    assert!(matches!(
        store
            .resolve_record(
                &id,
                RecordVersion::of(&after),
                decided.clone(),
                RETENTION,
                true
            )
            .await,
        Err(OperatorError::NotAllowed {
            state: "complete",
            ..
        })
    ));

    // A live lease: refused, then forced (the running owner is fenced off).
    let live = fresh_id();
    let owner = expect_claimed(store.claim(claim_req(&live, "{}")).await.unwrap());
    let seen = RecordVersion::of(&store.get(&live).await.unwrap().unwrap());
    let answer = StoredResponse::new(402, vec![("x-decided".into(), b"yes".to_vec())], vec![]);
    assert!(matches!(
        store
            .resolve_record(&live, seen, answer.clone(), RETENTION, false)
            .await,
        Err(OperatorError::LeaseLive { .. })
    ));
    store
        .resolve_record(&live, seen, answer.clone(), RETENTION, true)
        .await
        .unwrap();
    assert!(matches!(
        store
            .complete(&live, owner.token, tricky_response(), RETENTION)
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.claim(claim_req(&live, "{}")).await.unwrap(),
        ClaimOutcome::Replay { response, .. } if response == answer
    ));
}

/// `retry_record` lifts the mark of a record that kept its request: it is abandoned work again
/// at once, with the attempt count given, no backoff and a raised token, and the completer's
/// next claim takes it over from its recovery point. A record that is not marked, or kept no
/// request, is refused.
pub async fn operator_retry_lifts_the_mark<S, F, Fut>(make: &F)
where
    S: Operator,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2006();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let rec = marked(&store, &clock, &id, r#"{"t":1}"#).await;
    let after = store
        .retry_record(&id, RecordVersion::of(&rec), 4)
        .await
        .unwrap();
    assert_eq!(after.redrives, Redrives::new(4, None, None));
    assert_eq!(after.token.0, rec.token.0 + 1);
    assert_eq!(
        after.request, rec.request,
        "the request is kept for the re-drive"
    );
    assert_eq!(after.recovery_point(), Some("charge_created"));
    assert_eq!(store.get(&id).await.unwrap().unwrap(), after);
    let abandoned = RecordFilter::default()
        .with_scope(Some(id.scope.clone()))
        .with_abandoned(true);
    assert_eq!(list_all(&store, &abandoned, 10).await, vec![after.clone()]);
    assert!(
        store
            .list_abandoned(Duration::ZERO, 1000)
            .await
            .unwrap()
            .iter()
            .any(|r| r.scope == id.scope),
        "the completer lists it again, without a backoff"
    );
    assert!(matches!(
        store.retry_record(&id, RecordVersion::of(&after), 4).await,
        Err(OperatorError::NotAllowed {
            state: "in_flight",
            ..
        })
    ));
    assert!(matches!(
        store.retry_record(&id, RecordVersion::of(&rec), 4).await,
        Err(OperatorError::Changed { .. })
    ));
    // The completer's re-drive takes it over, from its recovery point.
    let t = expect_claimed(store.claim(claim_req(&id, r#"{"t":1}"#)).await.unwrap());
    assert_eq!(t.kind, ClaimKind::Takeover);
    assert_eq!(t.recovery_point.as_deref(), Some("charge_created"));
    assert!(t.token > after.token);
    store
        .complete(&id, t.token, tricky_response(), RETENTION)
        .await
        .unwrap();

    // Marked without a request: nothing to re-drive.
    let bare = fresh_id();
    let mut req = claim_req(&bare, "{}");
    req.request = None;
    let c = expect_claimed(store.claim(req).await.unwrap());
    clock.advance(LEASE);
    store
        .note_redrive(&bare, c.token, 0, RedriveNote::Mark)
        .await
        .unwrap();
    let rec = store.get(&bare).await.unwrap().unwrap();
    assert!(matches!(
        store.retry_record(&bare, RecordVersion::of(&rec), 0).await,
        Err(OperatorError::NotAllowed { .. })
    ));
    store
        .release_record(&bare, RecordVersion::of(&rec), false)
        .await
        .unwrap();
}

/// Concurrent changes cannot both win: on each of several records, 8 owners' completions
/// (the current token) race 8 resolves made from the same reading; exactly one write lands
/// and the record holds its answer. Then 16 forced releases from one reading: one wins.
pub async fn operator_changes_race_completions<S, F, Fut>(make: &F)
where
    S: Operator,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = clock_in_2006();
    let store = Arc::new(skip_unless!(make, &clock));
    for round in 0..5 {
        let id = fresh_id();
        let owner = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
        let seen = RecordVersion::of(&store.get(&id).await.unwrap().unwrap());
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = store.clone();
            let id = id.clone();
            tasks.push(tokio::spawn(async move {
                let body = format!("{} {i}", if i % 2 == 0 { "owner" } else { "person" });
                let resp = StoredResponse::new(200, vec![], body.clone().into_bytes());
                let won = if i % 2 == 0 {
                    match store.complete(&id, owner.token, resp, RETENTION).await {
                        Ok(()) => true,
                        Err(StoreError::Fenced) => false,
                        Err(e) => panic!("complete: {e}"),
                    }
                } else {
                    match store.resolve_record(&id, seen, resp, RETENTION, true).await {
                        Ok(_) => true,
                        Err(OperatorError::Changed { .. }) => false,
                        Err(e) => panic!("resolve: {e}"),
                    }
                };
                won.then_some(body)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            if let Some(body) = t.await.unwrap() {
                winners.push(body);
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: one write lands, got {winners:?}"
        );
        match store.get(&id).await.unwrap().unwrap().state {
            RecordState::Complete { response, .. } => {
                assert_eq!(response.body, winners[0].as_bytes())
            }
            other => panic!("{other:?}"),
        }
    }
    let id = fresh_id();
    expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    let seen = RecordVersion::of(&store.get(&id).await.unwrap().unwrap());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            match store.release_record(&id, seen, true).await {
                Ok(_) => 1,
                Err(OperatorError::Changed { .. }) => 0,
                Err(e) => panic!("release: {e}"),
            }
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += t.await.unwrap();
    }
    assert_eq!(won, 1);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().token.0,
        seen.token.0 + 1,
        "raised once"
    );
}
