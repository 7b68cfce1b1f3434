//! Leases and fencing tokens (`docs/DESIGN.md`, "Leases and fencing tokens"): a takeover
//! fences the old owner, a zero lease is still a lease, concurrent stale writes.

use crate::fixtures::{LEASE, RETENTION, claim_req, expect_claimed, fresh_id, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, FencingToken, KeyStore, ManualClock, RecordState, StoreError,
    StoredResponse,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// An owner that stops renewing loses the claim after the lease; the new owner gets a larger
/// token and the recovery point; every write with the stale token is rejected and changes
/// nothing (docs/DESIGN.md, "Crashed owner", and the paused owner of "Why a lease
/// needs a fencing token").
pub async fn lease_takeover_fences_old_owner<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let old = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    store
        .checkpoint(&id, old.token, "charge_created", LEASE)
        .await
        .unwrap();
    // The checkpoint renewed the lease: 29 s later it is still alive.
    clock.advance(Duration::from_secs(29));
    assert!(matches!(
        store.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    clock.advance(Duration::from_secs(2));
    let new = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    assert_eq!(new.kind, ClaimKind::Takeover);
    assert!(new.token > old.token, "{new:?} must outrank {old:?}");
    assert_eq!(new.recovery_point.as_deref(), Some("charge_created"));
    assert_eq!(new.lease_expires_at, clock.now_millis() + 30_000);

    // The old owner wakes up: every write is fenced.
    assert!(matches!(
        store.renew(&id, old.token, LEASE).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.checkpoint(&id, old.token, "late", LEASE).await,
        Err(StoreError::Fenced)
    ));
    let stale = StoredResponse::new(500, vec![], b"stale".to_vec());
    assert!(matches!(
        store
            .complete(&id, old.token, stale.clone(), RETENTION)
            .await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.release(&id, old.token).await,
        Err(StoreError::Fenced)
    ));
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.token, new.token);
    assert_eq!(rec.recovery_point(), Some("charge_created"));

    store
        .complete(&id, new.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    // After completion even the current token cannot write again.
    assert!(matches!(
        store.complete(&id, new.token, stale, RETENTION).await,
        Err(StoreError::Fenced)
    ));
    assert!(matches!(
        store.release(&id, new.token).await,
        Err(StoreError::Fenced)
    ));
    match store.claim(claim_req(&id, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, tricky_response()),
        other => panic!("expected the new owner's response, got {other:?}"),
    }
}

/// A zero lease is still a lease (an unknown budget is not "no lease"; docs/DESIGN.md, "Crashed
/// owner"), and the original request is kept through a takeover for the completer.
pub async fn zero_lease_is_still_a_lease<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let mut req = claim_req(&id, r#"{"n":1}"#);
    req.lease = Duration::ZERO;
    let c = expect_claimed(store.claim(req).await.unwrap());
    assert!(c.lease_expires_at > clock.now_millis());
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.request, claim_req(&id, r#"{"n":1}"#).request);
    assert_eq!(rec.state_name(), "in_flight");
    clock.advance(Duration::from_millis(5));
    let mut again = claim_req(&id, r#"{"n":1}"#);
    again.request = None;
    let t = expect_claimed(store.claim(again).await.unwrap());
    assert_eq!(t.kind, ClaimKind::Takeover);
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        rec.request,
        claim_req(&id, r#"{"n":1}"#).request,
        "a takeover keeps the request that made the claim"
    );
}

/// Many owners race to complete after a takeover: only the current token's write lands.
pub async fn concurrent_stale_writes_are_fenced<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = Arc::new(skip_unless!(make, &clock));
    let id = fresh_id();
    let mut tokens: Vec<FencingToken> = Vec::new();
    for _ in 0..8 {
        let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
        tokens.push(c.token);
        clock.advance(LEASE + Duration::from_millis(1));
    }
    // Renew the last owner's lease so nobody can take it over now.
    let current = *tokens.last().unwrap();
    store.renew(&id, current, LEASE).await.unwrap();
    let mut tasks = Vec::new();
    for (i, token) in tokens.iter().copied().enumerate() {
        let store = store.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let resp = StoredResponse::new(200, vec![], format!("owner {i}").into_bytes());
            (token, store.complete(&id, token, resp, RETENTION).await)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let (token, res) = t.await.unwrap();
        match res {
            Ok(()) => {
                ok += 1;
                assert_eq!(token, current);
            }
            Err(StoreError::Fenced) => assert_ne!(token, current),
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(ok, 1);
    match store.get(&id).await.unwrap().unwrap().state {
        RecordState::Complete { response, .. } => assert_eq!(response.body, b"owner 7"),
        other => panic!("{other:?}"),
    }
}
