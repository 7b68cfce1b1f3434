//! The backend conformance suite: the same scenarios, concurrency included, for every
//! [`KeyStore`] and its [`Maintenance`] operations (the reaper's and the completer's scenarios
//! need both; the others only the request path).
//!
//! A backend runs it with one line in an integration test:
//!
//! ```ignore
//! // tests/conformance.rs of a store crate
//! async fn make(clock: oncely_core::ManualClock) -> Option<MyStore> {
//!     // Return None (after printing why) to skip, e.g. when a database URL is unset.
//!     Some(MyStore::connect_with_clock("...", std::sync::Arc::new(clock)).await.unwrap())
//! }
//! oncely_core::conformance_tests!(make);
//! ```
//!
//! The factory gets a [`ManualClock`] that the store must read for "now": the scenarios move it
//! to lapse leases and replay windows without sleeping. Every scenario works in its own fresh
//! scope, so the suite can share one database with other tests running at the same time; the
//! reaper scenario runs its clock in the year 2000 and the abandoned-list scenario in 2002, so
//! that each only ever touches its own records (and the reaper never deletes the list's).

use crate::clock::{Clock, ManualClock};
use crate::fingerprint::{DefaultFingerprinter, Fingerprint, Fingerprinter, RequestParts};
use crate::key::{IdempotencyKey, RecordKey, Scope};
use crate::record::{FencingToken, RecordState, StoredRequest, StoredResponse, UnixMillis};
use crate::store::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, KeyStore, Maintenance, StoreError,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The lease the scenarios use (30 seconds, the default).
pub const LEASE: Duration = Duration::from_secs(30);
/// The replay window the scenarios use (24 hours).
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The retention the scenarios use (72 hours).
pub const RETENTION: Duration = Duration::from_secs(72 * 3600);

/// A fresh `(scope, key)` in a scope nobody else uses.
pub fn fresh_id() -> RecordKey {
    RecordKey::new(
        Scope::new(format!("conformance-{}", uuid::Uuid::new_v4())),
        IdempotencyKey::new("key-1").expect("valid key"),
    )
}

/// A JSON request fingerprint for `body`.
pub fn fp(body: &str) -> Fingerprint {
    DefaultFingerprinter.fingerprint(&RequestParts {
        method: "POST",
        path: "/v1/payments",
        query: None,
        content_type: Some(b"application/json"),
        body: body.as_bytes(),
        extra_headers: &[],
    })
}

/// A claim request with the suite's lease, window and retention.
pub fn claim_req(id: &RecordKey, body: &str) -> ClaimRequest {
    ClaimRequest {
        id: id.clone(),
        fingerprint: fp(body),
        lease: LEASE,
        replay_window: WINDOW,
        retention: RETENTION,
        request: Some(StoredRequest {
            method: "POST".into(),
            uri: "/v1/payments".into(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: body.as_bytes().to_vec(),
        }),
    }
}

/// A response that exercises fidelity: repeated headers in order, non-UTF-8 header bytes, a
/// binary body with NUL bytes.
pub fn tricky_response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("x-multi".into(), b"first".to_vec()),
            ("location".into(), b"/v1/payments/pay_1".to_vec()),
            ("x-multi".into(), b"second".to_vec()),
            ("x-bytes".into(), vec![0x80, 0xff, b'a']),
        ],
        body: vec![b'{', 0, 1, 2, 0xff, b'}'],
        body_retained: true,
        trailers: Vec::new(),
    }
}

fn expect_claimed(outcome: ClaimOutcome) -> Claim {
    match outcome {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn store_of<S, F, Fut>(make: &F, clock: &ManualClock) -> Option<S>
where
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    make(clock.clone()).await
}

macro_rules! skip_unless {
    ($make:expr, $clock:expr) => {
        match store_of($make, $clock).await {
            Some(s) => s,
            None => return,
        }
    };
}

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

/// A different fingerprint is a mismatch in every state that holds a fingerprint (case S3).
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

/// An owner that stops renewing loses the claim after the lease; the new owner gets a larger
/// token and the recovery point; every write with the stale token is rejected and changes
/// nothing (case S1 and the paused-owner scenario).
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
    let stale = StoredResponse {
        status: 500,
        headers: vec![],
        body: b"stale".to_vec(),
        body_retained: true,
        trailers: Vec::new(),
    };
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

/// A zero lease is still a lease (case S1: an unknown budget is not "no lease"), and the
/// original request is kept through a takeover for the completer.
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

/// The stored request lives only while the record is in flight (issue 12: the completer
/// re-drives in-flight records only): completing drops it, on a first owner and on a takeover,
/// and the replay is unchanged; releasing drops it too, and the next claim stores its own.
pub async fn completion_drops_the_stored_request<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);

    // A first owner completes.
    let id = fresh_id();
    let now = clock.now_millis();
    let c = expect_claimed(store.claim(claim_req(&id, r#"{"a":1}"#)).await.unwrap());
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.request, claim_req(&id, r#"{"a":1}"#).request);
    store
        .complete(&id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.request, None, "a complete record keeps no request");
    assert_eq!(
        rec.state,
        RecordState::Complete {
            response: tricky_response(),
            completed_at: now
        }
    );
    assert_eq!((rec.token, rec.created_at), (c.token, now));
    assert_eq!(rec.fingerprint, fp(r#"{"a":1}"#));
    clock.advance(Duration::from_secs(60));
    match store.claim(claim_req(&id, r#"{"a":1}"#)).await.unwrap() {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => assert_eq!((response, completed_at), (tricky_response(), now)),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().request,
        None,
        "a replay stores nothing"
    );
    assert!(matches!(
        store.claim(claim_req(&id, r#"{"a":2}"#)).await.unwrap(),
        ClaimOutcome::Mismatch
    ));

    // A takeover (the completer's path) keeps the request while in flight, then completes.
    let id = fresh_id();
    let first = expect_claimed(store.claim(claim_req(&id, r#"{"b":1}"#)).await.unwrap());
    clock.advance(LEASE);
    let mut again = claim_req(&id, r#"{"b":1}"#);
    again.request = None;
    let t = expect_claimed(store.claim(again).await.unwrap());
    assert_eq!(t.kind, ClaimKind::Takeover);
    assert!(t.token > first.token);
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.request, claim_req(&id, r#"{"b":1}"#).request);
    let done_at = clock.now_millis();
    store
        .complete(&id, t.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.request, None);
    match store.claim(claim_req(&id, r#"{"b":1}"#)).await.unwrap() {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => assert_eq!((response, completed_at), (tricky_response(), done_at)),
        other => panic!("expected a replay, got {other:?}"),
    }

    // Release drops it; the next claim stores its own request.
    let id = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&id, r#"{"c":1}"#)).await.unwrap());
    store.release(&id, c.token).await.unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!((rec.state_name(), rec.request), ("released", None));
    expect_claimed(store.claim(claim_req(&id, r#"{"c":2}"#)).await.unwrap());
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.request, claim_req(&id, r#"{"c":2}"#).request);
    // A fenced completion changes nothing, the request included.
    assert!(matches!(
        store
            .complete(&id, c.token, tricky_response(), RETENTION)
            .await,
        Err(StoreError::Fenced)
    ));
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (rec.state_name(), rec.request),
        ("in_flight", claim_req(&id, r#"{"c":2}"#).request)
    );
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

/// The same key in two scopes: two independent records (case S9).
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

/// Responses come back byte for byte: empty bodies, large bodies, not-retained markers.
pub async fn response_fidelity<S, F, Fut>(make: &F)
where
    S: KeyStore,
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    let clock = ManualClock::starting_now();
    let store = skip_unless!(make, &clock);
    let cases = [
        StoredResponse {
            status: 204,
            headers: vec![],
            body: vec![],
            body_retained: true,
            trailers: Vec::new(),
        },
        StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), b"application/octet-stream".to_vec())],
            body: (0..=255u8).cycle().take(300_000).collect(),
            body_retained: true,
            trailers: Vec::new(),
        },
        StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), b"text/event-stream".to_vec())],
            body: vec![],
            body_retained: false,
            trailers: Vec::new(),
        },
        grpc_response(),
    ];
    for resp in cases {
        let id = fresh_id();
        let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
        store
            .complete(&id, c.token, resp.clone(), RETENTION)
            .await
            .unwrap();
        match store.claim(claim_req(&id, "{}")).await.unwrap() {
            ClaimOutcome::Replay { response, .. } => assert_eq!(response, resp),
            other => panic!("expected a replay, got {other:?}"),
        }
        match store.get(&id).await.unwrap().map(|r| r.state) {
            Some(RecordState::Complete { response, .. }) => assert_eq!(response, resp),
            other => panic!("expected a complete record, got {other:?}"),
        }
    }
}

/// A gRPC response as the layer stores it: a framed message body and the status in trailers,
/// repeated and non-UTF-8 trailer bytes included.
pub fn grpc_response() -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), b"application/grpc".to_vec())],
        body: vec![0, 0, 0, 0, 3, 0x0a, 0x01, 0xff],
        body_retained: true,
        trailers: vec![
            ("grpc-status".into(), b"0".to_vec()),
            ("grpc-message".into(), b"caf%C3%A9".to_vec()),
            ("grpc-status-details-bin".into(), b"CAMSBWhlbGxv".to_vec()),
            ("x-trailer".into(), vec![0x80, b'a']),
            ("x-trailer".into(), b"second".to_vec()),
        ],
    }
}

/// A completed record whose headers column was written before responses kept trailers (by
/// `overwrite`, the backend's own SQL or Redis command, given the record and
/// [`legacy_headers_column`]) still reads and replays, with its headers and no trailers; and a
/// response with trailers completed next to it keeps them.
///
/// # Panics
///
/// When the store fails or answers otherwise (this is a test).
pub async fn legacy_record_still_replays<S: KeyStore>(
    store: &S,
    overwrite: impl AsyncFnOnce(&RecordKey, Vec<u8>),
) {
    let id = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    let mut old = tricky_response();
    store
        .complete(&id, c.token, old.clone(), RETENTION)
        .await
        .unwrap();
    let (column, headers) = legacy_headers_column();
    overwrite(&id, column).await;
    old.headers = headers;
    match store.claim(claim_req(&id, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => {
            assert_eq!(response, old);
            assert!(response.trailers.is_empty());
        }
        other => panic!("expected a replay of the legacy record, got {other:?}"),
    }
    let grpc = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&grpc, "{}")).await.unwrap());
    store
        .complete(&grpc, c.token, grpc_response(), RETENTION)
        .await
        .unwrap();
    match store.claim(claim_req(&grpc, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, grpc_response()),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// A headers column as every store wrote it before responses kept trailers, in the oldest
/// form (every value an array of byte values), and the headers it decodes to. Each backend's
/// tests write it into a completed record with their own SQL or Redis command and check that
/// the record still reads and replays, with no trailers.
pub fn legacy_headers_column() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let headers = vec![
        ("content-type".to_owned(), b"application/json".to_vec()),
        ("x-multi".to_owned(), b"1".to_vec()),
        ("x-multi".to_owned(), b"2".to_vec()),
    ];
    let column = serde_json::to_vec(&headers).expect("serializable");
    (column, headers)
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
            let resp = StoredResponse {
                status: 200,
                headers: vec![],
                body: format!("owner {i}").into_bytes(),
                body_retained: true,
                trailers: Vec::new(),
            };
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
    let ours = |v: Vec<crate::record::Record>| -> Vec<RecordKey> {
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

fn only<'a>(
    ids: &'a [&'a RecordKey],
) -> impl Fn(Vec<crate::record::Record>) -> Vec<RecordKey> + 'a {
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
    use crate::record::Redrives;
    use crate::store::RedriveNote;
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
    let first = Redrives {
        attempts: 1,
        next_attempt_at: Some(now + 30_000),
        marked_at: None,
    };
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
        Redrives {
            attempts: 2,
            next_attempt_at: Some(clock.now_millis() + 60_000),
            marked_at: None,
        }
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
    use crate::record::Redrives;
    use crate::store::RedriveNote;
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
        Redrives {
            marked_at: Some(marked_at),
            ..counted
        }
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

/// Generates one `#[tokio::test]` per conformance scenario for a store factory
/// `async fn(ManualClock) -> Option<S>` (return `None`, after printing why, to skip).
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@tests $make;
            claim_complete_replay,
            in_flight_and_renew,
            mismatch_in_every_state,
            lease_takeover_fences_old_owner,
            zero_lease_is_still_a_lease,
            completion_drops_the_stored_request,
            release_then_reclaim,
            replay_window_expiry,
            scopes_are_independent,
            response_fidelity,
            concurrent_claims_one_winner,
            concurrent_stale_writes_are_fenced,
            reaper_respects_retention_and_batches,
            list_abandoned_finds_lapsed_leases,
            redrive_attempts_are_counted_once_and_kept,
            marked_record_is_never_claimed_again
        );
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::conformance::$name(&$make).await;
            }
        )*
    };
}
