//! The key state machine (`docs/DESIGN.md`, "The key state machine" and "The claim"): claim,
//! replay, in flight, mismatch, release, the replay window, scopes, and many concurrent claims
//! of one key.

use crate::fixtures::{
    LEASE, RETENTION, WINDOW, claim_req, expect_claimed, fp, fresh_id, tricky_response,
};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, KeyStore, ManualClock, RecordKey, RecordState, Scope,
    StoreError,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// absent -> claim (new, lease set from the store's clock) -> complete -> an identical request
/// replays the stored response exactly; nothing re-executes.
pub async fn claim_complete_replay<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let now = clock.now_millis();
    let c = expect_claimed(store.claim(claim_req(&id, r#"{"a":1}"#)).await.unwrap());
    assert_eq!(c.kind, ClaimKind::New);
    assert_eq!(c.recovery_point, None);
    assert_eq!(c.lease_expires_at, now + 30_000);
    store
        .complete(&id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3600));
    match store.claim(claim_req(&id, r#"{"a":1}"#)).await.unwrap() {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => {
            assert_eq!(response, tricky_response());
            assert_eq!(completed_at, now);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let rec = store.get(&id).await.unwrap().expect("record exists");
    assert_eq!(rec.fingerprint, fp(r#"{"a":1}"#));
    assert_eq!(rec.fingerprint.version(), 1);
    assert_eq!(rec.token, c.token);
    assert_eq!(rec.expires_at, now + 72 * 3_600_000);
    assert_eq!(
        rec.state,
        RecordState::Complete {
            response: tricky_response(),
            completed_at: now
        }
    );
}

/// A live in-flight record answers `InFlight` with its lease expiry, and a renewal moves it.
pub async fn in_flight_and_renew<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let t0 = clock.now_millis();
    let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    clock.advance(Duration::from_secs(20));
    assert_eq!(
        store.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::InFlight {
            lease_expires_at: t0 + 30_000
        }
    );
    let until = store.renew(&id, c.token, LEASE).await.unwrap();
    assert_eq!(until, t0 + 50_000);
    // 40 s after the claim: past the first lease, inside the renewed one.
    clock.advance(Duration::from_secs(20));
    assert_eq!(
        store.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::InFlight {
            lease_expires_at: t0 + 50_000
        }
    );
}

/// A different fingerprint is a mismatch in every state that holds a fingerprint (docs/DESIGN.md,
/// "Validation skipped on one path").
pub async fn mismatch_in_every_state<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let a = r#"{"ref":"X","accounts":[{"id":"12345"}]}"#;
    let b = r#"{"ref":"X","accounts":[{"id":"54321"}]}"#;
    let c = expect_claimed(store.claim(claim_req(&id, a)).await.unwrap());
    // In flight, lease alive.
    assert_eq!(
        store.claim(claim_req(&id, b)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    // In flight, lease lapsed: a different request must not take over.
    clock.advance(LEASE + Duration::from_secs(1));
    assert_eq!(
        store.claim(claim_req(&id, b)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    let c2 = expect_claimed(store.claim(claim_req(&id, a)).await.unwrap());
    assert_eq!(c2.kind, ClaimKind::Takeover);
    assert!(c2.token > c.token);
    store
        .complete(&id, c2.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    // Complete, inside the window.
    assert_eq!(
        store.claim(claim_req(&id, b)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    // The mismatching requests changed nothing.
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, fp(a));
    assert_eq!(rec.token, c2.token);
}

/// Release makes the key absent again while tokens keep increasing.
pub async fn release_then_reclaim<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let first = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    store.release(&id, first.token).await.unwrap();
    // Released: a different request may now use the key (the client corrected its request).
    let second = expect_claimed(
        store
            .claim(claim_req(&id, r#"{"fixed":true}"#))
            .await
            .unwrap(),
    );
    assert_eq!(second.kind, ClaimKind::New);
    assert!(second.token > first.token);
    assert!(matches!(
        store
            .complete(&id, first.token, tricky_response(), RETENTION)
            .await,
        Err(StoreError::Fenced)
    ));
    store
        .complete(&id, second.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    assert!(matches!(
        store
            .claim(claim_req(&id, r#"{"fixed":true}"#))
            .await
            .unwrap(),
        ClaimOutcome::Replay { .. }
    ));
}

/// After the replay window a reused key is a brand-new request, even with another body.
pub async fn replay_window_expiry<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let id = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    store
        .complete(&id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    clock.advance(WINDOW - Duration::from_millis(1));
    assert!(matches!(
        store.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::Replay { .. }
    ));
    clock.advance(Duration::from_millis(1));
    let again = expect_claimed(store.claim(claim_req(&id, r#"{"other":1}"#)).await.unwrap());
    assert_eq!(again.kind, ClaimKind::AfterReplayWindow);
    assert!(again.token > c.token);
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, fp(r#"{"other":1}"#));
    assert_eq!(rec.state_name(), "in_flight");
}

/// The same key in two scopes: two independent records (docs/DESIGN.md, "Keys shared
/// across tenants").
pub async fn scopes_are_independent<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let a = fresh_id();
    let b = RecordKey::new(Scope::new(format!("{}-b", a.scope)), a.key.clone());
    let ca = expect_claimed(store.claim(claim_req(&a, r#"{"t":"A"}"#)).await.unwrap());
    store
        .complete(&a, ca.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    let cb = expect_claimed(store.claim(claim_req(&b, r#"{"t":"B"}"#)).await.unwrap());
    assert_eq!(cb.kind, ClaimKind::New);
    assert_eq!(
        store.claim(claim_req(&b, r#"{"t":"B"}"#)).await.unwrap(),
        ClaimOutcome::InFlight {
            lease_expires_at: cb.lease_expires_at
        }
    );
    assert_eq!(
        store.get(&b).await.unwrap().unwrap().fingerprint,
        fp(r#"{"t":"B"}"#)
    );
}

/// Many concurrent claims of one key: exactly one wins, every other sees it in flight; and
/// after the lease lapses, exactly one of many concurrent claims takes over. 20 rounds.
pub async fn concurrent_claims_one_winner<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = Arc::new(skip_unless!(make, &clock));
    for round in 0..20 {
        let id = fresh_id();
        for phase in ["claim", "takeover"] {
            let mut tasks = Vec::new();
            for _ in 0..64 {
                let store = store.clone();
                let req = claim_req(&id, "{}");
                tasks.push(tokio::spawn(async move { store.claim(req).await }));
            }
            let mut winners = Vec::new();
            let mut in_flight = 0;
            for t in tasks {
                match t.await.expect("task").expect("claim") {
                    ClaimOutcome::Claimed(c) => winners.push(c),
                    ClaimOutcome::InFlight { .. } => in_flight += 1,
                    other => panic!("round {round} {phase}: unexpected {other:?}"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round} {phase}: {winners:?}");
            assert_eq!(in_flight, 63, "round {round} {phase}");
            let expected = if phase == "claim" {
                ClaimKind::New
            } else {
                ClaimKind::Takeover
            };
            assert_eq!(winners[0].kind, expected);
            if phase == "claim" {
                clock.advance(LEASE + Duration::from_millis(1));
            }
        }
    }
}
