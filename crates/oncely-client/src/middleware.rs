//! The reqwest-middleware face: [`OncelyRetry`] and its [`SendGuard`].
//!
//! ```no_run
//! use std::time::Duration;
//! use oncely_client::{OncelyRetry, RetryPolicy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let retry = OncelyRetry::new(RetryPolicy::new().with_deadline(Duration::from_secs(10)));
//! // A reqwest client with the policy's connect timeout, our layer on top, the guard below.
//! let client = retry.clone().client()?;
//! let response = client.post("http://127.0.0.1:8080/payments").body("{}").send().await?;
//! println!("{} after {} retries so far", response.status(), retry.metrics().snapshot().retries);
//! # Ok(()) }
//! ```
//!
//! # Where it sits: one retry layer per stack
//!
//! Put it first in the middleware chain (the outermost layer), so that one logical call is one
//! retry loop with one deadline, and put its [`SendGuard`] last (the innermost layer, right
//! above the network). [`OncelyRetry::wrap`] and [`OncelyRetry::client`] do both. With other
//! resilience pieces the order, outermost first, is
//! **Retry -> CircuitBreaker -> RateLimiter -> Bulkhead -> [`SendGuard`]**: the breaker counts
//! every attempt rather than every logical call, and the rate limiter and bulkhead bound the
//! attempts that actually reach the network. An error such a layer returns on its own (an open
//! breaker, a full bulkhead) is returned to the caller at once, not retried: this layer cannot
//! tell what it means.
//!
//! Two retry layers in one stack multiply (3 attempts around 3 attempts is 9 requests), so:
//!
//! - **our layer twice**: the inner instance sees the outer one (a request extension the outer
//!   one sets) and passes each attempt straight through; only the outer one retries, and the
//!   attempt limit, the deadline and the budget hold for the whole stack;
//! - **another retry layer below ours** (reqwest-retry's `RetryTransientMiddleware`, say) is not
//!   supported. Our layer cannot see it, but the [`SendGuard`] below it counts the requests
//!   that really go out: it refuses any beyond the call's attempt limit or past its deadline,
//!   and when one attempt of ours turned into several requests our layer stops with
//!   [`StopReason::NestedRetryLayer`] (the last status is in the error) instead of retrying.
//!   Without the guard (a chain built by hand without [`OncelyRetry::guard`]) nothing can see
//!   the inner layer, and the attempts multiply;
//! - **another retry layer above ours** sees our final error or response and may retry it again:
//!   not supported either; remove one of the two.
//!
//! ```no_run
//! use oncely_client::{OncelyRetry, RetryPolicy};
//!
//! # fn build(breaker: impl reqwest_middleware::Middleware) -> reqwest_middleware::ClientWithMiddleware {
//! let retry = OncelyRetry::new(RetryPolicy::new());
//! let client = reqwest_middleware::ClientBuilder::new(retry.client_builder().build().unwrap())
//!     .with(retry.clone()) // outermost: the one retry loop
//!     .with(breaker)       // then circuit breaker, rate limiter, bulkhead
//!     .with(retry.guard()) // innermost: counts what really goes out
//!     .build();
//! # client }
//! ```
//!
//! # What one logical call does
//!
//! 1. Starts the deadline (policy default 30 s, or [`CallOptions`] from the request extensions).
//! 2. Checks a caller's `Idempotency-Key` with the server's rules (1 to 255 visible ASCII
//!    characters, sent once); a bad one ends the call with
//!    [`StopReason::InvalidIdempotencyKey`] before anything is sent.
//! 3. For `POST` and `PATCH` without an `Idempotency-Key`, mints one (UUID v4, unless the policy
//!    or [`CallOptions::with_key_minting`] says not to) and sets it on the request; every attempt
//!    of this call carries that same key.
//! 4. Sends an attempt with the timeout `min(attempt timeout, caller's request timeout, time
//!    left)`. As with reqwest's own request timeout, it also bounds reading the body of the
//!    response that is finally returned.
//! 5. Classifies the outcome ([`crate::classify`]): for an error response (status 400 or above)
//!    with a JSON body of at most 64 KiB (by `Content-Length`, or counted as it arrives for a
//!    chunked body), it reads the body, within what is left of the attempt's time, for the
//!    problem+json `code` and `retryable` fields, and hands the response back intact. A body that
//!    breaks, stalls or is too large is noted in the logs and never changes the verdict: the
//!    status (and the headers) decide, and a response returned to the caller still yields the
//!    bytes that arrived, then the same error.
//! 6. Returns the response, returns an error, or plans a retry ([`crate::schedule`]), logs it
//!    with `tracing` at `INFO` (attempt, reason, wait and why, tokens left), sleeps and repeats.
//!    A call dropped during that sleep gives the retry's tokens back to the budget.
//!
//! Bodies: a buffered body is cloned before each attempt and resent byte for byte. A streaming
//! body (one `reqwest::Request::try_clone` cannot copy) is sent once; if that attempt fails
//! retryably the call ends with [`StopReason::BodyNotReplayable`].
//!
//! # Errors
//!
//! Responses that are not retried (2xx, 3xx, 4xx, a `retryable: false` problem) are returned as
//! `Ok`, whatever their status. Everything else ends in
//! `reqwest_middleware::Error::Middleware` holding a [`RetryError`] (get it with
//! [`RetryError::from_middleware`]), which says how many attempts were made and why the call
//! stopped: deadline, attempts, budget, not retryable, outcome unknown, a `Retry-After` beyond
//! the deadline (with the hint), a body that cannot be replayed, an invalid key, or a nested
//! retry layer. A retryable response that ends the call (its last attempt, or a budget that
//! cannot pay) is reported as an error with [`RetryError::last_status`] set; its body is
//! dropped. The reason names the root cause: an error another layer wrapped around a transport
//! error is classified by that transport error.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Extensions, StatusCode};
use http_body::{Body as HttpBody, Frame};
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};

use crate::classify::{
    Outcome, Phase, Problem, RequestFacts, ResponseClassifier, ResponseFacts, TransportFailure,
    Verdict, classify, classify_with, needs_problem_body,
};
use crate::clock::Clock;
use crate::deadline::Deadline;
use crate::driver::{Driver, RetryLog};
use crate::error::{BoxError, LastAnswer, RetryError, StopReason};
use crate::key::{IDEMPOTENCY_KEY, check_key, needs_key};
use crate::policy::RetryPolicy;
use crate::retry_after::retry_after_from_headers;
use crate::schedule::CallState;

/// Largest problem+json body read for classification, in bytes (64 KiB).
pub const MAX_PROBLEM_BODY: u64 = 64 * 1024;

/// Per-call overrides, passed as a request extension
/// (`reqwest_middleware::RequestBuilder::with_extension`).
///
/// ```no_run
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) -> Result<(), reqwest_middleware::Error> {
/// use std::time::Duration;
/// use oncely_client::CallOptions;
/// use oncely_client::classify::ResponseClassifier;
///
/// let response = client
///     .post("http://127.0.0.1:8080/report")
///     .with_extension(
///         CallOptions::new()
///             .with_deadline(Duration::from_secs(5))
///             .with_key_minting(false) // this endpoint is naturally idempotent
///             .with_classifier(ResponseClassifier::new(|r| {
///                 // A signal the SDK does not know; `None` leaves it to the defaults.
///                 r.headers.get("x-acme-busy").map(|_| true)
///             })),
///     )
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) mint_keys: Option<bool>,
    classifier: Option<ResponseClassifier>,
}

impl CallOptions {
    /// No overrides.
    pub const fn new() -> Self {
        Self {
            deadline: None,
            max_attempts: None,
            mint_keys: None,
            classifier: None,
        }
    }

    /// This call's overall deadline instead of the policy's.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// This call's total attempts instead of the policy's (1 disables retries for it).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Whether this call gets a key minted (a `POST` or `PATCH` without one) instead of the
    /// policy's choice ([`RetryPolicy::with_key_minting`], default `true`). Without a key, an
    /// ambiguous failure of such a call ends as "outcome unknown" instead of a safe retry.
    pub fn with_key_minting(mut self, mint: bool) -> Self {
        self.mint_keys = Some(mint);
        self
    }

    /// The policy and the key-minting choice of one call: `policy` with these overrides.
    pub(crate) fn apply(options: Option<&Self>, policy: RetryPolicy) -> (RetryPolicy, bool) {
        let mut policy = policy;
        let mut mint = policy.mints_keys();
        if let Some(options) = options {
            if let Some(d) = options.deadline {
                policy = policy.with_deadline(d);
            }
            if let Some(n) = options.max_attempts {
                policy = policy.with_max_attempts(n);
            }
            if let Some(m) = options.mint_keys {
                mint = m;
            }
        }
        (policy, mint)
    }

    /// This call's response hook instead of the middleware's ([`OncelyRetry::with_classifier`]);
    /// it adds a signal, read after the server's own and before the allowlist (see
    /// [`crate::classify`]).
    pub fn with_classifier(mut self, classifier: ResponseClassifier) -> Self {
        self.classifier = Some(classifier);
        self
    }
}

/// The retry middleware for `reqwest_middleware`.
///
/// Cloning is cheap and shares the budget, the metrics and the random source: keep a clone to
/// read [`OncelyRetry::metrics`] after handing one to the client builder.
#[derive(Clone, Debug)]
pub struct OncelyRetry {
    /// The retry core this transport shares with the gRPC one ([`crate::driver`]).
    core: Driver,
    classifier: Option<ResponseClassifier>,
}

impl Default for OncelyRetry {
    fn default() -> Self {
        Self::new(RetryPolicy::new())
    }
}

impl OncelyRetry {
    /// A middleware with this policy, a fresh budget (if the policy enables one), fresh metrics,
    /// UUID v4 keys, tokio's clock and an OS-seeded random source.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            core: Driver::new(policy),
            classifier: None,
        }
    }

    crate::driver::core_methods!();

    /// A response hook for every call (a [`CallOptions::with_classifier`] replaces it for one
    /// call). It adds a signal; the allowlist defaults stay (see [`crate::classify`]).
    pub fn with_classifier(mut self, classifier: ResponseClassifier) -> Self {
        self.classifier = Some(classifier);
        self
    }

    /// The guard to put last in a middleware chain built by hand (see the
    /// [module docs](self)).
    pub fn guard(&self) -> SendGuard {
        SendGuard
    }

    /// A reqwest client builder with the policy's connect timeout
    /// ([`RetryPolicy::connect_timeout`], default 3 s), for clients you want to configure
    /// further before [`OncelyRetry::wrap`].
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder().connect_timeout(self.core.policy.connect_timeout())
    }

    /// A reqwest client with the policy's connect timeout, wrapped with this middleware first
    /// and its [`SendGuard`] last.
    ///
    /// # Errors
    ///
    /// The `reqwest::Error` of `reqwest::ClientBuilder::build` (a TLS backend that cannot start).
    pub fn client(self) -> Result<ClientWithMiddleware, reqwest::Error> {
        let client = self.client_builder().build()?;
        Ok(self.wrap(client))
    }

    /// Wraps a reqwest client with this middleware first and its [`SendGuard`] last.
    ///
    /// The client's own settings stay: build it with [`OncelyRetry::client_builder`] (or set
    /// `connect_timeout` yourself) so that a connect that hangs is reported as "not sent" and
    /// retried, rather than as a timeout of the whole attempt.
    pub fn wrap(self, client: reqwest::Client) -> ClientWithMiddleware {
        let guard = self.guard();
        ClientBuilder::new(client).with(self).with(guard).build()
    }

    fn give_up(
        &self,
        reason: StopReason,
        call: &CallState,
        last_status: Option<StatusCode>,
        key: &Option<String>,
        source: Option<BoxError>,
    ) -> reqwest_middleware::Error {
        reqwest_middleware::Error::middleware(self.core.give_up(
            reason,
            call,
            last_status.map(LastAnswer::Http),
            key.as_deref(),
            source,
        ))
    }
}

/// The timeout the middleware itself enforced on an attempt.
#[derive(Debug, thiserror::Error)]
#[error("attempt timed out after {} ms", .0.as_millis())]
struct AttemptTimedOut(Duration);

/// Why the [`SendGuard`] refused to send.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("not sent: the call's {0} requests are spent (another retry layer re-sent it)")]
    AttemptCap(u32),
    #[error("not sent: the call's deadline has passed")]
    Deadline,
}

/// What the outer instance of [`OncelyRetry`] shares with everything below it for one logical
/// call, through the request extensions: its presence tells an inner instance to pass through,
/// and the [`SendGuard`] counts the requests that really go out in it.
#[derive(Clone, Debug)]
struct ActiveCall(Arc<ActiveInner>);

#[derive(Debug)]
struct ActiveInner {
    sends: AtomicU32,
    max_sends: u32,
    /// Attempts answered `409 idempotency_request_in_flight`: each one allows one more send,
    /// since the schedule does not count them against the attempt limit.
    in_flight: AtomicU32,
    deadline: Deadline,
    clock: Arc<dyn Clock>,
    /// The status of the last response that came back through the guard (0: none).
    last_status: AtomicU16,
}

impl ActiveCall {
    fn sends(&self) -> u32 {
        self.0.sends.load(Ordering::Acquire)
    }

    fn last_status(&self) -> Option<StatusCode> {
        StatusCode::from_u16(self.0.last_status.load(Ordering::Acquire)).ok()
    }
}

/// The innermost layer of a stack with [`OncelyRetry`] on top: counts the requests of each
/// logical call that really go out, and refuses (without sending) any beyond the call's attempt
/// limit or past its deadline.
///
/// It is what lets the outer layer notice a retry layer it cannot see (see the
/// [module docs](self)). [`OncelyRetry::wrap`] and [`OncelyRetry::client`] install it; put it
/// last yourself in a chain built by hand. Outside a call of [`OncelyRetry`] it does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendGuard;

#[async_trait::async_trait]
impl Middleware for SendGuard {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some(active) = extensions.get::<ActiveCall>().cloned() else {
            return next.run(req, extensions).await;
        };
        let inner = &active.0;
        if inner.deadline.is_exhausted(inner.clock.now()) {
            return Err(reqwest_middleware::Error::middleware(Refused::Deadline));
        }
        let counted = inner
            .sends
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                let cap = inner
                    .max_sends
                    .saturating_add(inner.in_flight.load(Ordering::Acquire));
                (n < cap).then_some(n + 1)
            });
        if counted.is_err() {
            return Err(reqwest_middleware::Error::middleware(Refused::AttemptCap(
                inner.max_sends,
            )));
        }
        let result = next.run(req, extensions).await;
        if let Ok(response) = &result {
            inner
                .last_status
                .store(response.status().as_u16(), Ordering::Release);
        }
        result
    }
}

/// One attempt's result, classified.
enum Attempt {
    Response {
        response: Response,
        verdict: Verdict,
        hint: Option<Duration>,
    },
    Failed {
        error: BoxError,
        verdict: Verdict,
    },
    /// The call ends here with this reason.
    Stop {
        reason: StopReason,
        error: Option<BoxError>,
    },
    /// An inner instance of ours already decided: its error goes to the caller unchanged.
    Decided(reqwest_middleware::Error),
}

fn transport_of(e: &reqwest::Error) -> (Phase, TransportFailure) {
    // `is_connect` covers refused connections, DNS failures and reqwest's connect timeout:
    // all before any request byte was written.
    if e.is_connect() {
        (Phase::BeforeSend, TransportFailure::Connect)
    } else if e.is_timeout() {
        (Phase::AfterSend, TransportFailure::Timeout)
    } else if e.is_request() {
        (Phase::AfterSend, TransportFailure::Reset)
    } else {
        (Phase::BeforeSend, TransportFailure::Other)
    }
}

/// The first error of type `T` in an error's chain, looking inside the
/// `reqwest_middleware::Error` values other layers wrap (whose `source` skips a level).
fn find_in_chain<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = match e.downcast_ref::<reqwest_middleware::Error>() {
            Some(reqwest_middleware::Error::Reqwest(r)) => Some(r as &(dyn StdError + 'static)),
            Some(reqwest_middleware::Error::Middleware(a)) => {
                let inner: &(dyn StdError + 'static) = a.as_ref();
                Some(inner)
            }
            None => e.source(),
        };
    }
    None
}

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("json"))
}

/// A response body rebuilt after inspection: the bytes already read, then the rest of the
/// original body (or the error that broke it).
struct Replayed {
    prefix: Option<Bytes>,
    rest: Rest,
}

enum Rest {
    Body(reqwest::Body),
    Failed(Option<BoxError>),
}

impl HttpBody for Replayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take()
            && !prefix.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match &mut this.rest {
            Rest::Body(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|e| Box::new(e) as BoxError))),
            Rest::Failed(error) => Poll::Ready(error.take().map(Err)),
        }
    }
}

/// How reading a body for classification ended.
enum BodyRead {
    Complete,
    TooLarge,
    Failed(reqwest::Error),
    TimedOut,
}

/// Reads a small JSON error body (bounded to [`MAX_PROBLEM_BODY`] bytes and `limit` of time) to
/// look for problem+json fields, then rebuilds an equivalent response (status, version,
/// headers, URL and the same body bytes, followed by whatever was not read).
///
/// Never fails: a body that breaks, stalls or is too large is logged and yields no problem.
async fn inspect_problem(mut response: Response, limit: Duration) -> (Response, Option<Problem>) {
    let declared_small = response
        .content_length()
        .is_none_or(|n| n <= MAX_PROBLEM_BODY);
    if !declared_small || !is_json(response.headers()) {
        return (response, None);
    }
    let status = response.status();
    let version = response.version();
    let url = response.url().clone();
    let headers = response.headers().clone();
    let mut buf = BytesMut::new();
    let read = tokio::time::timeout(limit, async {
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    buf.extend_from_slice(&chunk);
                    if buf.len() as u64 > MAX_PROBLEM_BODY {
                        return BodyRead::TooLarge;
                    }
                }
                Ok(None) => return BodyRead::Complete,
                Err(e) => return BodyRead::Failed(e),
            }
        }
    })
    .await
    .unwrap_or(BodyRead::TimedOut);
    let read_bytes = buf.len();
    let prefix = buf.freeze();
    let (problem, body) = match read {
        BodyRead::Complete => (Problem::from_json(&prefix), reqwest::Body::from(prefix)),
        BodyRead::TooLarge => {
            tracing::debug!(
                status = status.as_u16(),
                "oncely: error body over 64 KiB, not inspected"
            );
            let rest = Rest::Body(reqwest::Body::from(response));
            (
                None,
                reqwest::Body::wrap(Replayed {
                    prefix: Some(prefix),
                    rest,
                }),
            )
        }
        BodyRead::Failed(e) => {
            tracing::warn!(
                status = status.as_u16(),
                read_bytes,
                error = %e,
                "oncely: reading the error body failed; the status decides"
            );
            let rest = Rest::Failed(Some(Box::new(e)));
            (
                None,
                reqwest::Body::wrap(Replayed {
                    prefix: Some(prefix),
                    rest,
                }),
            )
        }
        BodyRead::TimedOut => {
            tracing::warn!(
                status = status.as_u16(),
                read_bytes,
                limit_ms = limit.as_millis() as u64,
                "oncely: the error body did not arrive in time; the status decides"
            );
            let rest = Rest::Body(reqwest::Body::from(response));
            (
                None,
                reqwest::Body::wrap(Replayed {
                    prefix: Some(prefix),
                    rest,
                }),
            )
        }
    };
    let mut rebuilt = http::Response::new(body);
    *rebuilt.status_mut() = status;
    *rebuilt.version_mut() = version;
    *rebuilt.headers_mut() = headers;
    let rebuilt = match http::Response::builder().url(url).body(()) {
        Ok(with_url) => {
            rebuilt
                .extensions_mut()
                .extend(with_url.into_parts().0.extensions);
            rebuilt
        }
        Err(_) => rebuilt,
    };
    (Response::from(rebuilt), problem)
}

#[async_trait::async_trait]
impl Middleware for OncelyRetry {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if extensions.get::<ActiveCall>().is_some() {
            // An outer instance of ours runs this call's retry loop: one attempt of it is one
            // pass through here, or the two loops would multiply.
            tracing::debug!("oncely: an outer OncelyRetry is retrying this call; passing through");
            return next.run(req, extensions).await;
        }
        let options = extensions.get::<CallOptions>();
        let (policy, mint) = CallOptions::apply(options, self.core.policy);
        let classifier = options
            .and_then(|o| o.classifier.clone())
            .or_else(|| self.classifier.clone());
        let call = self.core.start_call(policy.deadline());
        let active = ActiveCall(Arc::new(ActiveInner {
            sends: AtomicU32::new(0),
            max_sends: policy.max_attempts(),
            in_flight: AtomicU32::new(0),
            deadline: *call.deadline(),
            clock: self.core.clock.clone(),
            last_status: AtomicU16::new(0),
        }));
        extensions.insert(active.clone());
        let result = self
            .run(
                req, extensions, next, policy, mint, classifier, call, &active,
            )
            .await;
        extensions.remove::<ActiveCall>();
        result
    }
}

impl OncelyRetry {
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        policy: RetryPolicy,
        mint: bool,
        classifier: Option<ResponseClassifier>,
        mut call: CallState,
        active: &ActiveCall,
    ) -> reqwest_middleware::Result<Response> {
        // A caller's key is checked with the server's rules before anything is sent.
        let caller_key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if let Err(e) = check_key(req.headers()) {
            return Err(self.give_up(
                StopReason::InvalidIdempotencyKey(e),
                &call,
                None,
                &caller_key,
                None,
            ));
        }
        // One key per logical call, set on the request before any clone: every attempt carries it.
        if mint && needs_key(req.method()) && caller_key.is_none() {
            match self.core.mint_key() {
                Ok(value) => {
                    req.headers_mut().insert(IDEMPOTENCY_KEY, value);
                }
                Err((e, minted)) => {
                    return Err(self.give_up(
                        StopReason::InvalidIdempotencyKey(e),
                        &call,
                        None,
                        &Some(minted),
                        None,
                    ));
                }
            }
        }
        let has_key = req.headers().contains_key(IDEMPOTENCY_KEY);
        let key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let method = req.method().clone();
        let facts = RequestFacts {
            method: &method,
            has_key,
        };
        let path = req.url().path().to_owned();
        let attempt_timeout = req.timeout().map_or(policy.attempt_timeout(), |t| {
            (*t).min(policy.attempt_timeout())
        });
        let replayable = req.try_clone().is_some();
        let mut original = Some(req);
        let budget = self.core.budget.as_deref();
        let clock = &self.core.clock;

        loop {
            let started = clock.now();
            let limit = call.deadline().attempt_limit(started, attempt_timeout);
            if limit.is_zero() {
                let reason = StopReason::DeadlineExhausted {
                    deadline: policy.deadline(),
                };
                return Err(self.give_up(reason, &call, None, &key, None));
            }
            let this_attempt = if replayable {
                original.as_ref().and_then(Request::try_clone)
            } else {
                original.take()
            };
            let Some(mut this_attempt) = this_attempt else {
                return Err(self.give_up(StopReason::BodyNotReplayable, &call, None, &key, None));
            };
            *this_attempt.timeout_mut() = Some(limit);
            self.core.record_attempt(&mut call);
            let sends_before = active.sends();

            let result =
                tokio::time::timeout(limit, next.clone().run(this_attempt, extensions)).await;
            let attempt = match result {
                Err(_) => Attempt::Failed {
                    error: Box::new(AttemptTimedOut(limit)),
                    verdict: classify(
                        &facts,
                        &Outcome::Transport {
                            phase: Phase::AfterSend,
                            failure: TransportFailure::Timeout,
                        },
                        policy.retry_500(),
                    ),
                },
                Ok(Err(error)) => self.classify_error(error, &facts, &policy),
                Ok(Ok(response)) => {
                    let status = response.status();
                    let hint = retry_after_from_headers(response.headers(), clock.system_now());
                    let (response, problem) = if needs_problem_body(status) {
                        // Reading the body is part of the attempt: bounded by what is left of it.
                        let spent = clock.now().saturating_duration_since(started);
                        inspect_problem(response, limit.saturating_sub(spent)).await
                    } else {
                        (response, None)
                    };
                    let verdict = classify_with(
                        &facts,
                        &Outcome::Response(ResponseFacts::new(
                            status,
                            response.headers(),
                            problem.as_ref(),
                        )),
                        policy.retry_500(),
                        classifier.as_ref(),
                    );
                    Attempt::Response {
                        response,
                        verdict,
                        hint,
                    }
                }
            };

            // More requests went out than this attempt: a retry layer below us re-sent it.
            let sent = active.sends().saturating_sub(sends_before);
            let attempt = match attempt {
                Attempt::Response {
                    verdict: Verdict::Done,
                    ..
                } => attempt,
                other if sent > 1 => {
                    let error = match other {
                        Attempt::Failed { error, .. } => Some(error),
                        Attempt::Stop { error, .. } => error,
                        Attempt::Decided(e) => Some(Box::new(e) as BoxError),
                        Attempt::Response { .. } => None,
                    };
                    Attempt::Stop {
                        reason: StopReason::NestedRetryLayer {
                            requests: active.sends(),
                        },
                        error,
                    }
                }
                other => other,
            };

            let (reason, hint, last_status, source) = match attempt {
                Attempt::Response {
                    response,
                    verdict: Verdict::Done,
                    ..
                } => {
                    if !response.status().is_server_error() {
                        call.on_success(budget);
                    }
                    return Ok(response);
                }
                Attempt::Response {
                    response,
                    verdict: Verdict::Retry(reason),
                    hint,
                } => (reason, hint, Some(response.status()), None),
                Attempt::Response { response, .. } => {
                    // Responses only classify as Done or Retry; keep the response regardless.
                    return Ok(response);
                }
                Attempt::Failed {
                    error,
                    verdict: Verdict::Retry(reason),
                } => (reason, None, None, Some(error)),
                Attempt::Failed {
                    error,
                    verdict: Verdict::OutcomeUnknown,
                } => {
                    return Err(self.give_up(
                        StopReason::OutcomeUnknown,
                        &call,
                        None,
                        &key,
                        Some(error),
                    ));
                }
                Attempt::Failed { error, .. } => {
                    return Err(self.give_up(
                        StopReason::NotRetryable,
                        &call,
                        None,
                        &key,
                        Some(error),
                    ));
                }
                Attempt::Stop { reason, error } => {
                    let mut call = call;
                    if let StopReason::NestedRetryLayer { requests } = reason {
                        call.set_attempts(requests.max(call.attempts()));
                    }
                    return Err(self.give_up(reason, &call, active.last_status(), &key, error));
                }
                Attempt::Decided(error) => return Err(error),
            };

            if !replayable {
                return Err(self.give_up(
                    StopReason::BodyNotReplayable,
                    &call,
                    last_status,
                    &key,
                    source,
                ));
            }
            let log = RetryLog {
                method: method.as_str(),
                path: &path,
                error: source.as_ref().map(|e| e.to_string()),
                key: key.as_deref(),
            };
            if reason.is_in_flight() {
                active.0.in_flight.fetch_add(1, Ordering::AcqRel);
            }
            if let Err(stop) = self
                .core
                .wait_to_retry(&mut call, &policy, reason, hint, log)
                .await
            {
                return Err(self.give_up(stop, &call, last_status, &key, source));
            }
        }
    }

    /// Classifies an attempt that ended in an error, by its root cause.
    fn classify_error(
        &self,
        error: reqwest_middleware::Error,
        facts: &RequestFacts<'_>,
        policy: &RetryPolicy,
    ) -> Attempt {
        let transport = |e: &reqwest::Error| {
            let (phase, failure) = transport_of(e);
            classify(
                facts,
                &Outcome::Transport { phase, failure },
                policy.retry_500(),
            )
        };
        match error {
            reqwest_middleware::Error::Reqwest(e) => Attempt::Failed {
                verdict: transport(&e),
                error: Box::new(e),
            },
            reqwest_middleware::Error::Middleware(inner) => {
                if inner.downcast_ref::<RetryError>().is_some() {
                    return Attempt::Decided(reqwest_middleware::Error::Middleware(inner));
                }
                // The guard's own refusal, or one a layer between wrapped (reqwest-retry does).
                let refused = find_in_chain::<Refused>(inner.as_ref())
                    .map(|r| matches!(r, Refused::Deadline));
                // Another layer's error around a transport error: classified by that root cause.
                let verdict = find_in_chain::<reqwest::Error>(inner.as_ref())
                    .map_or(Verdict::NotRetryable, transport);
                let error: BoxError = inner.into();
                match refused {
                    Some(true) => Attempt::Stop {
                        reason: StopReason::DeadlineExhausted {
                            deadline: policy.deadline(),
                        },
                        error: Some(error),
                    },
                    Some(false) => Attempt::Stop {
                        reason: StopReason::NestedRetryLayer {
                            requests: policy.max_attempts(),
                        },
                        error: Some(error),
                    },
                    None => Attempt::Failed { error, verdict },
                }
            }
        }
    }
}
