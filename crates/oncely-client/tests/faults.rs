//! What outside testing found, each kind of fault through a real local socket.
//!
//! Every test asserts the attempts made, the keys the server saw and the error kind the caller
//! gets; where the deadline matters, elapsed time is checked as a bound with generous margins
//! (never a tight timing).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{RawServer, Reply, Step, TestServer, chunk, head};
use oncely_client::classify::{ResponseClassifier, RetryReason, Signal};
use oncely_client::key::{KeyError, MakeIdempotencyKey};
use oncely_client::{
    CallOptions, IdempotencyKeyExt, OncelyRetry, RetryError, RetryPolicy, StopReason,
};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

/// Small delays so the suite runs fast: full jitter from 5 ms capped at 20 ms, 5 s deadline.
fn fast() -> RetryPolicy {
    RetryPolicy::new()
        .with_full_jitter(Duration::from_millis(5), Duration::from_millis(20))
        .with_deadline(Duration::from_secs(5))
        .with_attempt_timeout(Duration::from_secs(2))
}

fn client(retry: &OncelyRetry) -> ClientWithMiddleware {
    retry.clone().client().unwrap()
}

fn retry_error(result: Result<reqwest::Response, reqwest_middleware::Error>) -> RetryError {
    match result {
        Ok(r) => panic!("expected an error, got {}", r.status()),
        Err(reqwest_middleware::Error::Middleware(inner)) => match inner.downcast::<RetryError>() {
            Ok(e) => e,
            Err(other) => panic!("not a RetryError: {other:#}"),
        },
        Err(reqwest_middleware::Error::Reqwest(e)) => panic!("raw reqwest error: {e}"),
    }
}

fn keys(seen: &[common::RawSeen]) -> Vec<Option<String>> {
    seen.iter().map(|s| s.key.clone()).collect()
}

fn problem_head(status: &str, length: Option<usize>) -> Vec<u8> {
    let cl = length.map(|n| format!("content-length: {n}"));
    let mut headers = vec!["content-type: application/problem+json"];
    match &cl {
        Some(cl) => headers.push(cl),
        None => headers.push("transfer-encoding: chunked"),
    }
    head(status, &headers)
}

fn created() -> Vec<Step> {
    vec![Step::Write(
        [head("201 Created", &["content-length: 2"]), b"ok".to_vec()].concat(),
    )]
}

// ---------------------------------------------------------------------------------------------
// 1. A retryable status with a broken body: the status decides.

#[tokio::test]
async fn i1_cut_off_503_body_is_retried_with_the_same_key() {
    let server = RawServer::start(|n, _| {
        if n == 1 {
            // Promises 200 bytes, sends 18, closes.
            vec![Step::Write(
                [
                    problem_head("503 Service Unavailable", Some(200)),
                    br#"{"type":"about:bl"#.to_vec(),
                ]
                .concat(),
            )]
        } else {
            created()
        }
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let response = client(&retry)
        .post(server.url("/pay"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.text().await.unwrap(), "ok");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let key = seen[0].key.clone().expect("a minted key");
    assert_eq!(keys(&seen), vec![Some(key.clone()), Some(key)]);
    assert_eq!(retry.metrics().snapshot().retries, 1);
}

#[tokio::test]
async fn i1_stalled_503_body_is_retried_within_the_attempt_limit() {
    let server = RawServer::start(|n, _| {
        if n == 1 {
            vec![
                Step::Write(problem_head("503 Service Unavailable", Some(100))),
                Step::Sleep(Duration::from_secs(30)),
            ]
        } else {
            created()
        }
    })
    .await;
    let retry = OncelyRetry::new(fast().with_attempt_timeout(Duration::from_millis(300)));
    let started = Instant::now();
    let response = client(&retry)
        .post(server.url("/pay"))
        .idempotency_key("order-confirm-1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let seen = server.seen();
    assert_eq!(
        keys(&seen),
        vec![
            Some("order-confirm-1".into()),
            Some("order-confirm-1".into())
        ]
    );
}

#[tokio::test]
async fn i1_stalled_body_with_the_deadline_gone_is_deadline_exhausted() {
    let server = RawServer::start(|_, _| {
        vec![
            Step::Write(problem_head("503 Service Unavailable", Some(100))),
            Step::Write(br#"{"retryable":"#.to_vec()),
            Step::Sleep(Duration::from_secs(30)),
        ]
    })
    .await;
    let deadline = Duration::from_millis(400);
    let retry = OncelyRetry::new(fast().with_deadline(deadline));
    let started = Instant::now();
    let err = retry_error(
        client(&retry)
            .post(server.url("/pay"))
            .body("{}")
            .send()
            .await,
    );
    let took = started.elapsed();
    assert_eq!(
        err.reason(),
        &StopReason::DeadlineExhausted { deadline },
        "{err}"
    );
    assert_eq!(
        err.last_status(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE),
        "{err}"
    );
    // The body read ran into the deadline; at most one more sliver of an attempt after it.
    assert!((1..=2).contains(&err.attempts()), "{err}");
    assert_eq!(server.seen().len() as u32, err.attempts());
    assert!(took < deadline + Duration::from_secs(1), "took {took:?}");
    let key = server.seen()[0].key.clone();
    assert!(key.is_some());
    assert_eq!(err.idempotency_key(), key.as_deref());
}

#[tokio::test]
async fn i1_chunked_problem_json_is_read_for_its_fields() {
    let server = RawServer::start(|n, s| match s.path.as_str() {
        "/maintenance" => vec![Step::Write(
            [
                problem_head("503 Service Unavailable", None),
                chunk(br#"{"type":"about:blank","code":"maintenance","#),
                chunk(br#""retryable":false}"#),
                b"0\r\n\r\n".to_vec(),
            ]
            .concat(),
        )],
        _ if n == 2 => vec![Step::Write(
            [
                problem_head("409 Conflict", None),
                chunk(br#"{"code":"idempotency_request_in_flight","retryable":true}"#),
                b"0\r\n\r\n".to_vec(),
            ]
            .concat(),
        )],
        _ => created(),
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);

    // The server's "do not retry" arrives in a chunked body: read, obeyed, handed back intact.
    let response = c.get(server.url("/maintenance")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "maintenance");
    assert_eq!(server.seen().len(), 1);

    // The in-flight conflict, chunked, is recognised by its code and retried with the same key.
    let response = c.post(server.url("/pay")).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 201);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen[1].key.is_some());
    assert_eq!(seen[1].key, seen[2].key);
}

#[tokio::test]
async fn i1_oversized_chunked_body_is_not_inspected_and_handed_back_whole() {
    let big = {
        let mut b = br#"{"retryable":false,"pad":""#.to_vec();
        b.resize(100 * 1024, b'x');
        b.extend_from_slice(br#""}"#);
        b
    };
    let sent = big.clone();
    let server = RawServer::start(move |_, _| {
        let mut steps = vec![problem_head("500 Internal Server Error", None)];
        for part in sent.chunks(8 * 1024) {
            steps.push(chunk(part));
        }
        steps.push(b"0\r\n\r\n".to_vec());
        vec![Step::Write(steps.concat())]
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let response = client(&retry).get(server.url("/big")).send().await.unwrap();
    assert_eq!(response.status(), 500);
    let body = response.bytes().await.unwrap();
    assert_eq!(body.len(), big.len());
    assert_eq!(body.as_ref(), big.as_slice());
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn i1_returned_response_with_a_cut_off_body_still_errors_when_read() {
    let server = RawServer::start(|_, _| {
        vec![Step::Write(
            [
                problem_head("500 Internal Server Error", Some(100)),
                br#"{"code":"bug","#.to_vec(),
            ]
            .concat(),
        )]
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let response = client(&retry).get(server.url("/bug")).send().await.unwrap();
    // 500 is not retried by default: the response is returned, its broken body stays broken.
    assert_eq!(response.status(), 500);
    assert!(response.bytes().await.is_err());
    assert_eq!(server.seen().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// 2. Stacked retry layers do not multiply.

#[tokio::test]
async fn i2_our_layer_twice_makes_the_policy_attempts_not_nine() {
    let server = TestServer::start(|_| Reply::status(503)).await;
    let outer = OncelyRetry::new(fast());
    let inner = OncelyRetry::new(fast());
    for with_guard in [true, false] {
        let mut builder = ClientBuilder::new(reqwest::Client::new())
            .with(outer.clone())
            .with(inner.clone());
        if with_guard {
            builder = builder.with(outer.guard());
        }
        let path = format!("/twice-{with_guard}");
        let err = retry_error(
            builder
                .build()
                .post(server.url(&path))
                .body("{}")
                .send()
                .await,
        );
        assert_eq!(
            err.reason(),
            &StopReason::AttemptsExhausted { max_attempts: 3 }
        );
        assert_eq!(err.attempts(), 3);
        assert_eq!(
            err.last_status(),
            Some(http::StatusCode::SERVICE_UNAVAILABLE)
        );
        let seen = server.seen_on(&path);
        assert_eq!(seen.len(), 3, "with_guard={with_guard}");
        let key = seen[0].key.clone().expect("one minted key");
        assert!(seen.iter().all(|s| s.key.as_deref() == Some(key.as_str())));
        assert_eq!(err.idempotency_key(), Some(key.as_str()));
    }
    // The inner instance passed every attempt through: it made none of its own.
    assert_eq!(inner.metrics().snapshot().attempts, 0);
    assert_eq!(inner.metrics().snapshot().keys_minted, 0);
    assert_eq!(outer.metrics().snapshot().attempts, 6);
}

#[tokio::test]
async fn i2_stacked_keyless_timeout_names_the_root_cause() {
    let server = TestServer::start(|_| Reply::status(202).after(Duration::from_secs(3))).await;
    let policy = fast()
        .with_key_minting(false)
        .with_attempt_timeout(Duration::from_millis(200));
    let (a, b) = (OncelyRetry::new(policy), OncelyRetry::new(policy));
    let c = ClientBuilder::new(reqwest::Client::new())
        .with(a.clone())
        .with(b)
        .with(a.guard())
        .build();
    let err = retry_error(c.post(server.url("/submit")).body("job").send().await);
    // Not "not retryable" wrapping the inner layer's verdict: the caller sees the root cause.
    assert_eq!(err.reason(), &StopReason::OutcomeUnknown, "{err}");
    assert_eq!(err.attempts(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seen = server.seen_on("/submit");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].key, None);
}

#[tokio::test]
async fn i2_stacked_deadline_holds_for_the_whole_stack() {
    let server = TestServer::start(|_| Reply::status(200).after(Duration::from_secs(5))).await;
    let deadline = Duration::from_millis(300);
    let policy = fast()
        .with_max_attempts(10)
        .with_deadline(deadline)
        .with_attempt_timeout(Duration::from_millis(120));
    let (a, b) = (OncelyRetry::new(policy), OncelyRetry::new(policy));
    let c = ClientBuilder::new(reqwest::Client::new())
        .with(a.clone())
        .with(b)
        .with(a.guard())
        .build();
    let started = Instant::now();
    let err = retry_error(c.get(server.url("/hang")).send().await);
    assert_eq!(
        err.reason(),
        &StopReason::DeadlineExhausted { deadline },
        "{err}"
    );
    assert!((3..=4).contains(&err.attempts()), "{err}");
    assert!(started.elapsed() < deadline + Duration::from_secs(1));
    assert_eq!(server.count("/hang") as u32, err.attempts());
}

fn reqwest_retry_layer(
    retries: u32,
) -> reqwest_retry::RetryTransientMiddleware<reqwest_retry::policies::ExponentialBackoff> {
    let policy = reqwest_retry::policies::ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(5))
        .build_with_max_retries(retries);
    reqwest_retry::RetryTransientMiddleware::new_with_policy(policy)
}

#[tokio::test]
async fn i2_reqwest_retry_inside_ours_is_caught_by_the_guard() {
    let server = TestServer::start(|_| Reply::status(503)).await;
    let retry = OncelyRetry::new(fast());
    let c = ClientBuilder::new(reqwest::Client::new())
        .with(retry.clone())
        .with(reqwest_retry_layer(5))
        .with(retry.guard())
        .build();
    let err = retry_error(c.post(server.url("/nested")).body("{}").send().await);
    // The guard let the call's 3 requests out and refused the 4th; our layer saw one attempt
    // turn into 3 requests and stopped, naming the nested layer and the last status.
    assert_eq!(
        err.reason(),
        &StopReason::NestedRetryLayer { requests: 3 },
        "{err}"
    );
    assert_eq!(err.attempts(), 3);
    assert_eq!(
        err.last_status(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert!(err.to_string().contains("not supported"), "{err}");
    let seen = server.seen_on("/nested");
    assert_eq!(seen.len(), 3);
    let key = seen[0].key.clone().expect("a minted key");
    assert!(seen.iter().all(|s| s.key.as_deref() == Some(key.as_str())));
    assert_eq!(retry.metrics().snapshot().attempts, 1);
}

#[tokio::test]
async fn i2_reqwest_retry_inside_ours_respects_the_deadline() {
    let server = TestServer::start(|_| Reply::status(200).after(Duration::from_secs(5))).await;
    let deadline = Duration::from_millis(300);
    let retry = OncelyRetry::new(
        fast()
            .with_deadline(deadline)
            .with_attempt_timeout(Duration::from_millis(100)),
    );
    let c = ClientBuilder::new(reqwest::Client::new())
        .with(retry.clone())
        .with(reqwest_retry_layer(5))
        .with(retry.guard())
        .build();
    let started = Instant::now();
    let err = retry_error(c.get(server.url("/hang")).send().await);
    // Whichever bound stops it first, the whole stack stays inside the deadline and the cap.
    assert!(started.elapsed() < deadline + Duration::from_secs(1));
    assert!(err.attempts() <= 3, "{err}");
    assert!(
        matches!(
            err.reason(),
            StopReason::DeadlineExhausted { .. }
                | StopReason::NestedRetryLayer { .. }
                | StopReason::AttemptsExhausted { max_attempts: 3 }
        ),
        "{err}"
    );
    assert!(server.count("/hang") <= 3, "{}", server.count("/hang"));
}

/// What happens without the guard: nothing can see the inner layer and the attempts multiply
/// (3 x 3 = 9). This is why combining two retry layers is documented as unsupported, and why
/// `wrap` and `client` always install the guard.
#[tokio::test]
async fn i2_without_the_guard_reqwest_retry_inside_ours_multiplies() {
    let server = TestServer::start(|_| Reply::status(503)).await;
    let retry = OncelyRetry::new(fast());
    let c = ClientBuilder::new(reqwest::Client::new())
        .with(retry.clone())
        .with(reqwest_retry_layer(2))
        .build();
    let err = retry_error(c.post(server.url("/blind")).body("{}").send().await);
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert_eq!(server.count("/blind"), 9);
}

// ---------------------------------------------------------------------------------------------
// 3. x-should-retry and Stripe-Should-Retry, after problem+json `retryable`.

#[tokio::test]
async fn i3_should_retry_false_stops_a_retryable_status() {
    let server = TestServer::start(|s| match s.path.as_str() {
        "/x" => Reply::status(503).header("x-should-retry", "false"),
        "/stripe" => Reply::status(429).header("stripe-should-retry", "FALSE"),
        _ => Reply::status(503).header("x-should-retry", "maybe"),
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    for (path, status) in [("/x", 503), ("/stripe", 429)] {
        let r = c.post(server.url(path)).body("{}").send().await.unwrap();
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(server.count(path), 1, "{path}");
        assert!(server.seen_on(path)[0].key.is_some());
    }
    // A malformed value counts as absent: the allowlist retries the 503.
    let err = retry_error(c.get(server.url("/garbled")).send().await);
    assert_eq!(err.attempts(), 3);
    assert_eq!(server.count("/garbled"), 3);
}

#[tokio::test]
async fn i3_should_retry_true_forces_a_retry_for_safe_requests_only() {
    let server = TestServer::start(|s| match s.path.as_str() {
        "/stripe" => Reply::status(400).header("stripe-should-retry", "true"),
        _ => Reply::status(500).header("x-should-retry", "true"),
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);

    // A GET and a keyed POST: the 500 the allowlist would return is retried.
    let err = retry_error(c.get(server.url("/get")).send().await);
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert_eq!(
        err.last_status(),
        Some(http::StatusCode::INTERNAL_SERVER_ERROR)
    );
    assert_eq!(server.count("/get"), 3);
    let err = retry_error(c.post(server.url("/keyed")).body("{}").send().await);
    assert_eq!(err.attempts(), 3);
    let seen = server.seen_on("/keyed");
    assert_eq!(seen.len(), 3);
    assert!(seen[0].key.is_some() && seen.iter().all(|s| s.key == seen[0].key));
    let err = retry_error(c.delete(server.url("/stripe")).send().await);
    assert_eq!(err.attempts(), 3);
    assert_eq!(server.count("/stripe"), 3);

    // A keyless POST answered 500 may have run: `true` does not make it safe to repeat.
    let r = c
        .post(server.url("/keyless"))
        .body("{}")
        .with_extension(CallOptions::new().with_key_minting(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let seen = server.seen_on("/keyless");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].key, None);
}

#[tokio::test]
async fn i3_precedence_problem_then_x_should_retry_then_stripe() {
    let server = TestServer::start(|s| match s.path.as_str() {
        // problem+json `retryable: true` beats x-should-retry: false.
        "/problem-first" => Reply::status(503)
            .problem("busy", true)
            .header("x-should-retry", "false"),
        // x-should-retry: true beats Stripe-Should-Retry: false.
        "/x-second" => Reply::status(503)
            .header("x-should-retry", "true")
            .header("stripe-should-retry", "false"),
        // Without the other two, Stripe-Should-Retry: false is obeyed.
        _ => Reply::status(503).header("stripe-should-retry", "false"),
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    for (path, attempts) in [("/problem-first", 3), ("/x-second", 3), ("/stripe-last", 1)] {
        let r = c.get(server.url(path)).send().await;
        let made = match r {
            Ok(response) => {
                assert_eq!(response.status(), 503);
                1
            }
            Err(e) => retry_error(Err(e)).attempts(),
        };
        assert_eq!(made, attempts, "{path}");
        assert_eq!(server.count(path), attempts as usize, "{path}");
    }
}

#[tokio::test]
async fn i3_should_retry_true_stays_within_the_budget_and_the_deadline() {
    let server = TestServer::start(|s| match s.path.as_str() {
        "/slow" => Reply::status(500)
            .header("x-should-retry", "true")
            .header("retry-after", "60"),
        _ => Reply::status(500).header("x-should-retry", "true"),
    })
    .await;
    let retry = OncelyRetry::new(
        fast()
            .with_max_attempts(10)
            .with_budget(Some(oncely_client::BudgetConfig::new().with_capacity(14))),
    );
    let c = client(&retry);
    let err = retry_error(c.get(server.url("/forced")).send().await);
    assert_eq!(
        err.reason(),
        &StopReason::BudgetEmpty {
            available: 0,
            cost: 14
        }
    );
    assert_eq!(server.count("/forced"), 2);

    let started = Instant::now();
    let fresh = OncelyRetry::new(fast());
    let err = retry_error(client(&fresh).get(server.url("/slow")).send().await);
    assert!(matches!(
        err.reason(),
        StopReason::RetryAfterBeyondDeadline { .. }
    ));
    assert_eq!(server.count("/slow"), 1);
    assert!(started.elapsed() < Duration::from_secs(5));
}

// ---------------------------------------------------------------------------------------------
// 4. Caller keys are checked with the server's rules before anything is sent.

#[derive(Debug)]
struct BadKeys;

impl MakeIdempotencyKey for BadKeys {
    fn make_key(&self) -> String {
        "k".repeat(256)
    }
}

#[tokio::test]
async fn i4_invalid_caller_keys_are_refused_before_sending() {
    let server = TestServer::start(|_| Reply::status(201)).await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    let long = "a".repeat(300);
    for (key, expected) in [
        ("", KeyError::Empty),
        (long.as_str(), KeyError::TooLong(300)),
        ("has space", KeyError::NotVisibleAscii(3)),
        ("\"unterminated", KeyError::BadQuoting),
    ] {
        let err = retry_error(
            c.post(server.url("/pay"))
                .idempotency_key(key)
                .body("{}")
                .send()
                .await,
        );
        assert_eq!(
            err.reason(),
            &StopReason::InvalidIdempotencyKey(expected),
            "{key:?}"
        );
        assert_eq!(err.attempts(), 0);
        assert!(err.to_string().contains("nothing sent"), "{err}");
    }
    // The header sent twice is ambiguous, as on the server.
    let err = retry_error(
        c.post(server.url("/pay"))
            .header("idempotency-key", "a")
            .header("idempotency-key", "b")
            .body("{}")
            .send()
            .await,
    );
    assert_eq!(
        err.reason(),
        &StopReason::InvalidIdempotencyKey(KeyError::Repeated(2))
    );
    assert_eq!(server.count("/pay"), 0, "nothing was sent");

    // A key maker that mints invalid keys is caught the same way.
    let bad = OncelyRetry::new(fast()).with_key_maker(BadKeys);
    let err = retry_error(
        client(&bad)
            .post(server.url("/pay"))
            .body("{}")
            .send()
            .await,
    );
    assert_eq!(
        err.reason(),
        &StopReason::InvalidIdempotencyKey(KeyError::TooLong(256))
    );
    assert_eq!(server.count("/pay"), 0);

    // Valid keys pass, the structured-field quoted form included, and are sent verbatim.
    for key in ["order-confirm-42", "\"order-confirm-43\"", &"z".repeat(255)] {
        let r = c
            .post(server.url("/ok"))
            .idempotency_key(key)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let seen: Vec<_> = server.seen_on("/ok").into_iter().map(|s| s.key).collect();
    assert_eq!(seen[0].as_deref(), Some("order-confirm-42"));
    assert_eq!(seen[1].as_deref(), Some("\"order-confirm-43\""));
    assert_eq!(seen[2].as_ref().map(String::len), Some(255));
}

// ---------------------------------------------------------------------------------------------
// 5. Connecting is not sending.

/// A listener on 127.0.0.1 whose accept queue is full: a new connect is never answered (the
/// SYN is dropped), the black hole of a dead host, without leaving loopback.
async fn black_hole() -> (
    std::net::SocketAddr,
    Vec<tokio::net::TcpStream>,
    tokio::net::TcpListener,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    // Fill the queue (backlog 0 holds one); never accept.
    let mut fillers = Vec::new();
    for _ in 0..2 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(stream)) => fillers.push(stream),
            _ => break,
        }
    }
    (addr, fillers, listener)
}

#[tokio::test]
async fn i5_black_hole_connect_is_not_sent_and_retried_for_a_keyless_post() {
    let (addr, _fillers, _listener) = black_hole().await;
    let retry = OncelyRetry::new(
        fast()
            .with_key_minting(false)
            .with_connect_timeout(Duration::from_millis(150)),
    );
    let started = Instant::now();
    let err = retry_error(
        client(&retry)
            .post(format!("http://{addr}/submit"))
            .body("job")
            .send()
            .await,
    );
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 },
        "{err}"
    );
    assert_eq!(err.attempts(), 3);
    let source = std::error::Error::source(&err).expect("the connect error");
    let source = source
        .downcast_ref::<reqwest::Error>()
        .expect("a reqwest error");
    assert!(source.is_connect() && source.is_timeout(), "{source}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(retry.metrics().snapshot().outcome_unknown, 0);
}

#[tokio::test]
async fn i5_the_default_connect_timeout_fits_inside_the_attempt_timeout() {
    let policy = RetryPolicy::new();
    assert_eq!(policy.connect_timeout(), Duration::from_secs(3));
    assert!(policy.connect_timeout() <= policy.attempt_timeout());
    let short = RetryPolicy::new().with_attempt_timeout(Duration::from_millis(500));
    assert_eq!(short.connect_timeout(), Duration::from_millis(500));
}

#[tokio::test]
async fn i5_nothing_listening_is_not_sent_and_retried_for_a_keyless_post() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let retry = OncelyRetry::new(fast().with_key_minting(false));
    let err = retry_error(
        client(&retry)
            .patch(format!("http://{addr}/orders/1"))
            .body("x")
            .send()
            .await,
    );
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.idempotency_key(), None);
    let source = std::error::Error::source(&err).unwrap();
    assert!(
        source
            .downcast_ref::<reqwest::Error>()
            .is_some_and(|e| e.is_connect())
    );
}

#[derive(Debug)]
struct NoDns(Arc<AtomicUsize>);

impl reqwest::dns::Resolve for NoDns {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Err::<reqwest::dns::Addrs, _>(Box::new(std::io::Error::other("no such host"))
                as Box<dyn std::error::Error + Send + Sync>)
        })
    }
}

#[tokio::test]
async fn i5_dns_failure_is_not_sent_and_retried_for_a_keyless_post() {
    let lookups = Arc::new(AtomicUsize::new(0));
    let retry = OncelyRetry::new(fast().with_key_minting(false));
    let http = retry
        .client_builder()
        .dns_resolver(Arc::new(NoDns(lookups.clone())))
        .build()
        .unwrap();
    let err = retry_error(
        retry
            .clone()
            .wrap(http)
            .post("http://payments.example.invalid/submit")
            .body("job")
            .send()
            .await,
    );
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 },
        "{err}"
    );
    assert_eq!(err.attempts(), 3);
    assert_eq!(lookups.load(Ordering::SeqCst), 3);
}

// ---------------------------------------------------------------------------------------------
// 6. Per-call control: key minting and a response hook.

#[tokio::test]
async fn i6_key_minting_per_call() {
    let server = TestServer::start(|s| {
        if s.nth_path == 1 {
            Reply::status(503)
        } else {
            Reply::status(201)
        }
    })
    .await;
    // The policy mints; this call does not: its 503 is still retried (the server did not run
    // it), without a key.
    let minting = OncelyRetry::new(fast());
    let r = client(&minting)
        .post(server.url("/no-key"))
        .body("{}")
        .with_extension(CallOptions::new().with_key_minting(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let seen = server.seen_on("/no-key");
    assert_eq!(
        seen.iter().map(|s| s.key.clone()).collect::<Vec<_>>(),
        vec![None, None]
    );

    // The policy does not mint; this call does: both attempts carry one key.
    let plain = OncelyRetry::new(fast().with_key_minting(false));
    let r = client(&plain)
        .post(server.url("/key"))
        .body("{}")
        .with_extension(CallOptions::new().with_key_minting(true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let seen = server.seen_on("/key");
    assert_eq!(seen.len(), 2);
    assert!(seen[0].key.is_some());
    assert_eq!(seen[0].key, seen[1].key);
    assert_eq!(plain.metrics().snapshot().keys_minted, 1);

    // Without a key, a timeout after sending is an unknown outcome, per call.
    let hang = TestServer::start(|_| Reply::status(201).after(Duration::from_secs(3))).await;
    let err = retry_error(
        client(&minting)
            .post(hang.url("/submit"))
            .body("{}")
            .timeout(Duration::from_millis(150))
            .with_extension(CallOptions::new().with_key_minting(false))
            .send()
            .await,
    );
    assert_eq!(err.reason(), &StopReason::OutcomeUnknown);
    assert_eq!(err.attempts(), 1);
}

#[tokio::test]
async fn i6_response_hook_adds_a_signal_and_keeps_the_defaults() {
    let server = TestServer::start(|s| match s.path.as_str() {
        "/teapot-busy" => Reply::status(418).header("x-acme-busy", "1"),
        "/final" => Reply::status(503).header("x-acme-final", "1"),
        "/unavailable" => Reply::status(503),
        "/overridden" => Reply::status(418).header("x-acme-busy", "1"),
        _ => Reply::status(400),
    })
    .await;
    let hook = ResponseClassifier::new(|r| {
        if r.headers.contains_key("x-acme-busy") {
            Some(true)
        } else if r.headers.contains_key("x-acme-final") {
            Some(false)
        } else {
            None
        }
    });
    let retry = OncelyRetry::new(fast()).with_classifier(hook);
    let c = client(&retry);
    for (path, attempts) in [
        ("/teapot-busy", 3), // the hook's signal: retried
        ("/final", 1),       // the hook's "do not retry" beats the allowlist
        ("/unavailable", 3), // no opinion: the allowlist still retries a 503
        ("/bad", 1),         // no opinion: the allowlist still returns a 400
    ] {
        let made = match c.get(server.url(path)).send().await {
            Ok(_) => 1,
            Err(e) => retry_error(Err(e)).attempts(),
        };
        assert_eq!(made, attempts, "{path}");
        assert_eq!(server.count(path), attempts as usize, "{path}");
    }
    let err = retry_error(c.get(server.url("/teapot-busy")).send().await);
    assert_eq!(err.last_status(), Some(http::StatusCode::IM_A_TEAPOT));

    // A per-call hook replaces the middleware's for that call.
    let r = c
        .get(server.url("/overridden"))
        .with_extension(CallOptions::new().with_classifier(ResponseClassifier::new(|_| None)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 418);
    assert_eq!(server.count("/overridden"), 1);
    // The hook's `true` is marked as such in the retry reason.
    let reason = RetryReason::ServerAsked {
        status: http::StatusCode::IM_A_TEAPOT,
        signal: Signal::Caller,
    };
    assert!(reason.to_string().contains("classifier"));
}

// ---------------------------------------------------------------------------------------------
// 7. A call dropped during its backoff sleep gives back the tokens of the retry it never made.

#[tokio::test]
async fn i7_cancelled_during_backoff_refunds_the_budget() {
    let server = TestServer::start(|_| Reply::status(503).header("retry-after", "30")).await;
    let retry = OncelyRetry::new(fast().with_deadline(Duration::from_secs(60)));
    let budget = retry.budget().unwrap().clone();
    assert_eq!(budget.available(), 500);
    let c = client(&retry);
    let url = server.url("/pay");
    let call = tokio::spawn(async move { c.post(url).body("{}").send().await });
    // Wait (bounded) until the retry is paid for and the call sleeps its 30 s.
    let mut waited = Duration::ZERO;
    while budget.available() != 486 {
        assert!(
            waited < Duration::from_secs(5),
            "the retry was never planned"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    assert_eq!(retry.metrics().snapshot().retries, 1);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(
        budget.available(),
        500,
        "the unused retry's 14 tokens are back"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let seen = server.seen_on("/pay");
    assert_eq!(seen.len(), 1, "the retry never went out");
    assert!(seen[0].key.is_some());
}

#[tokio::test]
async fn i7_a_retry_that_is_made_keeps_its_cost() {
    let server = TestServer::start(|s| {
        if s.nth_path == 1 {
            Reply::status(503)
        } else {
            Reply::status(502)
        }
    })
    .await;
    let retry = OncelyRetry::new(fast().with_max_attempts(2));
    let budget = retry.budget().unwrap().clone();
    let err = retry_error(client(&retry).get(server.url("/down")).send().await);
    assert_eq!(err.attempts(), 2);
    // The retry went out (and failed): its 14 tokens stay spent.
    assert_eq!(budget.available(), 486);
}
