//! The requests, responses and durations the scenarios use; a store's own tests use them too.

use oncely_core::{
    Claim, ClaimOutcome, ClaimRequest, DefaultFingerprinter, Fingerprint, Fingerprinter,
    IdempotencyKey, ManualClock, RecordKey, RequestParts, Scope, StoredRequest, StoredResponse,
};
use std::future::Future;
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
    DefaultFingerprinter.fingerprint(
        &RequestParts::new("POST", "/v1/payments", body.as_bytes())
            .with_content_type(Some(b"application/json")),
    )
}

/// A claim request with the suite's lease, window and retention.
pub fn claim_req(id: &RecordKey, body: &str) -> ClaimRequest {
    ClaimRequest::new(id.clone(), fp(body), LEASE, WINDOW, RETENTION).with_request(Some(
        StoredRequest::new(
            "POST",
            "/v1/payments",
            vec![("content-type".into(), b"application/json".to_vec())],
            body.as_bytes().to_vec(),
        ),
    ))
}

/// A response that exercises fidelity: repeated headers in order, non-UTF-8 header bytes, a
/// binary body with NUL bytes.
pub fn tricky_response() -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("x-multi".into(), b"first".to_vec()),
            ("location".into(), b"/v1/payments/pay_1".to_vec()),
            ("x-multi".into(), b"second".to_vec()),
            ("x-bytes".into(), vec![0x80, 0xff, b'a']),
        ],
        vec![b'{', 0, 1, 2, 0xff, b'}'],
    )
}

/// The claim of `outcome`; panics on any other outcome.
pub(crate) fn expect_claimed(outcome: ClaimOutcome) -> Claim {
    match outcome {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// A gRPC response as the layer stores it: a framed message body and the status in trailers,
/// repeated and non-UTF-8 trailer bytes included.
pub fn grpc_response() -> StoredResponse {
    StoredResponse::new(
        200,
        vec![("content-type".into(), b"application/grpc".to_vec())],
        vec![0, 0, 0, 0, 3, 0x0a, 0x01, 0xff],
    )
    .with_trailers(vec![
        ("grpc-status".into(), b"0".to_vec()),
        ("grpc-message".into(), b"caf%C3%A9".to_vec()),
        ("grpc-status-details-bin".into(), b"CAMSBWhlbGxv".to_vec()),
        ("x-trailer".into(), vec![0x80, b'a']),
        ("x-trailer".into(), b"second".to_vec()),
    ])
}

/// The store `make` builds on `clock`, or `None` when it skips.
pub(crate) async fn store_of<S, F, Fut>(make: &F, clock: &ManualClock) -> Option<S>
where
    F: Fn(ManualClock) -> Fut,
    Fut: Future<Output = Option<S>>,
{
    make(clock.clone()).await
}
