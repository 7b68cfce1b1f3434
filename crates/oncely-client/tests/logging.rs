//! Every retry is logged through `tracing` (attempt, reason, wait and why, tokens left) and
//! counted in the metrics.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Reply, TestServer, VirtualClock};
use oncely_client::{OncelyRetry, RetryPolicy};

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
    type Writer = Buffer;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn every_retry_is_logged_and_counted() {
    let buffer = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(buffer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = TestServer::start(|s| match s.nth_path {
        1 => Reply::status(503).header("retry-after", "1"),
        2 => Reply::status(429),
        _ => Reply::status(201),
    })
    .await;
    let clock = VirtualClock::default();
    let retry = OncelyRetry::new(
        RetryPolicy::new()
            .with_full_jitter(Duration::from_millis(5), Duration::from_millis(20))
            .with_deadline(Duration::from_secs(30)),
    )
    .with_timer(clock.clone());
    let client = retry.clone().wrap(reqwest::Client::new());
    let r = client
        .post(server.url("/pay"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("oncely: retrying"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    let first = lines[0];
    for needle in [
        "attempt=1",
        "reason=503 Service Unavailable",
        "wait_ms=1000",
        "wait_source=\"retry-after\"",
        "retry_after_ms=1000",
        "tokens_left=486",
        "retry_cost=14",
        "idempotency_key=",
    ] {
        assert!(first.contains(needle), "missing {needle} in {first}");
    }
    let second = lines[1];
    for needle in [
        "attempt=2",
        "reason=429 Too Many Requests",
        "wait_source=\"backoff\"",
        "tokens_left=481",
        "retry_cost=5",
    ] {
        assert!(second.contains(needle), "missing {needle} in {second}");
    }

    let m = retry.metrics().snapshot();
    assert_eq!(m.calls, 1);
    assert_eq!(m.attempts, 3);
    assert_eq!(m.retries, 2);
    assert_eq!(m.retry_after_waits, 1);
    assert_eq!(m.keys_minted, 1);
    assert_eq!(m.gave_up, 0);
    // The successful retry refunded its cost (5): 481 + 5.
    assert_eq!(retry.budget().unwrap().available(), 486);
}
