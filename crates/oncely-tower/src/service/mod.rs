//! [`Idempotency`]: the service that claims, executes, stores and replays, one file per step of
//! a request: [`prepare`] (key, scope, body, fingerprint), the claim ([`claim`](crate::claim),
//! called here), [`execute`] (the handler, then the claim's end), [`answers`] (what the layer
//! says itself).
//!
//! # What one request goes through
//!
//! 1. The [`KeyRule`](crate::KeyRule) says whether the route takes a key; ignored routes, and
//!    optional routes called without a key, pass through untouched.
//! 2. The key is parsed (`400 idempotency_key_missing` / `idempotency_key_invalid`), the scope
//!    is found (`401 idempotency_scope_missing`), and the request body is buffered up to
//!    `Policy::max_request_bytes` (`413 idempotency_request_too_large`; nothing runs).
//! 3. The fingerprint is computed from the bytes received (a JSON body that is not I-JSON has
//!    none: `400 idempotency_body_not_canonicalizable`, nothing runs), and the key is claimed with the
//!    policy's lease, replay window and retention, in one store call bounded by the store
//!    timeout. A store error or timeout answers `503 idempotency_store_unavailable` with
//!    `Retry-After`: the request never runs without a claim (fail closed).
//! 4. By the claim's outcome:
//!    - claimed: an [`IdempotencyContext`](crate::IdempotencyContext) goes into the request
//!      extensions, the inner service runs while a heartbeat renews the lease every
//!      `Policy::heartbeat` (see [`claim`](crate::claim)), and the response is captured and
//!      stored (see [`oncely_core::response`]), or the key is released
//!      ([`HandlerOutcome`](crate::HandlerOutcome), [`StorePolicy`](oncely_core::StorePolicy));
//!    - in flight: `409 idempotency_request_in_flight` with `Retry-After`, or in wait mode the
//!      replay once the first request completes (bounded);
//!    - replay: the stored response verbatim plus `Idempotent-Replayed: true`;
//!    - mismatch: `422 idempotency_key_mismatch` (status per profile), never the stored body.
//!
//! # After the handler ran
//!
//! The response is always returned to its caller, whatever happens to the record: the side
//! effect happened. A completion rejected with a stale fencing token (this request's lease
//! lapsed and another took over) is counted and logged; the other owner's record stands. A
//! completion that fails because the store is down is logged at error level; the key stays in
//! flight until its lease lapses, and a retry after that takes it over.

mod answers;
mod detached;
mod execute;
mod prepare;

use crate::body::{box_body, box_bytes_body, call_boxed, full_body};
use crate::claim::{ClaimState, Claimed, claim_key};
use crate::config::Config;
use crate::drain::Drain;
use crate::future::ResponseFuture;
use crate::metrics::Counter;
use answers::{in_flight, mismatch, needs_attention, replay, unavailable};
use bytes::Bytes;
use http::{Request, Response};
use oncely_core::ClaimOutcome;
use oncely_core::response::{Body, BoxError};
use prepare::{Keyed, Prepared, prepare};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

/// The idempotency middleware around a service `S`; made by
/// [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// It accepts `http::Request<B>` for any body `B` and hands the inner service an
/// `http::Request<`[`Body`]`>` (a boxed body: the buffered bytes on idempotent requests, the
/// original stream on pass-through ones). Under axum, `MethodRouter::route_layer` (the form the
/// docs use: only the route's own methods reach the layer, so another method's `405` and a
/// missing route's `404` are answered before any claim), `Router::route_layer` and
/// `Router::layer` (both of which also wrap each route's `405`) accept it as is. It answers
/// `http::Response<`[`Body`]`>` and fails only with the inner service's error.
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: Clone> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("policy", &self.config.policy)
            .finish_non_exhaustive()
    }
}

impl<S> Idempotency<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, ResBody> Service<Request<B>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The service that was driven to readiness is the one that must be called: take it and
        // leave a clone in its place (the usual tower idiom).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let route = route_label(&req);
        let fut = handle(Arc::clone(&self.config), inner, req);
        let fut = crate::metrics::facade::scoped(route, fut);
        ResponseFuture::new(Box::pin(fut))
    }
}

/// The `route` label: axum's matched path template (`/v1/payments/{id}`), never the raw path
/// (one series per id would have no bound); `unknown` without one.
fn route_label<B>(req: &Request<B>) -> Arc<str> {
    #[cfg(feature = "axum")]
    if let Some(p) = req.extensions().get::<axum::extract::MatchedPath>() {
        return Arc::from(p.as_str());
    }
    let _ = req;
    Arc::from("unknown")
}

async fn handle<S, B, ResBody>(
    config: Arc<Config>,
    inner: S,
    req: Request<B>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Keyed {
        mut parts,
        body,
        id,
        fingerprint,
        request,
    } = match prepare(&config, req).await {
        Prepared::Keyed(k) => k,
        Prepared::PassThrough(req) => return pass_through(inner, req).await,
        Prepared::PassThroughRead(req) => return pass_through(inner, req).await,
        Prepared::Answer(res) => return Ok(res),
    };
    let policy = &config.policy;
    if config.drain.is_draining() {
        return Ok(Drain::shutting_down(
            &*config.dialect,
            policy.retry_after_secs,
        ));
    }
    let (outcome, sent, hold) =
        match claim_key(&config, &id, fingerprint, request, &mut parts.extensions).await {
            Claimed::Answer {
                outcome,
                sent,
                hold,
            } => (outcome, sent, hold),
            Claimed::LocalBusy => {
                return Ok(in_flight(&config, &id, fingerprint, config.clock.now_millis()).await);
            }
            Claimed::Failed => return Ok(unavailable(&config)),
        };
    match outcome {
        ClaimOutcome::Claimed(claim) => {
            config.metrics.inc(Counter::claims);
            if claim.kind == oncely_core::ClaimKind::Takeover {
                config.metrics.inc(Counter::lease_takeovers);
                tracing::info!(scope = %id.scope, key = %id.key, token = claim.token.0, recovery_point = ?claim.recovery_point, "took over an in-flight key whose lease lapsed");
            }
            // Registered for a graceful shutdown until the handler's execution ends.
            let state = ClaimState::new(Arc::clone(&config), id, &claim, sent, hold);
            let running = config.drain.register(Arc::clone(state.book()));
            parts.extensions.insert(execute::context(&state));
            let req = Request::from_parts(parts, full_body(body));
            // A client that disconnects or times out must not cancel a claimed handler in the
            // middle of its side effects (an outside call that may have succeeded) and leave the
            // key locked until its lease lapses: the handler runs to completion and its response
            // is stored for the client's retry. It runs inline on the request's own task (no
            // hand-off to another task on the hot path) and moves to a task of its own only if
            // this future is dropped before it ends (see `Detached`).
            execute::detached_execute(Arc::clone(&config), inner, req, state, running).await
        }
        ClaimOutcome::InFlight { lease_expires_at } => {
            Ok(in_flight(&config, &id, fingerprint, lease_expires_at).await)
        }
        ClaimOutcome::Replay { response, .. } => Ok(replay(&config, &response)),
        ClaimOutcome::Mismatch => Ok(mismatch(&config)),
        ClaimOutcome::NeedsAttention {
            marked_at,
            attempts,
            recovery_point,
        } => Ok(needs_attention(
            &config,
            &id,
            marked_at,
            attempts,
            recovery_point.as_deref(),
        )),
        other => {
            // An outcome this version does not know: fail closed, never run the handler.
            tracing::warn!(scope = %id.scope, key = %id.key, outcome = ?other, "unknown claim outcome; failing closed with 503");
            Ok(unavailable(&config))
        }
    }
}

async fn pass_through<S, B, ResBody>(
    mut inner: S,
    req: Request<B>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let res = call_boxed(&mut inner, req.map(box_body)).await?;
    Ok(res.map(box_bytes_body))
}
