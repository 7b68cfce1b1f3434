//! What a completion stores (`docs/DESIGN.md`, "What is stored, and what releases the key"):
//! the response byte for byte, the stored request dropped, records written before responses
//! kept trailers.

use crate::fixtures::{
    LEASE, RETENTION, claim_req, expect_claimed, fp, fresh_id, grpc_response, tricky_response,
};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, KeyStore, ManualClock, RecordKey, RecordState, StoreError,
    StoredResponse,
};
use std::future::Future;
use std::time::Duration;

/// The stored request lives only while the record is in flight (the completer re-drives in-flight
/// records only; docs/DESIGN.md, "Replay window, retention, reaper and completer"): completing
/// drops it, on a first owner and on a takeover, and the replay is unchanged; releasing drops it
/// too, and the next claim stores its own.
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
        StoredResponse::new(204, vec![], vec![]),
        StoredResponse::new(
            200,
            vec![("content-type".into(), b"application/octet-stream".to_vec())],
            (0..=255u8).cycle().take(300_000).collect(),
        ),
        StoredResponse::new(
            201,
            vec![("content-type".into(), b"text/event-stream".to_vec())],
            vec![],
        )
        .with_body_retained(false),
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
