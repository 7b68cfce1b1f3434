//! [`GrpcMethods`]: which RPCs take an `idempotency-key`, declared per method.
//!
//! Every gRPC call is an HTTP `POST`, so the REST rule ("POST requires a key") says nothing
//! here: each method is declared by its full path, `/<package>.<Service>/<Method>`.
//!
//! | declared as | a call with a key | a call without a key |
//! |---|---|---|
//! | [`require`](GrpcMethods::require) (unary or server-streaming) | made idempotent | `INVALID_ARGUMENT idempotency_key_missing`; nothing runs |
//! | [`accept`](GrpcMethods::accept) (unary or server-streaming) | made idempotent | passes through without a claim |
//! | [`streaming`](GrpcMethods::streaming) (client-streaming or bidirectional) | `UNIMPLEMENTED idempotency_streaming_unsupported`; nothing runs | passes through without a claim |
//! | not declared | passes through (the key is ignored) | passes through |
//!
//! **Why client-streaming and bidirectional methods take no key.** The layer fingerprints the
//! whole request and replays the whole response: it would have to buffer the client's stream to
//! its end before the handler sees a message, which breaks any conversation (a bidirectional
//! handler that answers each message never gets the first one), and a retry that sends the
//! stream again is only "the same request" once it is all there. A key on such a call is refused
//! loudly, so that no client believes its stream is protected; make such a method idempotent in
//! its messages (an id per item) instead. A **server-streaming** method has one request message
//! and can be keyed: its reply stream is captured up to `Policy::max_response_bytes` and
//! replayed message for message with its trailers; a longer stream is delivered to the first
//! caller and its replay answers `ALREADY_EXISTS idempotency_response_not_retained`.
//!
//! ```
//! use oncely_grpc::GrpcMethods;
//! use oncely_tower::{KeyRequirement, KeyRule};
//!
//! let methods = GrpcMethods::new()
//!     .require("/oncely.payments.v1.Payments/CreatePayment")
//!     .streaming("/oncely.testing.v1.Echo/Chat");
//! assert_eq!(
//!     methods.requirement(&http::Method::POST, "/oncely.payments.v1.Payments/CreatePayment"),
//!     KeyRequirement::Required
//! );
//! assert_eq!(
//!     methods.requirement(&http::Method::POST, "/oncely.payments.v1.Payments/GetPayment"),
//!     KeyRequirement::Ignored
//! );
//! assert!(methods.is_streaming("/oncely.testing.v1.Echo/Chat"));
//! ```

use http::Method;
use oncely_tower::{KeyRequirement, KeyRule};
use std::collections::HashMap;

/// How one method was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Declared {
    Keyed(KeyRequirement),
    Streaming,
}

/// The per-method key declarations of a gRPC server (see the [module docs](self)); a
/// [`KeyRule`] for the layer. Undeclared methods pass through.
#[derive(Debug, Clone, Default)]
pub struct GrpcMethods {
    methods: HashMap<String, Declared>,
}

impl GrpcMethods {
    /// No method takes a key.
    pub fn new() -> Self {
        Self::default()
    }

    /// `path` (`/<package>.<Service>/<Method>`, a unary or server-streaming method) requires a
    /// key.
    pub fn require(mut self, path: impl Into<String>) -> Self {
        self.methods
            .insert(path.into(), Declared::Keyed(KeyRequirement::Required));
        self
    }

    /// `path` (a unary or server-streaming method) accepts a key: calls with one are made
    /// idempotent, calls without one pass through.
    pub fn accept(mut self, path: impl Into<String>) -> Self {
        self.methods
            .insert(path.into(), Declared::Keyed(KeyRequirement::Optional));
        self
    }

    /// `path` is client-streaming or bidirectional: it passes through without a key, and a call
    /// that sends one is refused (`UNIMPLEMENTED idempotency_streaming_unsupported`).
    pub fn streaming(mut self, path: impl Into<String>) -> Self {
        self.methods.insert(path.into(), Declared::Streaming);
        self
    }

    /// Whether `path` was declared [`streaming`](Self::streaming).
    pub fn is_streaming(&self, path: &str) -> bool {
        self.methods.get(path) == Some(&Declared::Streaming)
    }
}

impl KeyRule for GrpcMethods {
    fn requirement(&self, method: &Method, path: &str) -> KeyRequirement {
        if method != Method::POST {
            return KeyRequirement::Ignored;
        }
        match self.methods.get(path) {
            Some(Declared::Keyed(r)) => *r,
            Some(Declared::Streaming) | None => KeyRequirement::Ignored,
        }
    }
}
