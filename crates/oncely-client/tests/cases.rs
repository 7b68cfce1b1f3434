//! Every client failure scenario of docs/DESIGN.md, "Failure scenarios we hold to" (from "POST
//! retried without a key" on), against a real local axum server.
//!
//! Real time with small delays where the server is involved; a virtual clock where a wait is
//! too long to sleep for (C3's 120-second `Retry-After`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use common::{DateForm, Reply, TestServer, VirtualClock, http_date_in};
use oncely_client::backoff::Backoff;
use oncely_client::{
    CallOptions, IdempotencyKeyExt, OncelyRetry, RetryError, RetryPolicy, StopReason,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use reqwest_middleware::ClientWithMiddleware;

/// Small delays so the suite runs fast: full jitter from 5 ms capped at 20 ms, 5 s deadline.
fn fast() -> RetryPolicy {
    RetryPolicy::new()
        .with_full_jitter(Duration::from_millis(5), Duration::from_millis(20))
        .with_deadline(Duration::from_secs(5))
        .with_attempt_timeout(Duration::from_secs(2))
}

fn client(retry: &OncelyRetry) -> ClientWithMiddleware {
    retry.clone().wrap(reqwest::Client::new())
}

fn retry_error(result: Result<reqwest::Response, reqwest_middleware::Error>) -> RetryError {
    match result {
        Ok(r) => panic!("expected an error, got {}", r.status()),
        Err(e) => match e {
            reqwest_middleware::Error::Middleware(inner) => match inner.downcast::<RetryError>() {
                Ok(e) => e,
                Err(other) => panic!("not a RetryError: {other}"),
            },
            reqwest_middleware::Error::Reqwest(e) => panic!("raw reqwest error: {e}"),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// C1. A keyless POST that timed out after sending is not retried: outcome unknown. With a key
// (minted automatically) it is retried with the same key.

#[tokio::test]
async fn c1_keyless_post_timeout_is_outcome_unknown_and_not_resent() {
    let server = TestServer::start(|_| Reply::status(202).after(Duration::from_secs(3))).await;
    let retry = OncelyRetry::new(
        fast()
            .with_key_minting(false)
            .with_attempt_timeout(Duration::from_millis(200)),
    );
    let started = Instant::now();
    let result = client(&retry)
        .post(server.url("/submit"))
        .body("job")
        .send()
        .await;
    let err = retry_error(result);
    assert_eq!(err.reason(), &StopReason::OutcomeUnknown);
    assert!(err.is_outcome_unknown());
    assert_eq!(err.attempts(), 1);
    assert!(err.to_string().contains("outcome unknown"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // Give a wrongly scheduled retry time to show up before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seen = server.seen_on("/submit");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].key, None);
    assert_eq!(retry.metrics().snapshot().outcome_unknown, 1);
}

#[tokio::test]
async fn c1_minted_key_timeout_is_retried_with_the_same_key() {
    let server = TestServer::start(|s| {
        if s.nth_path == 1 {
            Reply::status(201).after(Duration::from_secs(3))
        } else {
            Reply::status(201)
        }
    })
    .await;
    let retry = OncelyRetry::new(fast().with_attempt_timeout(Duration::from_millis(200)));
    let response = client(&retry)
        .post(server.url("/submit"))
        .body("job")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let seen = server.seen_on("/submit");
    assert_eq!(seen.len(), 2);
    let key = seen[0].key.clone().expect("a minted key");
    assert_eq!(key.len(), 36, "a UUID v4: {key}");
    assert_eq!(seen[1].key.as_deref(), Some(key.as_str()));
}

/// A raw TCP server that reads a request and closes the connection without answering: a reset
/// after sending.
async fn resetting_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let c = c.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                if let Ok(n) = socket.read(&mut buf).await
                    && n > 0
                {
                    c.fetch_add(1, Ordering::SeqCst);
                }
                drop(socket);
            });
        }
    });
    (format!("http://{addr}"), count)
}

#[tokio::test]
async fn c1_reset_after_sending_depends_on_safety() {
    let (base, count) = resetting_server().await;
    let retry = OncelyRetry::new(fast().with_key_minting(false));
    let c = client(&retry);

    let err = retry_error(c.post(format!("{base}/submit")).body("x").send().await);
    assert_eq!(err.reason(), &StopReason::OutcomeUnknown, "{err}");
    assert_eq!(err.attempts(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // A GET (idempotent) is retried up to the attempt limit.
    let err = retry_error(c.get(format!("{base}/report")).send().await);
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 },
        "{err}"
    );
    assert_eq!(err.attempts(), 3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(count.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn connection_refused_before_sending_is_retried_even_for_a_keyless_post() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let retry = OncelyRetry::new(fast().with_key_minting(false));
    let err = retry_error(
        client(&retry)
            .post(format!("http://{addr}/submit"))
            .body("x")
            .send()
            .await,
    );
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert_eq!(err.attempts(), 3);
    let source = std::error::Error::source(&err).expect("the connect error");
    assert!(
        source
            .downcast_ref::<reqwest::Error>()
            .is_some_and(|e| e.is_connect()),
        "{source}"
    );
}

// ---------------------------------------------------------------------------------------------
// C2. Every attempt of one logical call carries the identical key; a new call gets a new one.

#[tokio::test]
async fn c2_one_key_per_logical_call_reused_on_every_attempt() {
    let server = TestServer::start(|s| {
        if s.nth_key < 3 {
            Reply::status(503)
        } else {
            Reply::status(201)
        }
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    for _ in 0..2 {
        let r = c.post(server.url("/pay")).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 201);
    }
    let seen = server.seen_on("/pay");
    assert_eq!(seen.len(), 6);
    let first = seen[0].key.clone().unwrap();
    let second = seen[3].key.clone().unwrap();
    assert_ne!(first, second, "a new logical call gets a new key");
    for s in &seen[..3] {
        assert_eq!(s.key.as_deref(), Some(first.as_str()));
    }
    for s in &seen[3..] {
        assert_eq!(s.key.as_deref(), Some(second.as_str()));
    }
    assert_eq!(retry.metrics().snapshot().keys_minted, 2);
}

#[tokio::test]
async fn c2_caller_key_is_used_verbatim_and_nothing_is_minted() {
    let server = TestServer::start(|s| {
        if s.nth_path == 1 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let r = client(&retry)
        .patch(server.url("/orders/42"))
        .idempotency_key("order-confirm-42")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = server.seen_on("/orders/42");
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|s| s.key.as_deref() == Some("order-confirm-42"))
    );
    assert_eq!(retry.metrics().snapshot().keys_minted, 0);

    // Idempotent methods get no key minted.
    let _ = client(&retry)
        .put(server.url("/put"))
        .body("{}")
        .send()
        .await;
    assert_eq!(server.seen_on("/put")[0].key, None);
}

// ---------------------------------------------------------------------------------------------
// C3. Retry-After as a date: the wait is about 120 s when that fits; all three forms accepted.

async fn c3_with(
    value: String,
    deadline: Duration,
) -> (
    Result<reqwest::Response, reqwest_middleware::Error>,
    VirtualClock,
    TestServer,
) {
    let server = TestServer::start(move |s| {
        if s.nth_path == 1 {
            Reply::status(503).header("retry-after", value.clone())
        } else {
            Reply::status(200)
        }
    })
    .await;
    let clock = VirtualClock::default();
    let retry = OncelyRetry::new(fast().with_deadline(deadline)).with_timer(clock.clone());
    let result = client(&retry).get(server.url("/slow-down")).send().await;
    (result, clock, server)
}

#[tokio::test]
async fn c3_retry_after_http_date_in_all_three_forms_waits_about_120_s() {
    for form in [DateForm::Imf, DateForm::Rfc850, DateForm::Asctime] {
        let value = http_date_in(120, form);
        let (result, clock, server) = c3_with(value.clone(), Duration::from_secs(300)).await;
        assert_eq!(result.unwrap().status(), 200, "{value}");
        assert_eq!(server.count("/slow-down"), 2);
        let sleeps = clock.sleeps();
        assert_eq!(sleeps.len(), 1, "{value}");
        // HTTP-dates have 1-second resolution: the hint is in (118 s, 120 s].
        assert!(
            sleeps[0] > Duration::from_secs(118) && sleeps[0] <= Duration::from_secs(120),
            "{value}: slept {:?}",
            sleeps[0]
        );
    }
    // delay-seconds too.
    let (result, clock, _) = c3_with("120".into(), Duration::from_secs(300)).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(clock.sleeps(), vec![Duration::from_secs(120)]);
}

#[tokio::test]
async fn c3_retry_after_beyond_the_deadline_ends_the_call_at_once_with_the_hint() {
    let started = Instant::now();
    let (result, clock, server) =
        c3_with(http_date_in(120, DateForm::Imf), Duration::from_secs(30)).await;
    let err = retry_error(result);
    assert!(
        matches!(err.reason(), StopReason::RetryAfterBeyondDeadline { .. }),
        "{err}"
    );
    let hint = err.retry_after().unwrap();
    assert!(hint > Duration::from_secs(118) && hint <= Duration::from_secs(120));
    assert_eq!(err.attempts(), 1);
    assert_eq!(
        err.last_status(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert!(clock.sleeps().is_empty());
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(server.count("/slow-down"), 1);
}

#[tokio::test]
async fn malformed_or_negative_retry_after_is_ignored() {
    for value in ["-5", "soon", "1.5"] {
        let (result, clock, _) = c3_with(value.into(), Duration::from_secs(300)).await;
        assert_eq!(result.unwrap().status(), 200);
        let sleeps = clock.sleeps();
        assert_eq!(sleeps.len(), 1);
        assert!(
            sleeps[0] <= Duration::from_millis(5),
            "{value}: {:?}",
            sleeps[0]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// C4. Retry-After: 0 (or a past date) is a lower bound, not a replacement for backoff.

#[tokio::test]
async fn c4_retry_after_zero_still_waits_the_jittered_backoff_and_attempts_stay_bounded() {
    for value in ["0".to_string(), "Sun, 06 Nov 1994 08:49:37 GMT".to_string()] {
        let v = value.clone();
        let server =
            TestServer::start(move |_| Reply::status(429).header("retry-after", v.clone())).await;
        let clock = VirtualClock::default();
        let seed = 7;
        let retry = OncelyRetry::new(fast())
            .with_timer(clock.clone())
            .with_rng_seed(seed);
        let err = retry_error(client(&retry).get(server.url("/busy")).send().await);
        assert_eq!(
            err.reason(),
            &StopReason::AttemptsExhausted { max_attempts: 3 }
        );
        assert_eq!(err.attempts(), 3);
        assert_eq!(err.last_status(), Some(http::StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(server.count("/busy"), 3, "{value}");
        // The waits are exactly the jittered backoff the same seed draws: max(0, jittered).
        let backoff = Backoff::full_jitter(Duration::from_millis(5), Duration::from_millis(20));
        let mut rng = StdRng::seed_from_u64(seed);
        let d0 = backoff.delay(0, None, &mut rng);
        let d1 = backoff.delay(1, Some(d0), &mut rng);
        assert_eq!(clock.sleeps(), vec![d0, d1], "{value}");
        assert_eq!(retry.metrics().snapshot().retry_after_waits, 0);
    }
}

#[tokio::test]
async fn c4_with_decorrelated_jitter_the_real_gaps_are_at_least_the_base() {
    let server = TestServer::start(|_| Reply::status(429).header("retry-after", "0")).await;
    let retry = OncelyRetry::new(
        fast().with_decorrelated_jitter(Duration::from_millis(30), Duration::from_millis(60)),
    );
    let err = retry_error(client(&retry).get(server.url("/busy")).send().await);
    assert_eq!(err.attempts(), 3);
    let seen = server.seen_on("/busy");
    assert_eq!(seen.len(), 3);
    for pair in seen.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= Duration::from_millis(30), "gap {gap:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// C5. One deadline per logical call, never reset per attempt.

#[tokio::test]
async fn c5_one_deadline_for_the_whole_call() {
    let server = TestServer::start(|_| Reply::status(200).after(Duration::from_secs(5))).await;
    let deadline = Duration::from_millis(300);
    let retry = OncelyRetry::new(
        fast()
            .with_max_attempts(10)
            .with_deadline(deadline)
            .with_attempt_timeout(Duration::from_millis(120)),
    );
    let started = Instant::now();
    let err = retry_error(client(&retry).get(server.url("/hang")).send().await);
    let took = started.elapsed();
    assert_eq!(
        err.reason(),
        &StopReason::DeadlineExhausted { deadline },
        "{err}"
    );
    // 120 ms + 120 ms + what is left (about 60 ms), then stop; a 4th attempt only if the third
    // timer fired a hair before the deadline.
    assert!((3..=4).contains(&err.attempts()), "{err}");
    assert!(
        took <= deadline + Duration::from_millis(50),
        "took {took:?}"
    );
    assert!(err.elapsed() <= deadline + Duration::from_millis(50));
    assert!(err.to_string().contains("deadline"), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("after {} attempts", err.attempts()))
    );
    assert_eq!(server.count("/hang") as u32, err.attempts());
}

#[tokio::test]
async fn c5_caller_request_timeout_and_per_call_deadline_are_respected() {
    let server = TestServer::start(|_| Reply::status(200).after(Duration::from_secs(5))).await;
    let retry = OncelyRetry::new(fast());
    let started = Instant::now();
    let err = retry_error(
        client(&retry)
            .get(server.url("/hang"))
            .timeout(Duration::from_millis(50))
            .with_extension(CallOptions::new().with_deadline(Duration::from_millis(400)))
            .send()
            .await,
    );
    // Three 50 ms attempts plus at most two 20 ms sleeps: the attempt limit stops it first.
    assert_eq!(
        err.reason(),
        &StopReason::AttemptsExhausted { max_attempts: 3 }
    );
    assert!(started.elapsed() < Duration::from_millis(400));
}

// ---------------------------------------------------------------------------------------------
// C6. Any attempt number gives a delay in [0, cap], never a panic, never a wrapped 0 (the
// property test lives in src/backoff.rs). Here: 70 attempts through the middleware.

#[tokio::test]
async fn c6_seventy_attempts_never_panic_and_stay_within_the_cap() {
    let server = TestServer::start(|_| Reply::status(503)).await;
    let clock = VirtualClock::default();
    let retry = OncelyRetry::new(
        fast()
            .with_full_jitter(Duration::from_millis(1), Duration::from_millis(10))
            .with_max_attempts(70)
            .with_budget(None),
    )
    .with_timer(clock.clone());
    let err = retry_error(client(&retry).get(server.url("/down")).send().await);
    assert_eq!(err.attempts(), 70);
    let sleeps = clock.sleeps();
    assert_eq!(sleeps.len(), 69);
    assert!(sleeps.iter().all(|d| *d <= Duration::from_millis(10)));
    // High attempts draw from [0, 10 ms], not a wrapped [0, 0].
    assert!(sleeps[40..].iter().any(|d| *d > Duration::from_millis(2)));
}

// ---------------------------------------------------------------------------------------------
// C7. Buffered bodies are resent byte-identically; a streaming body is sent once.

#[tokio::test]
async fn c7_buffered_body_is_resent_byte_identically() {
    let server = TestServer::start(|s| {
        if s.nth_path < 3 {
            Reply::status(503)
        } else {
            Reply::status(201)
        }
    })
    .await;
    let payload: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let retry = OncelyRetry::new(fast());
    let r = client(&retry)
        .post(server.url("/upload"))
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let seen = server.seen_on("/upload");
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.body.as_ref(), payload.as_slice());
    }
}

fn streaming_body() -> reqwest::Body {
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
        Ok(bytes::Bytes::from_static(b"chunk-1;")),
        Ok(bytes::Bytes::from_static(b"chunk-2;")),
        Ok(bytes::Bytes::from_static(b"chunk-3")),
    ];
    reqwest::Body::wrap_stream(futures::stream::iter(chunks))
}

#[tokio::test]
async fn c7_streaming_body_is_sent_once_and_the_error_says_why() {
    let server = TestServer::start(|_| Reply::status(503)).await;
    let retry = OncelyRetry::new(fast());
    let err = retry_error(
        client(&retry)
            .post(server.url("/stream"))
            .body(streaming_body())
            .send()
            .await,
    );
    assert_eq!(err.reason(), &StopReason::BodyNotReplayable);
    assert_eq!(err.attempts(), 1);
    assert_eq!(
        err.last_status(),
        Some(http::StatusCode::SERVICE_UNAVAILABLE)
    );
    assert!(err.to_string().contains("stream"), "{err}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let seen = server.seen_on("/stream");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.as_ref(), b"chunk-1;chunk-2;chunk-3");
    assert!(
        seen[0].key.is_some(),
        "the single attempt still carries a key"
    );

    // A streaming body that succeeds is just a success.
    let ok = TestServer::start(|_| Reply::status(201)).await;
    let r = client(&retry)
        .post(ok.url("/stream"))
        .body(streaming_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

// ---------------------------------------------------------------------------------------------
// C8. Client errors get exactly one attempt; 408, 429 and the in-flight 409 are the exceptions.

#[tokio::test]
async fn c8_client_errors_get_exactly_one_attempt() {
    let server = TestServer::start(|s| {
        let status: u16 = s.path.trim_start_matches('/').parse().unwrap();
        match status {
            422 => Reply::status(422).problem("idempotency_key_mismatch", false),
            409 => Reply::status(409).problem("some_other_conflict", false),
            s => Reply::status(s).body("no"),
        }
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    for status in [400u16, 401, 403, 404, 409, 422] {
        let path = format!("/{status}");
        let r = c.post(server.url(&path)).body("{}").send().await.unwrap();
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(server.count(&path), 1, "{status} must not be retried");
        if status == 422 {
            // The problem body was read for classification and handed back intact.
            assert_eq!(r.url().path(), "/422");
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["code"], "idempotency_key_mismatch");
        }
    }
    assert_eq!(retry.metrics().snapshot().retries, 0);
}

#[tokio::test]
async fn c8_retryable_exceptions_408_429_and_in_flight_409() {
    let server = TestServer::start(|s| {
        if s.nth_path == 1 {
            match s.path.as_str() {
                "/408" => Reply::status(408),
                "/429" => Reply::status(429).header("retry-after", "0"),
                _ => Reply::status(409)
                    .problem("idempotency_request_in_flight", true)
                    .header("retry-after", "0"),
            }
        } else {
            Reply::status(201)
        }
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    for path in ["/408", "/429", "/409"] {
        let r = c.post(server.url(path)).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 201, "{path}");
        let seen = server.seen_on(path);
        assert_eq!(seen.len(), 2, "{path}");
        assert_eq!(seen[0].key, seen[1].key);
    }
}

#[tokio::test]
async fn server_do_not_retry_and_500_policy() {
    let server = TestServer::start(|s| match s.path.as_str() {
        "/no-retry" => Reply::status(503).problem("maintenance", false),
        _ => Reply::status(500),
    })
    .await;
    let retry = OncelyRetry::new(fast());
    let c = client(&retry);
    let r = c.get(server.url("/no-retry")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(server.count("/no-retry"), 1);

    let r = c.get(server.url("/500")).send().await.unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(server.count("/500"), 1, "500 is off by default");

    let with_500 = OncelyRetry::new(fast().with_retry_500(true));
    let err = retry_error(client(&with_500).get(server.url("/500b")).send().await);
    assert_eq!(err.attempts(), 3);
    assert_eq!(server.count("/500b"), 3);
}

// ---------------------------------------------------------------------------------------------
// C9. The budget drains under a sustained outage and refills after it.

#[tokio::test]
async fn c9_budget_caps_an_outage_at_135_requests_and_recovers() {
    // 0 = outage (503), 1 = healthy (200), 2 = fail once per key then succeed.
    let mode = Arc::new(AtomicU8::new(0));
    let m = mode.clone();
    let server = TestServer::start(move |s| match m.load(Ordering::SeqCst) {
        0 => Reply::status(503),
        1 => Reply::status(200),
        _ => {
            if s.nth_key == 1 {
                Reply::status(503)
            } else {
                Reply::status(201)
            }
        }
    })
    .await;
    let policy = RetryPolicy::new()
        .with_full_jitter(Duration::from_millis(1), Duration::from_millis(2))
        .with_deadline(Duration::from_secs(5));
    let retry = OncelyRetry::new(policy);
    let c = client(&retry);

    // 100 logical calls sharing one client; the endpoint always answers 503.
    let calls = (0..100).map(|i| {
        let c = c.clone();
        let url = server.url("/outage");
        async move { c.post(url).body(format!("call {i}")).send().await }
    });
    let results = futures::future::join_all(calls).await;
    let requests = server.count("/outage");
    assert!(requests <= 135, "{requests} requests reached the server");
    assert!(requests >= 100);
    let mut budget_stops = 0;
    for r in results {
        let e = retry_error(r);
        match e.reason() {
            StopReason::BudgetEmpty { cost: 14, .. } => budget_stops += 1,
            StopReason::AttemptsExhausted { .. } => {}
            other => panic!("unexpected stop: {other:?}"),
        }
    }
    assert!(budget_stops >= 80, "{budget_stops}");
    let budget = retry.budget().unwrap().clone();
    assert!(budget.available() < 14, "{}", budget.available());
    let snap = retry.metrics().snapshot();
    assert_eq!(snap.attempts as usize, requests);
    assert_eq!(snap.budget_exhausted, budget_stops);

    // Still drained: a call that fails once is not retried.
    mode.store(2, Ordering::SeqCst);
    let e = retry_error(c.post(server.url("/recovering")).body("a").send().await);
    assert!(matches!(e.reason(), StopReason::BudgetEmpty { .. }), "{e}");
    assert_eq!(e.attempts(), 1);

    // The endpoint recovers: first-attempt successes refund 1 token each.
    mode.store(1, Ordering::SeqCst);
    while budget.available() < 14 {
        let r = c
            .post(server.url("/healthy"))
            .body("b")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // Retries resume: a call that fails once is retried and succeeds.
    mode.store(2, Ordering::SeqCst);
    let r = c.post(server.url("/after")).body("c").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(server.count("/after"), 2);
    // A successful retry refunds its cost.
    assert!(budget.available() >= 14);
}

#[tokio::test]
async fn c9_sequential_outage_is_exactly_100_plus_35() {
    let server = TestServer::start(|_| Reply::status(503)).await;
    let retry = OncelyRetry::new(
        RetryPolicy::new()
            .with_full_jitter(Duration::from_millis(1), Duration::from_millis(2))
            .with_deadline(Duration::from_secs(5)),
    );
    let c = client(&retry);
    for i in 0..100 {
        let _ = c
            .post(server.url("/outage"))
            .body(format!("{i}"))
            .send()
            .await;
    }
    assert_eq!(server.count("/outage"), 135);
    assert_eq!(retry.metrics().snapshot().retries, 35);
}
