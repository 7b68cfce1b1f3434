//! Which gRPC methods are keyed, idempotent or streaming: declared per method path, as the
//! server declares which methods require a key (every gRPC call is an HTTP/2 `POST`, so the
//! HTTP SDK's "`POST` gets a key" rule says nothing here).
//!
//! ```
//! use oncely_client::grpc::{GrpcMethod, GrpcMethods};
//!
//! let methods = GrpcMethods::new()
//!     .with_method("/oncely.payments.v1.Payments/CreatePayment", GrpcMethod::keyed())
//!     .with_service("oncely.payments.v1.Reports", GrpcMethod::idempotent())
//!     .with_method("/oncely.payments.v1.Payments/Upload", GrpcMethod::streaming());
//! assert!(methods.get("/oncely.payments.v1.Payments/CreatePayment").is_keyed());
//! assert!(methods.get("/oncely.payments.v1.Reports/Daily").is_idempotent());
//! assert!(methods.get("/oncely.payments.v1.Payments/Upload").is_streaming());
//! // Undeclared: unary, no key minted, only what cannot have run is retried.
//! assert_eq!(methods.get("/other.Service/Method"), GrpcMethod::unkeyed());
//! ```

use std::collections::HashMap;
use std::sync::Arc;

/// How one gRPC method is called and retried.
///
/// | kind | key minted | retried after an ambiguous failure (timeout, reset after sending) | request buffered and resent |
/// |---|---|---|---|
/// | [`keyed`](Self::keyed) (a unary write) | yes, once per call | yes, with the same key | yes |
/// | [`idempotent`](Self::idempotent) (a read, a naturally idempotent write) | no | yes | yes |
/// | [`unkeyed`](Self::unkeyed) (the default) | no | no: "outcome unknown" | yes |
/// | [`streaming`](Self::streaming) (client or bidirectional streaming) | no | never retried at all | no, streamed once |
///
/// A call whose caller set an `idempotency-key` entry counts as keyed, whatever its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrpcMethod {
    keyed: bool,
    idempotent: bool,
    streaming: bool,
}

impl Default for GrpcMethod {
    fn default() -> Self {
        Self::unkeyed()
    }
}

impl GrpcMethod {
    /// A unary call with side effects that the server collapses by key: the layer mints an
    /// `idempotency-key` (UUID v4) once per call unless the caller set one.
    pub const fn keyed() -> Self {
        Self {
            keyed: true,
            idempotent: false,
            streaming: false,
        }
    }

    /// A unary call that is safe to repeat without a key (gRFC A6 leaves this judgement to
    /// the service owner, as RFC 9110 does for HTTP methods): no key, ambiguous failures
    /// retried.
    pub const fn idempotent() -> Self {
        Self {
            keyed: false,
            idempotent: true,
            streaming: false,
        }
    }

    /// A unary call neither keyed nor idempotent (the default for undeclared methods): retried
    /// only when it cannot have run (a failed connection, `UNAVAILABLE`, the server's
    /// "store unavailable"); a timeout or reset after sending ends as "outcome unknown".
    pub const fn unkeyed() -> Self {
        Self {
            keyed: false,
            idempotent: false,
            streaming: false,
        }
    }

    /// A client-streaming or bidirectional call: its request is a stream this layer does not
    /// buffer, so it is sent once and never retried (a failure that would have been retried
    /// ends with [`crate::StopReason::BodyNotReplayable`]). Server-streaming calls have a unary
    /// request and may be declared with the other kinds.
    pub const fn streaming() -> Self {
        Self {
            keyed: false,
            idempotent: false,
            streaming: true,
        }
    }

    /// Whether a key is minted for calls of this method.
    pub const fn is_keyed(&self) -> bool {
        self.keyed
    }

    /// Whether calls of this method are safe to repeat without a key.
    pub const fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    /// Whether calls of this method stream their request (never retried).
    pub const fn is_streaming(&self) -> bool {
        self.streaming
    }
}

/// The method table: exact method paths (`/package.Service/Method`) first, then whole
/// services (`package.Service`), then the default ([`GrpcMethod::unkeyed`] unless set).
/// Cloning is cheap (shared).
#[derive(Clone, Debug, Default)]
pub struct GrpcMethods {
    methods: Arc<HashMap<String, GrpcMethod>>,
    services: Arc<HashMap<String, GrpcMethod>>,
    default: GrpcMethod,
}

impl GrpcMethods {
    /// An empty table: every method is [`GrpcMethod::unkeyed`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares one method by its path, `/package.Service/Method` (the HTTP/2 `:path` gRPC
    /// sends, as in the generated client's `PathAndQuery`).
    pub fn with_method(mut self, path: impl Into<String>, method: GrpcMethod) -> Self {
        Arc::make_mut(&mut self.methods).insert(path.into(), method);
        self
    }

    /// Declares every method of a service, `package.Service`, unless declared one by one.
    pub fn with_service(mut self, service: impl Into<String>, method: GrpcMethod) -> Self {
        Arc::make_mut(&mut self.services).insert(service.into(), method);
        self
    }

    /// The kind of undeclared methods.
    pub fn with_default(mut self, method: GrpcMethod) -> Self {
        self.default = method;
        self
    }

    /// The kind of the method at `path`.
    pub fn get(&self, path: &str) -> GrpcMethod {
        if let Some(m) = self.methods.get(path) {
            return *m;
        }
        let service = path
            .strip_prefix('/')
            .and_then(|p| p.rsplit_once('/'))
            .map(|(service, _)| service);
        service
            .and_then(|s| self.services.get(s))
            .copied()
            .unwrap_or(self.default)
    }
}
