//! [`Idempotency`]: the service that claims, executes, stores and replays.
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
//!    `Retry-After`: the request never runs without a claim (fail closed, case S7).
//! 4. By the claim's outcome:
//!    - claimed: an [`IdempotencyContext`] goes into the request extensions, the inner service
//!      runs while a heartbeat renews the lease every `Policy::heartbeat`, and the response is
//!      captured and stored (see [`capture`](crate::capture)), or the key is released
//!      ([`HandlerOutcome`], [`StorePolicy`](oncely_core::StorePolicy));
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

use crate::capture::{capture_response, replay_response};
use crate::claimer::ClaimProgress;
use crate::context::{HandlerOutcome, IdempotencyContext};
use crate::drain::Drain;
use crate::future::ResponseFuture;
use crate::key_source::BodyKeyError;
use crate::layer::Config;
use crate::metrics::Counter;
use crate::problem::code_response;
use crate::{Body, BoxError, IDEMPOTENT_REPLAYED};
use bytes::{Buf, Bytes};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use oncely_core::fingerprint::{FingerprintError, RequestParts};
use oncely_core::{
    ClaimOutcome, ClaimRequest, ErrorCode, Fingerprint, InFlightBehavior, KeyError, Problem,
    RecordKey, RecordState, StoreError, StoredRequest, StoredResponse, clock::duration_millis,
};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::Service;
use tracing::Instrument as _;

/// The idempotency middleware around a service `S`; made by
/// [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// It accepts `http::Request<B>` for any body `B` and hands the inner service an
/// `http::Request<`[`Body`]`>` (a boxed body: the buffered bytes on idempotent requests, the
/// original stream on pass-through ones). Under axum, `Router::layer` and `Router::route_layer`
/// accept it as is. It answers `http::Response<`[`Body`]`>` and fails only with the inner
/// service's error.
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
        #[cfg(feature = "metrics")]
        let route = route_label(&req);
        let fut = handle(Arc::clone(&self.config), inner, req);
        #[cfg(feature = "metrics")]
        let fut = crate::metrics::facade::scoped(route, fut);
        ResponseFuture::new(Box::pin(fut))
    }
}

fn box_body<B>(body: B) -> Body
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    Body::new(
        body.map_frame(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
            .map_err(Into::into),
    )
}

/// Boxes a response body whose frames are already `Bytes`: unlike [`box_body`] this keeps the
/// body's size hint, so a response of known length is still sent with `Content-Length`
/// (the same framing as its replay), not chunked.
fn box_bytes_body<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Body::new(body.map_err(Into::into))
}

type BoxedCall<R, E> = std::pin::Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'static>>;

/// Calls the inner service and boxes its future as `Send`, proven here where every lifetime
/// is known (inside an `async fn`, the compiler cannot prove `S::Future: Send` for the erased
/// lifetimes of its state, rust-lang/rust#110338).
pub(crate) fn call_boxed<S, R>(inner: &mut S, req: R) -> BoxedCall<S::Response, S::Error>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    Box::pin(inner.call(req))
}

fn full_body(bytes: Bytes) -> Body {
    Body::new(Full::new(bytes).map_err(|never| match never {}))
}

/// The `route` label: axum's matched path template (`/v1/payments/{id}`), never the raw path
/// (one series per id would have no bound); `unknown` without one.
#[cfg(feature = "metrics")]
fn route_label<B>(req: &Request<B>) -> Arc<str> {
    #[cfg(feature = "axum")]
    if let Some(p) = req.extensions().get::<axum::extract::MatchedPath>() {
        return Arc::from(p.as_str());
    }
    let _ = req;
    Arc::from("unknown")
}

/// The URI as the client sent it: under axum, a nested router's request still carries its
/// prefix in `OriginalUri`, and two routes must never share records by sharing a suffix.
fn original_uri<B>(req: &Request<B>) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = req.extensions().get() {
        return uri;
    }
    req.uri()
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
    let policy = &config.policy;
    let uri = original_uri(&req).clone();
    let requirement = config.key_rule.requirement(req.method(), uri.path());
    if requirement == crate::KeyRequirement::Ignored {
        return pass_through(inner, req).await;
    }
    config.keeper.ensure(config.store_timeout);
    // A header source is read before anything else; a body source once the body is in.
    let header_key = config.key_source.key_in_headers(req.headers());
    let key = match header_key {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(KeyError::Missing)) if requirement == crate::KeyRequirement::Optional => {
            return pass_through(inner, req).await;
        }
        Some(Err(e)) => {
            return Ok(key_refused(&config, req.method(), uri.path(), &e));
        }
    };
    let (mut parts, body) = req.into_parts();
    let Some(scope) = config.scope.scope(&parts) else {
        return Ok(code_response(
            &*config.dialect,
            ErrorCode::ScopeMissing,
            policy.profile,
            "the caller is not authenticated, so the idempotency key cannot be scoped",
            policy.retry_after_secs,
        ));
    };
    let body = match read_body(&config, &parts.headers, body).await {
        Ok(b) => b,
        Err(res) => return Ok(res),
    };
    let key = match key {
        Some(k) => k,
        None => match config.key_source.key_in_body(&body) {
            Ok(k) => k,
            Err(BodyKeyError::Key(KeyError::Missing))
                if requirement == crate::KeyRequirement::Optional =>
            {
                return pass_through(inner, Request::from_parts(parts, full_body(body))).await;
            }
            Err(BodyKeyError::Key(e)) => {
                return Ok(key_refused(&config, &parts.method, uri.path(), &e));
            }
            Err(BodyKeyError::NotAString(kind)) => {
                config.metrics.inc(Counter::key_invalid);
                return Ok(code_response(
                    &*config.dialect,
                    ErrorCode::KeyInvalid,
                    policy.profile,
                    format!(
                        "{} is {kind}; a key is a string of 1 to 255 visible ASCII characters",
                        config.key_source
                    ),
                    policy.retry_after_secs,
                ));
            }
            Err(BodyKeyError::NotIJson(why)) => {
                config.metrics.inc(Counter::body_not_canonicalizable);
                return Ok(code_response(
                    &*config.dialect,
                    ErrorCode::BodyNotCanonicalizable,
                    policy.profile,
                    format!(
                        "the request body is not I-JSON ({why}), so {} cannot be read unambiguously; nothing was executed",
                        config.key_source
                    ),
                    policy.retry_after_secs,
                ));
            }
        },
    };

    // The fingerprint and the stored request, from the bytes received (never credentials:
    // the configured headers exclude them, see `with_fingerprint_headers`).
    let content_type = parts.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
    let extra: Vec<(&str, Vec<&[u8]>)> = config
        .fingerprint_headers
        .iter()
        .map(|n| {
            let values = parts
                .headers
                .get_all(n)
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            (n.as_str(), values)
        })
        .collect();
    let fingerprint = match config.fingerprinter.try_fingerprint(&RequestParts {
        method: parts.method.as_str(),
        path: uri.path(),
        query: uri.query(),
        content_type,
        body: &body,
        extra_headers: &extra,
    }) {
        Ok(f) => f,
        Err(e) => {
            // Refused before any claim: a body with no canonical form could be matched with
            // (and replay) the record of a request that its handler would read differently.
            config.metrics.inc(Counter::body_not_canonicalizable);
            let e: FingerprintError = e;
            return Ok(code_response(
                &*config.dialect,
                ErrorCode::BodyNotCanonicalizable,
                policy.profile,
                format!(
                    "{e}, so it cannot be compared with an earlier request; nothing was executed. Send it without the repeated member name, lone surrogate or inexact number (a number as a string)"
                ),
                policy.retry_after_secs,
            ));
        }
    };
    let mut stored_headers = Vec::new();
    if let Some(ct) = content_type {
        stored_headers.push((CONTENT_TYPE.as_str().to_owned(), ct.to_vec()));
    }
    for (name, values) in &extra {
        for v in values {
            stored_headers.push(((*name).to_owned(), v.to_vec()));
        }
    }
    let stored_request = StoredRequest::new(
        parts.method.as_str(),
        uri.path_and_query()
            .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        stored_headers,
        body.to_vec(),
    );
    drop(extra);

    let id = RecordKey::new(scope, key);
    if config.drain.is_draining() {
        return Ok(Drain::shutting_down(
            &*config.dialect,
            policy.retry_after_secs,
        ));
    }
    // A duplicate of a claim this process is claiming or running waits here, holding no store
    // connection, until that claim has committed (see `Claimer::local_wait`).
    let hold = match config.claimer.local_wait() {
        None => None,
        Some(bound) => match config.local.turn(&id, bound).await {
            Some(hold) => Some(hold),
            None => {
                return Ok(in_flight(&config, &id, fingerprint, config.clock.now_millis()).await);
            }
        },
    };
    let claim = ClaimRequest::new(
        id.clone(),
        fingerprint,
        policy.lease,
        policy.replay_window,
        policy.retention,
    )
    .with_request(Some(stored_request));
    #[cfg(feature = "metrics")]
    let started = std::time::Instant::now();
    let outcome = timed(&config, config.claimer.claim(claim, &mut parts.extensions)).await;
    #[cfg(feature = "metrics")]
    crate::metrics::facade::claim(
        config.metrics.store_label(),
        match &outcome {
            Ok((ClaimOutcome::Claimed(_), _)) => "claimed",
            Ok((ClaimOutcome::Replay { .. }, _)) => "replayed",
            Ok((ClaimOutcome::InFlight { .. }, _)) => "in_flight",
            Ok((ClaimOutcome::Mismatch, _)) => "mismatch",
            Ok((ClaimOutcome::NeedsAttention { .. }, _)) => "needs_attention",
            Ok(_) => "unknown",
            Err(_) => "store_error",
        },
        started.elapsed(),
    );
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "idempotency claim failed; failing closed with 503");
            return Ok(unavailable(&config));
        }
    };
    let (outcome, progress) = outcome;
    match outcome {
        ClaimOutcome::Claimed(claim) => {
            config.metrics.inc(Counter::claims);
            if claim.kind == oncely_core::ClaimKind::Takeover {
                config.metrics.inc(Counter::lease_takeovers);
                tracing::info!(scope = %id.scope, key = %id.key, token = claim.token.0, recovery_point = ?claim.recovery_point, "took over an in-flight key whose lease lapsed");
            }
            let lease_watch = crate::lease::LeaseWatch::new(crate::lease::LeaseTerms {
                store: Arc::clone(&config.store),
                clock: Arc::clone(&config.clock),
                id: id.clone(),
                token: claim.token,
                lease: policy.lease,
                heartbeat: policy.heartbeat,
                store_timeout: config.store_timeout,
                lease_expires_at: claim.lease_expires_at,
                committed: progress.as_ref().is_none_or(|p| p.committed()),
            });
            let ctx = IdempotencyContext {
                id,
                token: claim.token,
                kind: claim.kind,
                recovery_point: claim.recovery_point,
                lease: policy.lease,
                retention: policy.retention,
                store: Arc::clone(&config.store),
                progress,
                lease_watch,
            };
            parts.extensions.insert(ctx.clone());
            // Registered for a graceful shutdown until the handler's task ends.
            let running = config.drain.register(ctx.id.clone(), ctx.token);
            let req = Request::from_parts(parts, full_body(body));
            // A client that disconnects or times out must not cancel a claimed handler in the
            // middle of its side effects (an outside call that may have succeeded) and leave the
            // key locked until its lease lapses: the handler runs to completion and its response
            // is stored for the client's retry. It runs inline on the request's own task (no
            // hand-off to another task on the hot path) and moves to a task of its own only if
            // this future is dropped before it ends (see `Detached`).
            detached_execute(Arc::clone(&config), inner, req, ctx, (running, hold)).await
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

/// The answer to a missing or invalid key: `400 idempotency_key_missing` or
/// `idempotency_key_invalid`, naming the route's key source.
fn key_refused(config: &Config, method: &http::Method, path: &str, e: &KeyError) -> Response<Body> {
    let policy = &config.policy;
    let source = &config.key_source;
    if *e == KeyError::Missing {
        config.metrics.inc(Counter::key_missing);
        let detail = if *source == crate::KeySource::default() {
            format!(
                "{method} {path} requires an Idempotency-Key header: mint a unique key per operation and reuse it on every retry"
            )
        } else {
            format!("{method} {path} reads its idempotency key from {source}, and it is missing")
        };
        return code_response(
            &*config.dialect,
            ErrorCode::KeyMissing,
            policy.profile,
            detail,
            policy.retry_after_secs,
        );
    }
    config.metrics.inc(Counter::key_invalid);
    code_response(
        &*config.dialect,
        ErrorCode::KeyInvalid,
        policy.profile,
        format!(
            "{}; a key is 1 to 255 visible ASCII characters, sent once",
            source.explain(e)
        ),
        policy.retry_after_secs,
    )
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

/// Buffers the request body up to the policy's limit; the error is the response to send.
async fn read_body<B>(
    config: &Config,
    headers: &http::HeaderMap,
    body: B,
) -> Result<Bytes, Response<Body>>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    let max = config.policy.max_request_bytes;
    let too_large = || {
        code_response(
            &*config.dialect,
            ErrorCode::RequestTooLarge,
            config.policy.profile,
            format!("the request body is larger than {max} bytes, the most this route buffers"),
            config.policy.retry_after_secs,
        )
    };
    // A declared length over the limit is refused before reading a byte.
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "could not read the request body");
            let p = Problem::from_code(
                ErrorCode::RequestBodyUnreadable,
                "the request body could not be read completely; nothing was executed",
            );
            Err(config.dialect.render(&p, None))
        }
    }
}

/// One store call bounded by the store timeout; failures and timeouts count as store errors.
async fn timed<T>(
    config: &Config,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    #[cfg(feature = "metrics")]
    let started = std::time::Instant::now();
    let result = match tokio::time::timeout(config.store_timeout, call).await {
        Ok(r) => r,
        Err(elapsed) => Err(StoreError::unavailable(elapsed)),
    };
    #[cfg(feature = "metrics")]
    crate::metrics::facade::store_call(
        config.metrics.store_label(),
        result.is_ok(),
        started.elapsed(),
    );
    if let Err(e) = &result
        && !matches!(e, StoreError::Fenced)
    {
        config.metrics.inc(Counter::store_errors);
    }
    result
}

fn unavailable(config: &Config) -> Response<Body> {
    code_response(
        &*config.dialect,
        ErrorCode::StoreUnavailable,
        config.policy.profile,
        format!(
            "the idempotency key store did not answer in time (unreachable, failing, busy past its lock timeout, or out of connections); the request was not executed. Retry after {} second(s) with the same key",
            config.policy.retry_after_secs
        ),
        config.policy.retry_after_secs,
    )
}

fn mismatch(config: &Config) -> Response<Body> {
    config.metrics.inc(Counter::mismatches);
    code_response(
        &*config.dialect,
        ErrorCode::KeyMismatch,
        config.policy.profile,
        "this Idempotency-Key was already used for a different request (method, path, query, media type or body); use a new key for a new request",
        config.policy.retry_after_secs,
    )
}

/// `409 idempotency_request_needs_attention`: the completer gave up on the key's record and
/// marked it for a person; nothing is executed.
fn needs_attention(
    config: &Config,
    id: &RecordKey,
    marked_at: oncely_core::UnixMillis,
    attempts: u32,
    recovery_point: Option<&str>,
) -> Response<Body> {
    config.metrics.inc(Counter::needs_attention);
    tracing::warn!(scope = %id.scope, key = %id.key, marked_at, attempts, recovery_point,
        "a retry of a request marked for a person was refused");
    let stopped = match recovery_point {
        Some(rp) => format!("after its step {rp:?}"),
        None => "before its first step completed".to_owned(),
    };
    code_response(
        &*config.dialect,
        ErrorCode::RequestNeedsAttention,
        config.policy.profile,
        format!(
            "the request with this Idempotency-Key was abandoned {stopped} and could not be finished automatically ({attempts} re-drive attempt(s)); it has been marked for a person (at {marked_at} ms since the Unix epoch) and will not be executed again. Do not retry it, not even with a new key: it may have taken effect part-way. Contact the operator of this API"
        ),
        config.policy.retry_after_secs,
    )
}

fn replay(config: &Config, stored: &StoredResponse) -> Response<Body> {
    config.metrics.inc(Counter::replays);
    if stored.body_retained {
        return replay_response(stored);
    }
    let mut res = code_response(
        &*config.dialect,
        ErrorCode::ResponseNotRetained,
        config.policy.profile,
        format!(
            "the request with this Idempotency-Key already completed with status {}, but its response body was too large to keep; it was not executed again",
            stored.status
        ),
        config.policy.retry_after_secs,
    );
    res.headers_mut().insert(
        http::HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
    res
}

/// A duplicate found the key in flight: reject at once, answer `202` with the status URL, or
/// in wait mode poll for the result.
async fn in_flight(
    config: &Config,
    id: &RecordKey,
    fingerprint: Fingerprint,
    lease_expires_at: oncely_core::UnixMillis,
) -> Response<Body> {
    if let InFlightBehavior::Wait { max, poll } = config.policy.in_flight {
        let deadline = tokio::time::Instant::now() + max;
        let poll = poll.max(std::time::Duration::from_millis(1));
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(poll.min(deadline - now)).await;
            match timed(config, config.store.get(id)).await {
                Err(e) => {
                    tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "polling an in-flight key failed; answering 503");
                    return unavailable(config);
                }
                Ok(Some(rec)) if rec.fingerprint == fingerprint => match &rec.state {
                    RecordState::InFlight { .. } => {}
                    RecordState::Complete {
                        response,
                        completed_at,
                    } => {
                        let window_end = completed_at
                            .saturating_add(duration_millis(config.policy.replay_window));
                        if config.clock.now_millis() < window_end {
                            return replay(config, response);
                        }
                        break;
                    }
                    // Released: nothing was stored; the client's retry will claim it.
                    RecordState::Released => break,
                    // A state this version does not know: answer 409 (never run the handler).
                    _ => break,
                },
                // Gone, or now held by a different request: let the client retry.
                Ok(_) => break,
            }
        }
    }
    config.metrics.inc(Counter::in_flight_conflicts);
    let retry_after = in_flight_retry_after(config, id, lease_expires_at).await;
    if let Some(url) = config.policy.in_flight.status_url(id.key.as_str()) {
        return accepted(id, &url, retry_after);
    }
    code_response(
        &*config.dialect,
        ErrorCode::RequestInFlight,
        config.policy.profile,
        format!(
            "a request with this Idempotency-Key is being processed; retry after {retry_after} second(s) with the same key"
        ),
        retry_after,
    )
}

/// The `Retry-After` of an in-flight answer: from the first request's age, its progress (a
/// committed recovery point) and its lease ([`oncely_core::in_flight_retry_after_secs`]). One
/// store read, bounded by the store timeout; without it, the lease alone sizes the answer.
async fn in_flight_retry_after(
    config: &Config,
    id: &RecordKey,
    lease_expires_at: oncely_core::UnixMillis,
) -> u64 {
    let now = config.clock.now_millis();
    let (elapsed, progressed, lease_end) = match timed(config, config.store.get(id)).await {
        Ok(Some(rec)) => match &rec.state {
            RecordState::InFlight {
                lease_expires_at,
                recovery_point,
            } => (
                now.saturating_sub(rec.created_at),
                recovery_point.is_some(),
                *lease_expires_at,
            ),
            // Finished meanwhile: the retry is answered at once.
            _ => (0, false, now),
        },
        _ => (
            now.saturating_sub(lease_expires_at - duration_millis(config.policy.lease)),
            false,
            lease_expires_at,
        ),
    };
    oncely_core::in_flight_retry_after_secs(
        elapsed,
        lease_end.saturating_sub(now),
        progressed,
        config.policy.retry_after_secs,
    )
}

/// `202 Accepted` with `Location: <status URL>` and `Retry-After` (the `Accepted` in-flight
/// mode): a JSON body naming the key, its state and the status URL.
fn accepted(id: &RecordKey, url: &str, retry_after: u64) -> Response<Body> {
    let body = serde_json::json!({
        "key": id.key.as_str(),
        "state": "in_flight",
        "code": ErrorCode::RequestInFlight.as_str(),
        "status_url": url,
        "detail": format!("a request with this Idempotency-Key is being processed; poll {url}, or retry the same request with the same key after {retry_after} second(s)"),
    });
    let mut res = Response::new(full_body(Bytes::from(body.to_string())));
    *res.status_mut() = http::StatusCode::ACCEPTED;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(url) {
        h.insert(http::header::LOCATION, v);
    }
    h.insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
    res
}

/// A claimed request's execution, boxed as `dyn Future + Send` so that the caller's future need
/// not re-prove `Send` for its output (a rustc limitation with higher-ranked lifetimes in async
/// fns).
type Execution<E> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<Body>, E>> + Send>>;

/// [`execute`], polled inline by the request's future, detached onto a task of its own if that
/// future is dropped first (see the caller for why). The execution keeps the request's tracing
/// span, so its logs (and the handler's) say which request they belong to.
fn detached_execute<S, ResBody>(
    config: Arc<Config>,
    inner: S,
    req: Request<Body>,
    ctx: IdempotencyContext,
    (running, hold): (crate::drain::Running, Option<crate::local::Hold>),
) -> Detached<Result<Response<Body>, S::Error>>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let execution: Execution<S::Error> = Box::pin(
        async move {
            // The key's turn in this process: passed on when the claim first commits (the
            // heartbeat's start) or, at the latest, when the execution ends.
            let hold = hold.map(|h| Arc::new(std::sync::Mutex::new(Some(h))));
            let res = execute(&config, inner, req, &ctx, hold.as_ref()).await;
            drop(hold);
            // Registered for a graceful shutdown until the execution ends, wherever it runs.
            drop(running);
            res
        }
        .in_current_span(),
    );
    Detached(Some(execution))
}

/// A future that runs its execution to completion even when it is dropped: polled in place
/// while its owner polls it, and handed to `tokio::spawn` (its output discarded: the layer has
/// already stored or released the record by then) when its owner drops it unfinished, for
/// example because hyper dropped the connection of a client that went away.
///
/// This gives the cancellation safety of running every claimed request on its own task without
/// paying for that task's hand-offs (a spawn, a wake-up of the task and one of the waiting
/// request per execution) on every request: issue 11 measured those hand-offs as most of what
/// the layer cost beyond its statements.
struct Detached<T: Send + 'static>(
    Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
);

impl<T: Send + 'static> std::future::Future for Detached<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        let Some(execution) = self.0.as_mut() else {
            panic!("Detached polled after it completed");
        };
        let out = std::task::ready!(execution.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        let Some(execution) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = execution.await;
                });
            }
            // No runtime to finish it on (the runtime itself is shutting down): the claim
            // stays in flight and a retry takes it over when its lease lapses.
            Err(_) => tracing::warn!(
                "a claimed request was dropped unfinished outside a tokio runtime; its key stays in flight until its lease lapses"
            ),
        }
    }
}

/// Runs the claimed request, then completes or releases its record.
async fn execute<S, ResBody>(
    config: &Arc<Config>,
    mut inner: S,
    req: Request<Body>,
    ctx: &IdempotencyContext,
    hold: Option<&HoldSlot>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    if config.drain.is_draining() {
        // Claimed, but the server began shutting down before the handler started: nothing
        // ran, so the key is released at once and the client retries elsewhere. (A claim that
        // rides in a transaction is undone by dropping the request, which rolls it back.)
        if ctx.progress.as_ref().is_none_or(|p| p.committed()) {
            release(config, ctx).await;
        }
        return Ok(Drain::shutting_down(
            &*config.dialect,
            config.policy.retry_after_secs,
        ));
    }
    let heartbeat = Beat::start(config, ctx, hold);
    let res = match call_boxed(&mut inner, req).await {
        Ok(r) => r,
        Err(e) => {
            // The service failed without a response: its effects are unknown, so the key is
            // left in flight and a retry takes it over once the lease lapses. Dropping the
            // heartbeat stops it (no await here: the error is returned as is).
            drop(heartbeat);
            tracing::warn!(scope = %ctx.id.scope, key = %ctx.id.key, "inner service failed; the key stays in flight until its lease lapses");
            return Err(e);
        }
    };
    let (parts, body) = res.into_parts();
    let body = box_bytes_body(body);
    // What the store policy judges: the HTTP status, or what the dialect reads from the head
    // (a gRPC status sent in the headers); asked again with the trailers below.
    let status = config
        .dialect
        .effective_status(parts.status, &parts.headers, &[]);
    if let Some(progress) = &ctx.progress {
        heartbeat.stop().await;
        if let Some(replaced) =
            transactional_end(config, ctx, progress.as_ref(), status, &parts.extensions).await
        {
            return Ok(replaced);
        }
        return Ok(Response::from_parts(parts, body));
    }
    match parts.extensions.get::<HandlerOutcome>() {
        Some(HandlerOutcome::AlreadyStored) => {
            heartbeat.stop().await;
            return Ok(Response::from_parts(parts, body));
        }
        Some(HandlerOutcome::NotExecuted) => {
            heartbeat.stop().await;
            release(config, ctx).await;
            return Ok(Response::from_parts(parts, body));
        }
        Some(HandlerOutcome::Suspended) => {
            heartbeat.stop().await;
            suspend(config, ctx).await;
            return Ok(Response::from_parts(parts, body));
        }
        None if !config.policy.store_policy.stores(status.as_u16(), false) => {
            heartbeat.stop().await;
            release(config, ctx).await;
            return Ok(Response::from_parts(parts, body));
        }
        None => {}
    }
    let (res, stored, _failed) = capture_response(
        Response::from_parts(parts, body),
        config.policy.max_response_bytes,
    )
    .await;
    // Stop renewing before completing: a renew racing the completion would be fenced.
    heartbeat.stop().await;
    let status = config
        .dialect
        .effective_status(res.status(), res.headers(), &stored.trailers);
    if !config.policy.store_policy.stores(status.as_u16(), false) {
        // Only known from the trailers (a gRPC status sent after the messages): a status the
        // policy does not keep releases the key, as it would have before the body.
        release(config, ctx).await;
        return Ok(res);
    }
    if !stored.body_retained {
        config.metrics.inc(Counter::not_retained);
    }
    match timed(
        config,
        config
            .store
            .complete(&ctx.id, ctx.token, stored, config.policy.retention),
    )
    .await
    {
        Ok(()) => {}
        Err(StoreError::Fenced) => {
            config.metrics.inc(Counter::fencing_rejections);
            tracing::warn!(scope = %ctx.id.scope, key = %ctx.id.key, token = ctx.token.0, "completion fenced: this request's lease lapsed and another request took the key over; its record stands");
        }
        Err(e) => {
            tracing::error!(scope = %ctx.id.scope, key = %ctx.id.key, token = ctx.token.0, error = %e, "could not store the response of an executed request; the key stays in flight until its lease lapses, then a retry takes it over");
        }
    }
    Ok(res)
}

/// After a handler whose claim a transactional [`Claimer`](crate::Claimer) made: the record is
/// the transaction's business, so the layer stores nothing; it only makes sure a committed
/// claim that no transaction completed does not stay locked (see [`ClaimProgress`]).
///
/// Returns the response to send instead of the handler's when the handler's answer would be
/// a lie: a success from a handler that never committed (its writes were rolled back), or
/// whatever the claim's progress answers instead ([`ClaimProgress::unfinished_answer`]).
async fn transactional_end(
    config: &Config,
    ctx: &IdempotencyContext,
    progress: &dyn ClaimProgress,
    status: http::StatusCode,
    extensions: &http::Extensions,
) -> Option<Response<Body>> {
    if progress.completed() {
        return None;
    }
    progress.settle().await;
    let lost_writes = status.is_success() || status.is_redirection();
    if lost_writes {
        tracing::error!(scope = %ctx.id.scope, key = %ctx.id.key, %status, "the handler answered success without completing its idempotent transaction (Tx::commit): its writes were rolled back and nothing was stored; answering 500 instead");
    }
    if !progress.committed() {
        // The claim rode in the handler's transaction, which did not commit: the rollback
        // undid the claim with the writes, and the key is free again.
    } else if progress.recovery_point().is_some() {
        suspend(config, ctx).await;
    } else {
        release(config, ctx).await;
    }
    if let Some((p, retry_after)) = progress.unfinished_answer(extensions) {
        return Some(config.dialect.render(&p, retry_after));
    }
    lost_writes.then(|| {
        let p = Problem::from_code(
            ErrorCode::HandlerDidNotCommit,
            "the server answered success without committing this request's transaction, so nothing of its last step was kept: a server bug, not retried automatically; tell the API's operator",
        );
        config.dialect.render(&p, None)
    })
}

/// Releases the claim (nothing executed, or a status the store policy does not keep).
async fn release(config: &Config, ctx: &IdempotencyContext) {
    match timed(config, config.store.release(&ctx.id, ctx.token)).await {
        Ok(()) => config.metrics.inc(Counter::released),
        Err(StoreError::Fenced) => {
            config.metrics.inc(Counter::fencing_rejections);
            tracing::warn!(scope = %ctx.id.scope, key = %ctx.id.key, token = ctx.token.0, "release fenced: another request took the key over");
        }
        Err(e) => {
            tracing::warn!(scope = %ctx.id.scope, key = %ctx.id.key, error = %e, "could not release the key; it stays in flight until its lease lapses");
        }
    }
}

/// Keeps the record in flight with its recovery point but lets its lease lapse now (a 0 ms
/// renewal, which every store raises to 1 millisecond), so the next retry resumes at once.
async fn suspend(config: &Config, ctx: &IdempotencyContext) {
    match timed(
        config,
        config
            .store
            .renew(&ctx.id, ctx.token, std::time::Duration::ZERO),
    )
    .await
    {
        Ok(_) => {
            tracing::info!(scope = %ctx.id.scope, key = %ctx.id.key, recovery_point = ?ctx.recovery_point, "request suspended at its recovery point; the next retry resumes it");
        }
        Err(StoreError::Fenced) => {
            config.metrics.inc(Counter::fencing_rejections);
            tracing::warn!(scope = %ctx.id.scope, key = %ctx.id.key, token = ctx.token.0, "suspend fenced: another request took the key over");
        }
        Err(e) => {
            tracing::warn!(scope = %ctx.id.scope, key = %ctx.id.key, error = %e, "could not cut the lease short; the key stays in flight until its lease lapses");
        }
    }
}

/// The heartbeat of one claimed request: started at once for a claim committed at once; for a
/// claim that rides in the handler's transaction, started when that claim first commits
/// ([`ClaimProgress::on_first_commit`]): before, there is nothing to renew, and a single-phase
/// request (claim, writes and response in one commit) pays for no heartbeat task at all.
struct Beat(Arc<std::sync::Mutex<Option<Heartbeat>>>);

/// A claimed request's turn on its key in this process ([`crate::local`]), until passed on.
type HoldSlot = Arc<std::sync::Mutex<Option<crate::local::Hold>>>;

impl Beat {
    fn start(config: &Arc<Config>, ctx: &IdempotencyContext, hold: Option<&HoldSlot>) -> Self {
        let slot = Arc::new(std::sync::Mutex::new(None));
        let hold = hold.map(Arc::clone);
        match &ctx.progress {
            None => {
                *lock(&slot) = Some(Heartbeat::start(config, ctx.lease_watch.clone(), None));
            }
            Some(progress) => {
                let config = Arc::clone(config);
                let watch = ctx.lease_watch.clone();
                // Weak: the closure is kept by the progress itself until the first commit.
                let weak = Arc::downgrade(progress);
                let later = Arc::clone(&slot);
                progress.on_first_commit(Box::new(move || {
                    // Committed: the store now answers a duplicate at once, and holds a
                    // record the heartbeat can renew.
                    watch.commit();
                    if let Some(hold) = &hold {
                        drop(lock(hold).take());
                    }
                    if let Some(progress) = weak.upgrade() {
                        *lock(&later) = Some(Heartbeat::start(&config, watch, Some(progress)));
                    }
                }));
            }
        }
        Self(slot)
    }

    async fn stop(self) {
        let running = lock(&self.0).take();
        if let Some(h) = running {
            h.stop().await;
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The lease heartbeat: a task that renews the claim every `Policy::heartbeat` while the
/// handler runs, so a slow but live request is never taken over.
///
/// It renews whatever the handler is doing, also while one of its phases has a transaction
/// open: a live request keeps its lease. (A phase of `oncely-sqlx` takes no lock on the record
/// that a renewal would wait for, except on SQLite, whose one write lock the phase holds: there
/// the renewal waits, bounded by the store timeout, and the phase's own commit extends the lease
/// too.) Renewals keep a fixed rate, each due one interval after the start of the last one that
/// succeeded, so a slow store does not stretch the interval; a renewal that failed is tried
/// again after a quarter of the interval (at least 10 milliseconds), not a whole one, so one
/// failed renewal does not cost a third of a lease. Every renewal the store grants moves the
/// request's [`LeaseWatch`](crate::LeaseWatch) on; a fenced one marks it lost, and the
/// handler's next outside call is refused.
///
/// How it stops: [`Heartbeat::stop`] signals it and waits, so that no renew is in flight when
/// the record is completed. If the handler's task is dropped instead (the runtime shuts down),
/// dropping the sender wakes the heartbeat task, which then ends: no heartbeat outlives its
/// request by more than one renew call.
struct Heartbeat {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    fn start(
        config: &Arc<Config>,
        watch: crate::LeaseWatch,
        progress: Option<Arc<dyn ClaimProgress>>,
    ) -> Self {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let config = Arc::clone(config);
        let mut abandoned = config.drain.abandoned();
        let (id, token) = (watch.id().clone(), watch.token());
        let task = tokio::spawn(async move {
            let every = config.policy.heartbeat;
            let again = (every / 4).max(std::time::Duration::from_millis(10)).min(every);
            let mut due = tokio::time::Instant::now() + every;
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stopped => return,
                    // The server is shutting down and suspends this claim: renewing it would
                    // undo the suspension.
                    _ = abandoned.wait_for(|a| *a) => return,
                    () = tokio::time::sleep_until(due) => {}
                }
                if *abandoned.borrow() {
                    return;
                }
                if progress.as_ref().is_some_and(|p| p.completed()) {
                    return;
                }
                let started = tokio::time::Instant::now();
                match timed(&config, config.store.renew(&id, token, config.policy.lease)).await {
                    // The drain cut this lease short while the renewal was on its way: cut it
                    // again, so the renewal cannot undo the suspension.
                    Ok(_) if *abandoned.borrow() => {
                        let _ = timed(&config, config.store.renew(&id, token, std::time::Duration::ZERO)).await;
                        return;
                    }
                    Ok(until) => {
                        watch.renewed(until);
                        due = started + every;
                    }
                    Err(StoreError::Fenced) => {
                        // A transactional handler may have completed the record itself while
                        // this renewal waited for its phase's lock: that is not a lost claim.
                        let completed_by_us = matches!(
                            timed(&config, config.store.get(&id)).await,
                            Ok(Some(rec)) if rec.token == token && matches!(rec.state, oncely_core::RecordState::Complete { .. })
                        );
                        if !completed_by_us {
                            watch.lose();
                            config.metrics.inc(Counter::fencing_rejections);
                            tracing::warn!(scope = %id.scope, key = %id.key, token = token.0, "lease renewal fenced: this request lost its claim to another one; it makes no further outside call, and its completion will be rejected");
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(scope = %id.scope, key = %id.key, error = %e, retry_in_ms = again.as_millis() as u64, "lease renewal failed; trying again");
                        due = tokio::time::Instant::now() + again;
                    }
                }
            }
        }.in_current_span());
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
