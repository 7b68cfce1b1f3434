//! # oncely-core
//!
//! The tiny, stable core of Oncely: the `Idempotency-Key` contract, the request fingerprint,
//! the three-state key record, the policy, the problem+json error codes, the clock, and the
//! store traits every backend implements: [`KeyStore`] (the request path) and [`Maintenance`]
//! (what the background jobs of `oncely-jobs` and operators need), with [`StoreWrapper`] for a
//! store that changes a few operations of another; every store passes the one suite of
//! `oncely-conformance`. No web framework and no database here: the tower layer, the jobs and the
//! backends depend on this crate, never the reverse.
//!
//! The one problem type, [`Problem`], renders itself as an HTTP response behind two optional
//! features, off by default so that the core keeps no web dependency: `http`
//! (`Problem::to_http_response`, on the `http` crate alone) and `axum` (`axum-core`'s
//! `IntoResponse`). The tower layer, the transactional phases, the gRPC dialect and the
//! reference server all render through it, so every problem+json answer of the workspace has
//! the same members in the same order and the same headers.
//!
//! # The promise: effectively-once, not exactly-once
//!
//! Nothing over a network can promise "exactly-once" execution: a client that loses the
//! response cannot tell a request that never arrived from one that ran. What Oncely gives is
//! *effectively-once*: at-least-once delivery (the client retries) plus duplicate collapse (the
//! server runs a request's side effects once per `(scope, key)` and replays the stored response),
//! inside a documented key scope and replay window.
//!
//! # The key state machine
//!
//! `absent -> in_flight -> complete`, plus expiry; see [`record`] and
//! [`store::decide`](fn@store::decide).
//!
//! ```
//! use oncely_core::{
//!     ClaimOutcome, ClaimRequest, IdempotencyKey, KeyStore, MemoryStore, RecordKey, Scope,
//!     StoredResponse, fingerprint::{DefaultFingerprinter, Fingerprinter, RequestParts},
//! };
//! use std::time::Duration;
//!
//! # tokio_test_block(async {
//! let store = MemoryStore::new();
//! let id = RecordKey::new(Scope::new("acct_1"), IdempotencyKey::new("order-confirm-42").unwrap());
//! let fingerprint = DefaultFingerprinter.fingerprint(
//!     &RequestParts::new("POST", "/v1/orders", br#"{"sku":"A"}"#)
//!         .with_content_type(Some(b"application/json")),
//! );
//! // Lease 30 s, replay window 24 h, retention 72 h (the policy's defaults).
//! let req = ClaimRequest::new(
//!     id.clone(), fingerprint, Duration::from_secs(30),
//!     Duration::from_secs(86_400), Duration::from_secs(259_200),
//! );
//! let ClaimOutcome::Claimed(claim) = store.claim(req.clone()).await.unwrap() else { panic!() };
//! // ... run the handler, then store its response with the claim's fencing token:
//! let response = StoredResponse::new(201, vec![], b"{}".to_vec());
//! store.complete(&id, claim.token, response.clone(), req.retention).await.unwrap();
//! // A retry replays; it never re-executes.
//! assert!(matches!(store.claim(req).await.unwrap(), ClaimOutcome::Replay { .. }));
//! # });
//! # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

pub mod clock;
pub mod fingerprint;
pub mod jcs;
pub mod key;
pub mod policy;
pub mod problem;
pub mod record;
#[cfg(feature = "http")]
pub mod response;
pub mod store;

#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, SystemClock};
pub use fingerprint::{DefaultFingerprinter, Fingerprint, Fingerprinter, RequestParts};
pub use key::{IdempotencyKey, KeyError, RecordKey, Scope};
pub use policy::{
    InFlightBehavior, MAX_IN_FLIGHT_RETRY_AFTER_SECS, Policy, PolicyError, StorePolicy,
    in_flight_retry_after_secs,
};
pub use problem::{ErrorCode, Problem, StatusProfile, X_SHOULD_RETRY};
pub use record::{
    FencingToken, HeaderFields, Record, RecordState, Redrives, StoredRequest, StoredResponse,
    UnixMillis,
};
pub use store::memory::MemoryStore;
pub use store::{
    Change, Claim, ClaimKind, ClaimOutcome, ClaimRequest, Decision, KeyStore, Maintenance,
    Operator, OperatorError, ReapReport, RecordFilter, RecordPage, RecordVersion, RedriveNote,
    StoreError, StoreWrapper, check_change, decide,
};
