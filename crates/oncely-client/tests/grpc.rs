//! The gRPC transport against a real tonic server over TCP (127.0.0.1, an ephemeral port),
//! called through tonic's own client (`tonic::client::Grpc`, what generated clients hold) with
//! prost messages derived by hand: no `.proto`, no `protoc`.
//!
//! The server records, for every attempt that reaches it, the method path, the
//! `idempotency-key` and the `grpc-timeout` it saw, and answers as each test's script says.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::VirtualClock;
use http::uri::PathAndQuery;
use oncely_client::grpc::timeout::parse_grpc_timeout;
use oncely_client::grpc::{GrpcMethod, GrpcRetry, retry_error};
use oncely_client::{BudgetConfig, RetryPolicy, StopReason};
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tonic_types::{ErrorDetails, StatusExt};

const PAY: &str = "/test.Payments/Pay";
const UPLOAD: &str = "/test.Payments/Upload";
const STREAM_UNDECLARED: &str = "/test.Payments/Collect";

#[derive(Clone, PartialEq, prost::Message)]
struct PayRequest {
    #[prost(string, tag = "1")]
    order: String,
    #[prost(int64, tag = "2")]
    amount: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PayReply {
    #[prost(uint32, tag = "1")]
    attempt: u32,
    #[prost(int64, tag = "2")]
    total: i64,
}

/// One attempt as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    key: Option<String>,
    grpc_timeout: Option<Duration>,
    /// Messages the request carried (unary: 1).
    messages: usize,
    /// The sum of their amounts.
    total: i64,
}

/// What the server answers attempt `n` (1-based) with.
enum Act {
    Reply,
    Fail(Status),
    /// Answer only after this long (a handler slower than the attempt timeout).
    Slow(Duration),
}

type Script = dyn Fn(usize) -> Act + Send + Sync;

struct State {
    seen: Mutex<Vec<Seen>>,
    script: Box<Script>,
}

#[derive(Clone)]
struct TestService(Arc<State>);

impl tonic::server::NamedService for TestService {
    const NAME: &'static str = "test.Payments";
}

impl TestService {
    fn record(&self, req: &http::Request<Body>) -> usize {
        let h = req.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut seen = self.0.seen.lock().unwrap();
        seen.push(Seen {
            path: req.uri().path().to_owned(),
            key: text("idempotency-key"),
            grpc_timeout: text("grpc-timeout").map(|t| parse_grpc_timeout(&t).unwrap()),
            messages: 0,
            total: 0,
        });
        seen.len()
    }

    fn count(&self, n: usize, messages: usize, total: i64) {
        let mut seen = self.0.seen.lock().unwrap();
        seen[n - 1].messages = messages;
        seen[n - 1].total = total;
    }

    async fn act(&self, n: usize, total: i64) -> Result<tonic::Response<PayReply>, Status> {
        match (self.0.script)(n) {
            Act::Reply => {}
            Act::Fail(status) => return Err(status),
            Act::Slow(d) => tokio::time::sleep(d).await,
        }
        Ok(tonic::Response::new(PayReply {
            attempt: n as u32,
            total,
        }))
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for TestService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let n = this.record(&req);
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<PayReply, PayRequest>::default());
            let response = if req.uri().path() == PAY {
                let handler = tower::service_fn(|r: tonic::Request<PayRequest>| {
                    let this = this.clone();
                    async move {
                        let amount = r.get_ref().amount;
                        this.count(n, 1, amount);
                        this.act(n, amount).await
                    }
                });
                grpc.unary(handler, req).await
            } else {
                let handler =
                    tower::service_fn(|r: tonic::Request<tonic::Streaming<PayRequest>>| {
                        let this = this.clone();
                        async move {
                            let mut stream = r.into_inner();
                            let (mut messages, mut total) = (0, 0);
                            while let Some(m) = stream.message().await? {
                                messages += 1;
                                total += m.amount;
                            }
                            this.count(n, messages, total);
                            this.act(n, total).await
                        }
                    });
                grpc.client_streaming(handler, req).await
            };
            Ok(response)
        })
    }
}

struct Server {
    addr: std::net::SocketAddr,
    state: Arc<State>,
}

impl Server {
    async fn start(script: impl Fn(usize) -> Act + Send + Sync + 'static) -> Self {
        let state = Arc::new(State {
            seen: Mutex::new(Vec::new()),
            script: Box::new(script),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TestService(state.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self { addr, state }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

/// Quick retries: full jitter from 1 ms capped at 5 ms.
fn fast() -> RetryPolicy {
    RetryPolicy::new().with_full_jitter(Duration::from_millis(1), Duration::from_millis(5))
}

fn retry(policy: RetryPolicy) -> GrpcRetry {
    GrpcRetry::new(policy)
        .with_method(PAY, GrpcMethod::keyed())
        .with_method(UPLOAD, GrpcMethod::streaming())
}

fn pay_request(amount: i64) -> tonic::Request<PayRequest> {
    tonic::Request::new(PayRequest {
        order: "order-42".into(),
        amount,
    })
}

/// One unary call through tonic's client, as a generated `PaymentsClient::pay` makes it.
async fn call<S>(
    service: S,
    path: &'static str,
    request: tonic::Request<PayRequest>,
) -> Result<PayReply, Status>
where
    S: tonic::client::GrpcService<Body>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <S::ResponseBody as http_body::Body>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let mut grpc = tonic::client::Grpc::new(service);
    grpc.ready().await.map_err(|e| {
        let e: Box<dyn std::error::Error + Send + Sync> = e.into();
        Status::unknown(e.to_string())
    })?;
    grpc.unary(
        request,
        PathAndQuery::from_static(path),
        ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

fn unavailable(retry_after: Option<Duration>) -> Status {
    match retry_after {
        Some(d) => Status::with_error_details(
            Code::Unavailable,
            "key store unavailable",
            ErrorDetails::with_error_info("idempotency_store_unavailable", "oncely", [])
                .set_retry_info(Some(d))
                .clone(),
        ),
        None => Status::unavailable("try again"),
    }
}

fn in_flight() -> Status {
    Status::with_error_details(
        Code::Aborted,
        "a request with this key is in progress",
        ErrorDetails::with_error_info("idempotency_request_in_flight", "oncely", [])
            .set_retry_info(Some(Duration::from_millis(1)))
            .clone(),
    )
}

#[tokio::test]
async fn the_key_is_minted_once_and_sent_on_every_attempt() {
    let server = Server::start(|n| match n {
        1 => Act::Fail(unavailable(None)),
        2 => Act::Fail(in_flight()),
        _ => Act::Reply,
    })
    .await;
    let retry = retry(fast());
    let channel = retry.wrap(server.channel().await);

    let reply = call(channel.clone(), PAY, pay_request(1000)).await.unwrap();
    assert_eq!((reply.attempt, reply.total), (3, 1000));
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    let key = seen[0].key.clone().expect("a minted key");
    assert_eq!(key.len(), 36, "a UUID v4: {key}");
    for s in &seen {
        assert_eq!(s.key.as_deref(), Some(key.as_str()));
        // The buffered message was resent whole on every attempt.
        assert_eq!((s.messages, s.total), (1, 1000));
    }

    // A new logical call gets a new key; a caller's own key is used verbatim.
    let mut mine = pay_request(5);
    mine.metadata_mut()
        .insert("idempotency-key", "order-confirm-42".parse().unwrap());
    call(channel.clone(), PAY, pay_request(7)).await.unwrap();
    call(channel, PAY, mine).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 5);
    assert!(seen[3].key.is_some());
    assert_ne!(seen[3].key.as_deref(), Some(key.as_str()));
    assert_eq!(seen[4].key.as_deref(), Some("order-confirm-42"));
    let m = retry.metrics().snapshot();
    assert_eq!(
        (m.calls, m.attempts, m.retries, m.keys_minted),
        (3, 5, 2, 2)
    );
}

#[tokio::test]
async fn grpc_timeout_never_exceeds_what_is_left_and_retry_info_is_a_lower_bound() {
    let server = Server::start(|n| match n {
        1 | 2 => Act::Fail(unavailable(Some(Duration::from_secs(1)))),
        _ => Act::Reply,
    })
    .await;
    let clock = VirtualClock::default();
    let deadline = Duration::from_secs(5);
    let policy = fast()
        .with_deadline(deadline)
        .with_attempt_timeout(Duration::from_secs(10));
    let retry = retry(policy).with_timer(clock.clone());
    let started = Instant::now();
    let reply = call(retry.wrap(server.channel().await), PAY, pay_request(1))
        .await
        .unwrap();
    let real = started.elapsed();
    assert_eq!(reply.attempt, 3);

    // RetryInfo (1 s) is longer than the backoff (at most 5 ms): it set both waits.
    assert_eq!(clock.sleeps(), vec![Duration::from_secs(1); 2]);
    assert_eq!(retry.metrics().snapshot().retry_after_waits, 2);

    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    let mut slept = Duration::ZERO;
    for (i, s) in seen.iter().enumerate() {
        let sent = s.grpc_timeout.expect("every attempt carries grpc-timeout");
        // What was left when the attempt was sent: the deadline minus the virtual sleeps so
        // far minus the real time spent, which is at least zero and at most `real`.
        assert!(
            sent <= deadline - slept,
            "attempt {}: {sent:?} > {:?}",
            i + 1,
            deadline - slept
        );
        assert!(
            sent + real >= deadline - slept,
            "attempt {}: {sent:?} far below what was left",
            i + 1
        );
        if i < 2 {
            slept += clock.sleeps()[i];
        }
    }
}

#[tokio::test]
async fn a_callers_shorter_timeout_is_the_calls_deadline() {
    let server = Server::start(|n| match n {
        1 => Act::Fail(unavailable(None)),
        _ => Act::Reply,
    })
    .await;
    let retry = retry(fast().with_deadline(Duration::from_secs(30)));
    let mut request = pay_request(1);
    request.set_timeout(Duration::from_secs(2));
    call(retry.wrap(server.channel().await), PAY, request)
        .await
        .unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    for s in seen {
        let sent = s.grpc_timeout.unwrap();
        assert!(sent <= Duration::from_secs(2), "{sent:?}");
        assert!(sent > Duration::from_secs(1), "{sent:?}");
    }
}

#[tokio::test]
async fn a_retry_info_beyond_the_deadline_ends_the_call_at_once() {
    let server = Server::start(|_| Act::Fail(unavailable(Some(Duration::from_secs(60))))).await;
    let retry = retry(fast().with_deadline(Duration::from_secs(5)));
    let status = call(retry.wrap(server.channel().await), PAY, pay_request(1))
        .await
        .unwrap_err();
    assert_eq!(server.seen().len(), 1);
    // The server's own status reaches the caller, details intact; our error is under it.
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(60))
    );
    let error = retry_error(&status).expect("the RetryError under the status");
    assert_eq!(error.attempts(), 1);
    assert_eq!(error.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(error.last_grpc_code(), Some(Code::Unavailable as i32));
}

#[tokio::test]
async fn resource_exhausted_with_retry_info_is_retried_at_the_throttle_price() {
    let server = Server::start(|n| match n {
        1 => Act::Fail(Status::with_error_details(
            Code::ResourceExhausted,
            "quota refills soon",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(10))),
        )),
        _ => Act::Reply,
    })
    .await;
    let clock = VirtualClock::default();
    // 8 tokens: enough for a throttle retry (5), not for a transient one (14).
    let policy = fast().with_budget(Some(BudgetConfig::new().with_capacity(8)));
    let retry = retry(policy).with_timer(clock.clone());
    let budget = retry.budget().unwrap().clone();
    let channel = retry.wrap(server.channel().await);
    assert_eq!(call(channel, PAY, pay_request(1)).await.unwrap().attempt, 2);
    // The 10 ms RetryInfo is the lower bound of the wait (the backoff is at most 5 ms).
    assert_eq!(clock.sleeps(), vec![Duration::from_millis(10)]);
    // 5 tokens paid for the retry, refunded by its success: 8 again.
    assert_eq!(budget.available(), 8);
    assert_eq!(retry.metrics().snapshot().retries, 1);
}

#[tokio::test]
async fn a_mismatch_and_other_client_errors_are_never_retried() {
    let statuses = [
        Status::with_error_details(
            Code::FailedPrecondition,
            "key reused with another request",
            ErrorDetails::with_error_info("idempotency_key_mismatch", "oncely", []),
        ),
        // Even one that also carries RetryInfo: the machine code decides.
        Status::with_error_details(
            Code::InvalidArgument,
            "key reused with another request",
            ErrorDetails::with_error_info("idempotency_key_mismatch", "oncely", [])
                .set_retry_info(Some(Duration::from_millis(1)))
                .clone(),
        ),
        Status::invalid_argument("bad amount"),
        Status::already_exists("payment exists"),
        Status::failed_precondition("order closed"),
        Status::aborted("transaction aborted"),
        Status::resource_exhausted("message too large"),
    ];
    for expected in statuses {
        let code = expected.code();
        let message = expected.message().to_owned();
        let script = Mutex::new(Some(expected));
        let server = Server::start(move |_| {
            Act::Fail(
                script
                    .lock()
                    .unwrap()
                    .take()
                    .unwrap_or_else(|| Status::internal("retried!")),
            )
        })
        .await;
        let retry = retry(fast());
        let status = call(retry.wrap(server.channel().await), PAY, pay_request(1))
            .await
            .unwrap_err();
        assert_eq!(server.seen().len(), 1, "{code:?} {message} was retried");
        assert_eq!((status.code(), status.message()), (code, message.as_str()));
        assert_eq!(retry.metrics().snapshot().retries, 0);
    }
}

#[tokio::test]
async fn an_empty_budget_stops_retries_and_successes_refill_it() {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = failing.clone();
    let server = Server::start(move |_| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            Act::Fail(unavailable(None))
        } else {
            Act::Reply
        }
    })
    .await;
    // Room for one transient retry (14 of 20 tokens), ten attempts allowed per call.
    let policy = fast()
        .with_max_attempts(10)
        .with_budget(Some(BudgetConfig::new().with_capacity(20)));
    let retry = retry(policy);
    let channel = retry.wrap(server.channel().await);

    let status = call(channel.clone(), PAY, pay_request(1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let error = retry_error(&status).unwrap();
    assert_eq!(
        error.reason(),
        &StopReason::BudgetEmpty {
            available: 6,
            cost: 14
        }
    );
    assert_eq!(error.attempts(), 2);
    assert_eq!(server.seen().len(), 2);

    // The bucket stays empty: the next call is not retried at all.
    call(channel.clone(), PAY, pay_request(1))
        .await
        .unwrap_err();
    assert_eq!(server.seen().len(), 3);

    // Eight first-attempt successes refund 8 tokens: 6 + 8 = 14, one retry again.
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..8 {
        call(channel.clone(), PAY, pay_request(1)).await.unwrap();
    }
    assert_eq!(retry.budget().unwrap().available(), 14);
    let m = retry.metrics().snapshot();
    assert_eq!((m.budget_exhausted, m.retries), (2, 1));
}

/// One client-streaming call, which must fail and not be retried; its status.
async fn upload(
    grpc: &mut tonic::client::Grpc<oncely_client::grpc::GrpcRetryService<Channel>>,
    path: &'static str,
    messages: impl futures::Stream<Item = PayRequest> + Send + 'static,
) -> Status {
    grpc.ready().await.unwrap();
    let status = grpc
        .client_streaming::<_, PayRequest, PayReply, _>(
            tonic::Request::new(messages),
            PathAndQuery::from_static(path),
            ProstCodec::default(),
        )
        .await
        .unwrap_err();
    let error = retry_error(&status).expect("the RetryError under the status");
    assert_eq!(error.reason(), &StopReason::BodyNotReplayable);
    assert_eq!(error.attempts(), 1);
    status
}

#[tokio::test]
async fn a_client_streaming_call_is_sent_once_and_never_retried() {
    let server = Server::start(|_| Act::Fail(unavailable(None))).await;
    let retry = retry(fast());
    let mut grpc = tonic::client::Grpc::new(retry.wrap(server.channel().await));

    // Declared streaming: the stream is not buffered, the retryable failure is final.
    let messages = (1..=3).map(|amount| PayRequest {
        order: "o".into(),
        amount,
    });
    let status = upload(&mut grpc, UPLOAD, futures::stream::iter(messages)).await;
    assert_eq!(status.code(), Code::Unavailable);
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, UPLOAD);
    assert_eq!((seen[0].messages, seen[0].total), (3, 6));
    assert_eq!(seen[0].key, None);

    // Undeclared, and its stream is not complete when first read (the second message comes
    // later): sent once, whole, and not retried either.
    let slow = futures::stream::unfold(1, |n| async move {
        if n > 2 {
            return None;
        }
        if n == 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some((
            PayRequest {
                order: "o".into(),
                amount: n,
            },
            n + 1,
        ))
    });
    let status = upload(&mut grpc, STREAM_UNDECLARED, slow).await;
    assert_eq!(status.code(), Code::Unavailable);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].path, STREAM_UNDECLARED);
    assert_eq!((seen[1].messages, seen[1].total), (2, 3));
    assert_eq!(retry.metrics().snapshot().not_replayable, 2);
}

/// Removes `grpc-timeout` below our layer: a server (or proxy) that ignores deadlines, so only
/// the layer's own per-attempt limit ends a slow attempt.
type Strip = fn(http::Request<Body>) -> http::Request<Body>;

fn without_deadline_header(channel: Channel) -> tower::util::MapRequest<Channel, Strip> {
    fn strip(mut r: http::Request<Body>) -> http::Request<Body> {
        r.headers_mut().remove("grpc-timeout");
        r
    }
    tower::util::MapRequest::new(channel, strip as Strip)
}

#[tokio::test]
async fn a_timeout_after_sending_is_retried_only_with_a_key_or_an_idempotent_method() {
    let slow_first = |n| {
        if n == 1 {
            Act::Slow(Duration::from_secs(2))
        } else {
            Act::Reply
        }
    };
    let policy = fast().with_attempt_timeout(Duration::from_millis(200));

    // Keyed: retried with the same key.
    let server = Server::start(slow_first).await;
    let retry = retry(policy);
    let channel = retry.wrap(without_deadline_header(server.channel().await));
    assert_eq!(call(channel, PAY, pay_request(1)).await.unwrap().attempt, 2);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].key, seen[1].key);

    // Unkeyed (the default kind, key minting off for this method): outcome unknown, once.
    let server = Server::start(slow_first).await;
    let unkeyed = GrpcRetry::new(policy);
    let channel = unkeyed.wrap(without_deadline_header(server.channel().await));
    let status = call(channel, PAY, pay_request(1)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    let error = retry_error(&status).unwrap();
    assert!(error.is_outcome_unknown(), "{error}");
    assert_eq!(server.seen().len(), 1);
    assert_eq!(server.seen()[0].key, None);

    // Declared idempotent: retried without a key.
    let server = Server::start(slow_first).await;
    let idempotent = GrpcRetry::new(policy).with_method(PAY, GrpcMethod::idempotent());
    let channel = idempotent.wrap(without_deadline_header(server.channel().await));
    assert_eq!(call(channel, PAY, pay_request(1)).await.unwrap().attempt, 2);
    assert!(server.seen().iter().all(|s| s.key.is_none()));
}

#[tokio::test]
async fn an_invalid_caller_key_is_refused_before_anything_is_sent() {
    let server = Server::start(|_| Act::Reply).await;
    let retry = retry(fast());
    let channel = retry.wrap(server.channel().await);
    for bad in ["has space", &"k".repeat(256)] {
        let mut request = pay_request(1);
        request
            .metadata_mut()
            .insert("idempotency-key", bad.parse().unwrap());
        let status = call(channel.clone(), PAY, request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        let error = retry_error(&status).unwrap();
        assert!(
            matches!(error.reason(), StopReason::InvalidIdempotencyKey(_)),
            "{error}"
        );
        assert_eq!(error.attempts(), 0);
    }
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn a_refused_connection_was_not_sent_and_is_retried_for_any_call() {
    // A port nobody listens on (bound, then released).
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let retry = GrpcRetry::new(fast()); // PAY undeclared: unkeyed
    let status = call(retry.wrap(channel), PAY, pay_request(1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let error = retry_error(&status).unwrap();
    assert_eq!(
        error.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert_eq!(retry.metrics().snapshot().attempts, 3);
}

#[tokio::test]
async fn our_layer_twice_retries_once() {
    let server = Server::start(|_| Act::Fail(unavailable(None))).await;
    let outer = retry(fast());
    let inner = retry(fast());
    // The inner one as a tower layer, the outer one by `wrap`: the two ways in.
    let stack = tower::ServiceBuilder::new()
        .layer(inner.layer())
        .service(server.channel().await);
    let channel = outer.wrap(stack);
    call(channel, PAY, pay_request(1)).await.unwrap_err();
    assert_eq!(server.seen().len(), 3);
    assert_eq!(inner.metrics().snapshot().calls, 0);
}

#[test]
fn the_paths_are_what_the_server_routes() {
    assert!(PAY.starts_with(&format!(
        "/{}/",
        <TestService as tonic::server::NamedService>::NAME
    )));
    assert_eq!(
        GrpcRetry::default().methods().get(PAY),
        GrpcMethod::unkeyed()
    );
}

/// A proxy in front of the channel that answers the first `fakes` attempts itself, with a
/// plain HTTP status (no `grpc-status`), as a load balancer does.
#[derive(Clone)]
struct Proxy {
    channel: Channel,
    fakes: Arc<std::sync::atomic::AtomicUsize>,
    status: u16,
    retry_after: Option<&'static str>,
}

impl tower::Service<http::Request<Body>> for Proxy {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Result<http::Response<Body>, tonic::transport::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.channel, cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let fake = self
            .fakes
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if !fake {
            return Box::pin(tower::Service::call(&mut self.channel, req));
        }
        let mut response = http::Response::new(Body::empty());
        *response.status_mut() = http::StatusCode::from_u16(self.status).unwrap();
        if let Some(after) = self.retry_after {
            response
                .headers_mut()
                .insert("retry-after", after.parse().unwrap());
        }
        Box::pin(std::future::ready(Ok(response)))
    }
}

#[tokio::test]
async fn a_proxys_http_answer_follows_the_http_allowlist_and_its_retry_after() {
    let server = Server::start(|_| Act::Reply).await;
    let channel = server.channel().await;
    let proxy = |fakes, status, retry_after| Proxy {
        channel: channel.clone(),
        fakes: Arc::new(std::sync::atomic::AtomicUsize::new(fakes)),
        status,
        retry_after,
    };

    // 503 with Retry-After: retried for any call, after at least the hinted 2 s.
    let clock = VirtualClock::default();
    let retry = GrpcRetry::new(fast()).with_timer(clock.clone()); // PAY undeclared: unkeyed
    let reply = call(retry.wrap(proxy(1, 503, Some("2"))), PAY, pay_request(1))
        .await
        .unwrap();
    assert_eq!(
        reply.attempt, 1,
        "the proxy's answer never reached the server"
    );
    assert_eq!(clock.sleeps(), vec![Duration::from_secs(2)]);

    // 502 for an unkeyed call: a gateway may have forwarded it, so it is returned, once;
    // tonic maps it to UNAVAILABLE as gRPC's HTTP mapping says.
    let retry = GrpcRetry::new(fast());
    let status = call(retry.wrap(proxy(1, 502, None)), PAY, pay_request(1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(retry.metrics().snapshot().attempts, 1);
    // The same 502 on a keyed call is retried.
    let retry = self::retry(fast());
    call(retry.wrap(proxy(1, 502, None)), PAY, pay_request(1))
        .await
        .unwrap();
    assert_eq!(retry.metrics().snapshot().attempts, 2);

    // 429 on every attempt: the error carries the HTTP status.
    let retry = GrpcRetry::new(fast());
    let status = call(retry.wrap(proxy(9, 429, None)), PAY, pay_request(1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let error = retry_error(&status).unwrap();
    assert_eq!(
        error.last_status(),
        Some(http::StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(error.attempts(), 3);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn call_options_in_the_request_extensions_override_the_policy() {
    let server = Server::start(|_| Act::Fail(unavailable(None))).await;
    let retry = retry(fast());
    let channel = retry.wrap(server.channel().await);
    let mut request = pay_request(1);
    request.extensions_mut().insert(
        oncely_client::CallOptions::new()
            .with_max_attempts(1)
            .with_key_minting(false),
    );
    let status = call(channel, PAY, request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let error = retry_error(&status).unwrap();
    assert_eq!(
        error.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 1 }
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].key, None,
        "key minting was turned off for this call"
    );
}
