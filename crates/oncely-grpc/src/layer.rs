//! [`GrpcIdempotencyLayer`]: the `oncely-tower` layer, set up for tonic services.

use crate::deadline::{GrpcDeadline, parse_grpc_timeout};
use crate::fingerprint::GrpcFingerprinter;
use crate::methods::GrpcMethods;
use crate::status::GrpcDialect;
use http::{HeaderName, Request, Response};
use oncely_core::{ErrorCode, InFlightBehavior, KeyStore, Problem};
use oncely_tower::{Body, Dialect as _, IDEMPOTENCY_KEY, Idempotency, IdempotencyLayer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// A policy the gRPC layer cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnsupportedPolicy {
    /// `InFlightBehavior::Accepted` answers `202` with a status URL, which has no gRPC form:
    /// use `Reject` (the default: `ABORTED` with `RetryInfo`) or `Wait`.
    #[error(
        "the in-flight behaviour `accepted` (202 with a status URL) has no gRPC form; use reject or wait"
    )]
    AcceptedInFlight,
}

/// The idempotency layer for tonic services: `oncely-tower`'s claim, lease heartbeat, store and
/// replay, with
///
/// - the key from the `idempotency-key` metadata entry (the same contract as the HTTP header:
///   1 to 255 visible ASCII characters, sent once; the quoted form is unquoted), required or
///   accepted per method ([`GrpcMethods`]);
/// - the scope from the request extensions, as for HTTP (an authentication layer or interceptor
///   inserts a [`Scope`](oncely_core::Scope); see
///   [`ExtensionScope`](oncely_tower::ExtensionScope));
/// - the fingerprint over the method path and the message bytes ([`GrpcFingerprinter`]);
/// - answers as gRPC statuses with `google.rpc` details ([`GrpcDialect`], the table in
///   [`status`](crate::status));
/// - the stored response's trailers replayed with it, so a replay is the same call at the gRPC
///   level (plus the `idempotent-replayed: true` metadata entry);
/// - `grpc-timeout` read into a [`GrpcDeadline`], the lease independent of it
///   ([`deadline`](crate::deadline)).
///
/// It wraps a generated server (`add_service(layer.layer(PaymentsServer::new(svc)))`) or the
/// whole tonic server (`Server::builder().layer(layer)`).
#[derive(Clone, Debug)]
pub struct GrpcIdempotencyLayer {
    tower: IdempotencyLayer,
    methods: Arc<GrpcMethods>,
}

impl GrpcIdempotencyLayer {
    /// The layer over `store` for `methods`, with the defaults of [`IdempotencyLayer`] (replay
    /// window 24 hours, lease 30 seconds, in-flight duplicates rejected, 5-second store
    /// timeout, 1 MiB message limits).
    pub fn new(store: Arc<dyn KeyStore>, methods: GrpcMethods) -> Self {
        match Self::from_layer(IdempotencyLayer::new(store), methods) {
            Ok(l) => l,
            Err(e) => unreachable!("the default policy is served: {e}"),
        }
    }

    /// The gRPC layer from a configured `oncely-tower` layer (its store, policy, claimer, scope
    /// extractor, store timeout and clock are kept). Its dialect, fingerprinter, key rule and
    /// fingerprint headers are replaced by the gRPC ones (`grpc-encoding` is the only
    /// fingerprint header).
    ///
    /// # Errors
    ///
    /// [`UnsupportedPolicy::AcceptedInFlight`] when the policy answers in-flight duplicates with
    /// `202 Accepted`.
    pub fn from_layer(
        layer: IdempotencyLayer,
        methods: GrpcMethods,
    ) -> Result<Self, UnsupportedPolicy> {
        if matches!(layer.policy().in_flight, InFlightBehavior::Accepted { .. }) {
            return Err(UnsupportedPolicy::AcceptedInFlight);
        }
        let methods = Arc::new(methods);
        let tower = layer
            .with_dialect(GrpcDialect)
            .with_fingerprinter(GrpcFingerprinter)
            .with_key_rule(SharedMethods(Arc::clone(&methods)))
            .with_fingerprint_headers(vec![HeaderName::from_static("grpc-encoding")]);
        Ok(Self { tower, methods })
    }

    /// The `oncely-tower` layer underneath: its [`metrics`](IdempotencyLayer::metrics),
    /// [`drain`](IdempotencyLayer::drain) and [`policy`](IdempotencyLayer::policy).
    pub fn tower(&self) -> &IdempotencyLayer {
        &self.tower
    }
}

/// The methods as a key rule shared with [`GrpcIdempotency`].
#[derive(Debug)]
struct SharedMethods(Arc<GrpcMethods>);

impl oncely_tower::KeyRule for SharedMethods {
    fn requirement(&self, method: &http::Method, path: &str) -> oncely_tower::KeyRequirement {
        self.0.requirement(method, path)
    }
}

impl<S> Layer<S> for GrpcIdempotencyLayer {
    type Service = GrpcIdempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcIdempotency {
            inner: self.tower.layer(inner),
            methods: Arc::clone(&self.methods),
        }
    }
}

/// The service [`GrpcIdempotencyLayer`] makes: refuses keys on streaming methods, reads
/// `grpc-timeout`, then runs [`Idempotency`]. A generated server wrapped in it is still a named
/// service (`tonic::server::NamedService`) for `Server::add_service`.
#[derive(Clone, Debug)]
pub struct GrpcIdempotency<S> {
    inner: Idempotency<S>,
    methods: Arc<GrpcMethods>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for GrpcIdempotency<S> {
    const NAME: &'static str = S::NAME;
}

/// The response future of [`GrpcIdempotency`].
pub type GrpcResponseFuture<E> =
    Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send + 'static>>;

impl<S, B> Service<Request<B>> for GrpcIdempotency<S>
where
    Idempotency<S>: Service<Request<B>, Response = Response<Body>>,
    <Idempotency<S> as Service<Request<B>>>::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = <Idempotency<S> as Service<Request<B>>>::Error;
    type Future = GrpcResponseFuture<Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if self.methods.is_streaming(req.uri().path())
            && req.headers().contains_key(IDEMPOTENCY_KEY)
        {
            let res = streaming_unsupported(req.uri().path());
            return Box::pin(async move { Ok(res) });
        }
        if let Some(t) = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| parse_grpc_timeout(v.as_bytes()))
        {
            let at = tokio::time::Instant::now() + t;
            req.extensions_mut().insert(GrpcDeadline(at));
        }
        Box::pin(self.inner.call(req))
    }
}

fn streaming_unsupported(path: &str) -> Response<Body> {
    let problem = Problem::from_code(
        ErrorCode::StreamingUnsupported,
        format!(
            "{path} streams its requests, and such a call cannot be made idempotent: nothing was executed. Call it without an idempotency-key"
        ),
    );
    GrpcDialect.render(&problem)
}
