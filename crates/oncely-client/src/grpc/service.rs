//! The tower face of the gRPC transport: [`GrpcRetryLayer`] and [`GrpcRetryService`].

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderValue;
use http_body_util::Full;
use tonic::body::Body;
use tonic::{Code, ConnectError, Status, TimeoutExpired};
use tower::{Layer, Service, ServiceExt};

use super::GrpcRetry;
use super::body::RequestBody;
use super::classify::{classify_http, classify_status, is_server_failure, status_from_http};
use super::timeout::{GRPC_TIMEOUT, format_grpc_timeout, parse_grpc_timeout};
use crate::CallOptions;
use crate::classify::{Phase, TransportFailure, Verdict, classify_transport};
use crate::driver::RetryLog;
use crate::error::{BoxError, LastAnswer, RetryError, StopReason};
use crate::key::{IDEMPOTENCY_KEY, check_key};
use crate::retry_after::retry_after_from_headers;

/// A [`tower::Layer`] that wraps a service (a tonic `Channel`) in a [`GrpcRetryService`].
#[derive(Clone, Debug)]
pub struct GrpcRetryLayer {
    retry: GrpcRetry,
}

impl GrpcRetryLayer {
    pub(super) fn new(retry: GrpcRetry) -> Self {
        Self { retry }
    }
}

impl<S> Layer<S> for GrpcRetryLayer {
    type Service = GrpcRetryService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcRetryService {
            retry: self.retry.clone(),
            inner,
        }
    }
}

/// A gRPC service (a tonic `Channel`, or any `tower::Service<http::Request<tonic::body::Body>>`)
/// whose calls are retried by [`GrpcRetry`]'s rules. A generated tonic client takes it where it
/// takes a channel: `PaymentsClient::new(retry.wrap(channel))`.
///
/// `poll_ready` is always ready: each call drives the readiness of its own clone of the inner
/// service before every attempt (the inner service must be `Clone`, as a `Channel` is).
#[derive(Clone, Debug)]
pub struct GrpcRetryService<S> {
    retry: GrpcRetry,
    inner: S,
}

impl<S> GrpcRetryService<S> {
    pub(super) fn new(retry: GrpcRetry, inner: S) -> Self {
        Self { retry, inner }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// Set on every attempt's request: an inner [`GrpcRetryService`] passes it straight through,
/// so two of ours in one stack never multiply the attempts.
#[derive(Clone, Copy, Debug)]
struct Attempting;

impl<S, B> Service<http::Request<Body>> for GrpcRetryService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // The clone that was not necessarily ready stays; the call takes the one it will drive.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let retry = self.retry.clone();
        Box::pin(async move { retry.run(inner, req).await })
    }
}

/// How one attempt ended.
enum Attempt<B> {
    /// A response with its verdict; `status` when the response is trailers-only (the status in
    /// its headers), `None` when a message follows (the status comes in its trailers, the
    /// response is returned as it is).
    Response {
        response: http::Response<B>,
        status: Option<Status>,
        last: Option<LastAnswer>,
        verdict: Verdict,
        hint: Option<std::time::Duration>,
    },
    /// No response.
    Failed {
        error: BoxError,
        failure: TransportFailure,
        verdict: Verdict,
    },
}

impl GrpcRetry {
    async fn run<S, B>(
        self,
        mut inner: S,
        req: http::Request<Body>,
    ) -> Result<http::Response<B>, BoxError>
    where
        S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Into<BoxError>,
    {
        if req.extensions().get::<Attempting>().is_some() {
            tracing::debug!(
                "oncely: an outer GrpcRetryService is retrying this call; passing through"
            );
            return inner
                .ready()
                .await
                .map_err(Into::into)?
                .call(req)
                .await
                .map_err(Into::into);
        }
        let core = &self.core;
        let (mut parts, body) = req.into_parts();
        let path = parts.uri.path().to_owned();
        let method = self.methods.get(&path);

        let (mut policy, mint) =
            CallOptions::apply(parts.extensions.get::<CallOptions>(), core.policy);
        // The caller's own `grpc-timeout` (tonic's `Request::set_timeout`) is the call's
        // deadline when it is the shorter one.
        if let Some(caller) = parts
            .headers
            .get(GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
        {
            policy = policy.with_deadline(policy.deadline().min(caller));
        }
        let mut call = core.start_call(policy.deadline());

        // A caller's key is checked with the server's rules before anything is sent.
        if let Err(e) = check_key(&parts.headers) {
            let status = Status::invalid_argument(format!("invalid idempotency-key: {e}"));
            let caller = parts
                .headers
                .get(IDEMPOTENCY_KEY)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            return Err(core
                .give_up(
                    StopReason::InvalidIdempotencyKey(e),
                    &call,
                    None,
                    caller.as_deref(),
                    Some(Box::new(status)),
                )
                .into());
        }
        if mint && method.is_keyed() && !parts.headers.contains_key(IDEMPOTENCY_KEY) {
            match core.mint_key() {
                Ok(value) => {
                    parts.headers.insert(IDEMPOTENCY_KEY, value);
                }
                Err((e, minted)) => {
                    let status =
                        Status::invalid_argument(format!("invalid minted idempotency-key: {e}"));
                    return Err(core
                        .give_up(
                            StopReason::InvalidIdempotencyKey(e),
                            &call,
                            None,
                            Some(&minted),
                            Some(Box::new(status)),
                        )
                        .into());
                }
            }
        }
        let key = parts
            .headers
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let safe = key.is_some() || method.is_idempotent();

        let mut body = if method.is_streaming() {
            RequestBody::Stream(body)
        } else {
            match RequestBody::read_ready(body) {
                Ok(b) => b,
                Err(e) => {
                    return Err(core
                        .give_up(
                            StopReason::NotRetryable,
                            &call,
                            None,
                            key.as_deref(),
                            Some(e),
                        )
                        .into());
                }
            }
        };
        let replayable = matches!(body, RequestBody::Whole(_));
        let timer = &core.timer;

        loop {
            let started = timer.now();
            let limit = call
                .deadline()
                .attempt_limit(started, policy.attempt_timeout());
            if limit.is_zero() {
                let reason = StopReason::DeadlineExhausted {
                    deadline: policy.deadline(),
                };
                let status = Status::deadline_exceeded(reason.to_string());
                return Err(core
                    .give_up(reason, &call, None, key.as_deref(), Some(Box::new(status)))
                    .into());
            }
            let this_body = match &mut body {
                RequestBody::Whole(bytes) => Body::new(Full::new(bytes.clone())),
                RequestBody::Stream(stream) => std::mem::replace(stream, Body::empty()),
            };
            let mut attempt = http::Request::new(this_body);
            *attempt.method_mut() = parts.method.clone();
            *attempt.uri_mut() = parts.uri.clone();
            *attempt.version_mut() = parts.version;
            *attempt.headers_mut() = parts.headers.clone();
            *attempt.extensions_mut() = parts.extensions.clone();
            attempt.extensions_mut().insert(Attempting);
            // What is left of the call, never more: tonic's channel also enforces it locally.
            let timeout = HeaderValue::from_str(&format_grpc_timeout(limit))
                .expect("a grpc-timeout is ASCII digits and a unit");
            attempt.headers_mut().insert(GRPC_TIMEOUT, timeout);
            core.record_attempt(&mut call);

            let sent = tokio::time::timeout(limit, async {
                let ready = inner
                    .ready()
                    .await
                    .map_err(|e| (Phase::BeforeSend, e.into()))?;
                ready
                    .call(attempt)
                    .await
                    .map_err(|e| (Phase::AfterSend, e.into()))
            })
            .await;
            let outcome = match sent {
                Err(_) => {
                    let failure = TransportFailure::Timeout;
                    Attempt::Failed {
                        error: Box::new(TimeoutExpired(())) as BoxError,
                        failure,
                        verdict: classify_transport(safe, Phase::AfterSend, failure),
                    }
                }
                Ok(Err((phase, error))) => {
                    let (phase, failure) = transport_of(phase, error.as_ref());
                    Attempt::Failed {
                        verdict: classify_transport(safe, phase, failure),
                        error,
                        failure,
                    }
                }
                Ok(Ok(response)) => {
                    let headers = response.headers();
                    let http_status = response.status();
                    if let Some(status) = Status::from_header_map(headers) {
                        let (verdict, hint) =
                            classify_status(safe, &status, headers, policy.retry_500());
                        let last = Some(LastAnswer::Grpc(status.code() as i32));
                        Attempt::Response {
                            response,
                            status: Some(status),
                            last,
                            verdict,
                            hint,
                        }
                    } else if http_status != http::StatusCode::OK {
                        let verdict = classify_http(safe, http_status, headers, policy.retry_500());
                        let hint = retry_after_from_headers(headers, timer.system_now());
                        Attempt::Response {
                            response,
                            status: Some(status_from_http(http_status)),
                            last: Some(LastAnswer::Http(http_status)),
                            verdict,
                            hint,
                        }
                    } else {
                        Attempt::Response {
                            response,
                            status: None,
                            last: None,
                            verdict: Verdict::Done,
                            hint: None,
                        }
                    }
                }
            };

            let (reason, hint, last, source, failure): (_, _, _, BoxError, _) = match outcome {
                Attempt::Response {
                    response,
                    status,
                    last,
                    verdict: Verdict::Retry(reason),
                    hint,
                } => {
                    let status = status.expect("only a response with a status is retried");
                    drop(response);
                    (reason, hint, last, Box::new(status), None)
                }
                Attempt::Response {
                    response, status, ..
                } => {
                    if !status.is_some_and(|s| is_server_failure(s.code())) {
                        call.on_success(core.budget.as_deref());
                    }
                    return Ok(response);
                }
                Attempt::Failed {
                    error,
                    failure,
                    verdict: Verdict::Retry(reason),
                } => (reason, None, None, error, Some(failure)),
                Attempt::Failed {
                    error,
                    failure,
                    verdict,
                } => {
                    let reason = if verdict == Verdict::OutcomeUnknown {
                        StopReason::OutcomeUnknown
                    } else {
                        StopReason::NotRetryable
                    };
                    let source = stop_status(&reason, Some(failure), error);
                    return Err(core
                        .give_up(reason, &call, None, key.as_deref(), Some(source))
                        .into());
                }
            };

            if !replayable {
                let reason = StopReason::BodyNotReplayable;
                let source = stop_status(&reason, failure, source);
                return Err(core
                    .give_up(reason, &call, last, key.as_deref(), Some(source))
                    .into());
            }
            let log = RetryLog {
                method: "grpc",
                path: &path,
                error: Some(source.to_string()),
                key: key.as_deref(),
            };
            if let Err(stop) = core
                .wait_to_retry(&mut call, &policy, reason, hint, log)
                .await
            {
                let source = stop_status(&stop, failure, source);
                return Err(core
                    .give_up(stop, &call, last, key.as_deref(), Some(source))
                    .into());
            }
        }
    }
}

/// The status a call that stops reports to the generated client (tonic's `Status::from_error`
/// finds the first `Status` in an error's chain): the server's own status when the last
/// attempt got one (it is already `source`), else one that says what happened, with the
/// transport error as its source.
fn stop_status(
    reason: &StopReason,
    failure: Option<TransportFailure>,
    source: BoxError,
) -> BoxError {
    if source.downcast_ref::<Status>().is_some() {
        return source;
    }
    let code = match (reason, failure) {
        (StopReason::DeadlineExhausted { .. }, _) => Code::DeadlineExceeded,
        (_, Some(TransportFailure::Timeout)) => Code::DeadlineExceeded,
        (StopReason::OutcomeUnknown, _) => Code::Unknown,
        (_, Some(TransportFailure::Connect)) => Code::Unavailable,
        (StopReason::NotRetryable, _) => return source,
        _ => Code::Unavailable,
    };
    let mut status = Status::new(code, format!("{reason}: {source}"));
    status.set_source(Arc::from(source));
    Box::new(status)
}

/// When and how an attempt without a response failed.
fn transport_of(phase: Phase, error: &(dyn StdError + 'static)) -> (Phase, TransportFailure) {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<ConnectError>() {
            // The channel could not connect: nothing was sent, whatever the phase.
            return (Phase::BeforeSend, TransportFailure::Connect);
        }
        if e.is::<TimeoutExpired>() {
            // tonic's channel enforcing the `grpc-timeout` we set.
            return (Phase::AfterSend, TransportFailure::Timeout);
        }
        current = e.source();
    }
    match phase {
        // The inner service failed to become ready: nothing was sent, and we cannot tell why.
        Phase::BeforeSend => (Phase::BeforeSend, TransportFailure::Other),
        // The request was handed over and the connection failed under it: it may have run.
        Phase::AfterSend => (Phase::AfterSend, TransportFailure::Reset),
    }
}

/// Finds the [`RetryError`] in a status a generated tonic client returned (tonic keeps the
/// error of the service under the status as its `source`).
pub fn retry_error(status: &Status) -> Option<&RetryError> {
    let mut current: Option<&(dyn StdError + 'static)> = status.source();
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<RetryError>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}
