//! Leases, heartbeats, replay windows and store timeouts, on paused tokio time (the memory
//! store follows it through `TokioClock`), so every duration is exact and nothing sleeps.

mod common;

use axum::Router;
use axum::routing::post;
use common::*;
use http::StatusCode;
use oncely_core::{
    ClaimKind, FencingToken, IdempotencyKey, InFlightBehavior, KeyStore, MemoryStore, Policy,
    RecordKey, RecordState, Scope, StoreError, TokioClock,
};
use oncely_tower::{IdempotencyContext, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep};

fn paused_store() -> MemoryStore {
    MemoryStore::with_clock(Arc::new(TokioClock::new()))
}

fn id(scope: &str, key: &str) -> RecordKey {
    RecordKey::new(Scope::new(scope), IdempotencyKey::new(key).unwrap())
}

/// Every claimed call's `(kind, token, recovery point)`, in order.
type Seen = Arc<Mutex<Vec<(ClaimKind, i64, Option<String>)>>>;

/// A handler that records its context, then on call `n` does `behaviour(n)` and answers
/// `201 "owner <token>"`.
fn recording_routes<F, Fut>(seen: Seen, behaviour: F) -> Router
where
    F: Fn(usize, IdempotencyContext) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    Router::new().route(
        "/v1/payments",
        post(move |ctx: IdempotencyContext| {
            let (seen, behaviour) = (seen.clone(), behaviour.clone());
            async move {
                let n = {
                    let mut s = seen.lock().unwrap();
                    s.push((ctx.kind(), ctx.token().0, ctx.recovery_point().clone()));
                    s.len()
                };
                let token = ctx.token().0;
                behaviour(n, ctx).await;
                (StatusCode::CREATED, format!("owner {token}"))
            }
        }),
    )
}

fn spawn_send(app: &Router, req: axum::extract::Request) -> tokio::task::JoinHandle<Got> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, req).await })
}

const BODY: &str = r#"{"amount":100}"#;

#[tokio::test(start_paused = true)]
async fn an_owner_that_stops_heartbeating_loses_the_key_and_its_late_writes_are_fenced() {
    // The owner's renewals never reach the store (a partition, a paused VM): its lease lapses
    // after 30 s, a retry takes over with a new token, and the old owner's completion, when it
    // finally comes, is rejected and changes nothing.
    let mem = paused_store();
    let store = Arc::new(FaultStore::new(mem.clone(), Fault::NoRenew));
    let layer = IdempotencyLayer::new(store.clone());
    let metrics = layer.metrics();
    let seen: Seen = Arc::default();
    let unblock = Arc::new(Notify::new());
    let gate = unblock.clone();
    let app = app(
        layer,
        recording_routes(seen.clone(), move |n, _| {
            let gate = gate.clone();
            async move {
                if n == 1 {
                    gate.notified().await;
                }
            }
        }),
    );
    let req = || post_req("/v1/payments", "acct", Some("pay-1"), BODY);
    let first = spawn_send(&app, req());
    sleep(Duration::from_secs(29)).await;
    let early = send(&app, req()).await;
    assert_eq!(
        early.code(),
        "idempotency_request_in_flight",
        "lease still alive at 29 s"
    );
    assert_eq!(early.headers["retry-after"], "1");

    sleep(Duration::from_secs(2)).await; // t = 31 s: the lease lapsed at 30 s
    let second = send(&app, req()).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(&second.body[..], b"owner 2");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(ClaimKind::New, 1, None), (ClaimKind::Takeover, 2, None)],
        "the new owner got a new token"
    );

    // The old owner finishes late: its caller still gets its response...
    unblock.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(&first.body[..], b"owner 1");
    // ...but its completion was fenced and the record is the new owner's.
    let m = metrics.snapshot();
    assert_eq!(
        (m.claims, m.lease_takeovers, m.fencing_rejections),
        (2, 1, 1)
    );
    let rec = mem.get(&id("acct", "pay-1")).await.unwrap().unwrap();
    assert_eq!(rec.token, FencingToken(2));
    let RecordState::Complete { response, .. } = &rec.state else {
        panic!("not complete: {rec:?}")
    };
    assert_eq!(response.body, b"owner 2".to_vec());
    // A stale release changes nothing either.
    assert!(matches!(
        mem.release(&id("acct", "pay-1"), FencingToken(1)).await,
        Err(StoreError::Fenced)
    ));
    assert_eq!(mem.get(&id("acct", "pay-1")).await.unwrap().unwrap(), rec);
    let replay = send(&app, req()).await;
    assert!(replay.replayed());
    assert_eq!(&replay.body[..], b"owner 2");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_a_slow_live_owner_from_being_taken_over() {
    let mem = paused_store();
    let layer = IdempotencyLayer::new(Arc::new(mem.clone())); // lease 30 s, heartbeat 10 s
    let metrics = layer.metrics();
    let seen: Seen = Arc::default();
    let app = app(
        layer,
        recording_routes(seen.clone(), |_, _| sleep(Duration::from_secs(100))),
    );
    let req = || post_req("/v1/payments", "acct", Some("slow"), BODY);
    let started = Instant::now();
    let first = spawn_send(&app, req());
    for at in [35, 65, 95] {
        sleep_until_secs(started, at).await;
        let dup = send(&app, req()).await;
        assert_eq!(dup.code(), "idempotency_request_in_flight", "at {at} s");
        assert_eq!(dup.headers["retry-after"], "1");
    }
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(started.elapsed(), Duration::from_secs(100));
    assert_eq!(seen.lock().unwrap().len(), 1, "never taken over");
    let m = metrics.snapshot();
    assert_eq!(
        (
            m.lease_takeovers,
            m.in_flight_conflicts,
            m.fencing_rejections
        ),
        (0, 3, 0)
    );
    assert!(send(&app, req()).await.replayed());
}

async fn sleep_until_secs(start: Instant, secs: u64) {
    tokio::time::sleep_until(start + Duration::from_secs(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_owner_is_taken_over_after_its_lease_and_resumes_at_its_recovery_point() {
    // docs/DESIGN.md, "Crashed owner": the owner's process dies mid-request. Modelled as two "processes" (two layers)
    // sharing one store: process A's handler hangs after its checkpoint and its heartbeats
    // never reach the store (a dead process renews nothing); dropping the client's request
    // would not do it, since the layer runs a claimed handler to completion on its own task.
    // Every retry (through process B) inside the lease gets 409 with Retry-After; the first
    // retry after the lease lapses takes over with a new token and the recovery point.
    let mem = paused_store();
    let seen: Seen = Arc::default();
    let routes = || {
        recording_routes(seen.clone(), |n, ctx: IdempotencyContext| async move {
            if n == 1 {
                ctx.checkpoint(&"charged").await.unwrap();
                std::future::pending::<()>().await; // the crash happens in here
            }
        })
    };
    let dying = app(
        IdempotencyLayer::new(Arc::new(FaultStore::new(mem.clone(), Fault::NoRenew))),
        routes(),
    );
    let app = app(IdempotencyLayer::new(Arc::new(mem.clone())), routes());
    let req = || post_req("/v1/payments", "acct", Some("s1"), BODY);
    let started = Instant::now();
    let _owner = spawn_send(&dying, req());
    sleep(Duration::from_secs(1)).await; // the process died at t = 1 s; its lease ends at 30 s

    for at in [2, 10, 20, 29] {
        sleep_until_secs(started, at).await;
        let got = send(&app, req()).await;
        assert_eq!(got.status, StatusCode::CONFLICT, "at {at} s");
        assert_eq!(got.code(), "idempotency_request_in_flight");
        assert_eq!(
            got.headers["retry-after"], "1",
            "every 409 carries Retry-After"
        );
    }
    sleep_until_secs(started, 31).await;
    let resumed = send(&app, req()).await;
    assert_eq!(resumed.status, StatusCode::CREATED);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (ClaimKind::New, 1, None),
            (ClaimKind::Takeover, 2, Some(r#""charged""#.to_owned()))
        ]
    );
    assert!(send(&app, req()).await.replayed());
}

#[tokio::test(start_paused = true)]
async fn after_the_replay_window_the_same_key_executes_again_as_new() {
    let mem = paused_store();
    let layer = IdempotencyLayer::new(Arc::new(mem.clone()));
    let seen: Seen = Arc::default();
    let app = app(layer, recording_routes(seen.clone(), |_, _| async {}));
    let req = || post_req("/v1/payments", "acct", Some("w"), BODY);
    let first = send(&app, req()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    sleep(Duration::from_secs(24 * 3600 - 1)).await;
    let inside = send(&app, req()).await;
    assert!(inside.replayed(), "one second before the window ends");
    sleep(Duration::from_secs(1)).await;
    let after = send(&app, req()).await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed());
    assert_eq!(&after.body[..], b"owner 2");
    // A different body after the window is a brand-new request too, never an error.
    sleep(Duration::from_secs(24 * 3600)).await;
    let other = send(
        &app,
        post_req("/v1/payments", "acct", Some("w"), r#"{"amount":5}"#),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(
        seen.lock().unwrap().iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![
            ClaimKind::New,
            ClaimKind::AfterReplayWindow,
            ClaimKind::AfterReplayWindow
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_times_out_to_503_and_the_handler_never_runs() {
    // docs/DESIGN.md, "Store slow or failing": the store never answers; the default store timeout is 5 s.
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let routes = Router::new().route(
        "/v1/payments",
        post(move || {
            c.fetch_add(1, Ordering::SeqCst);
            async { "ran" }
        }),
    );
    let layer = IdempotencyLayer::new(Arc::new(FaultStore::new(paused_store(), Fault::HangClaim)));
    let metrics = layer.metrics();
    let app = app(layer, routes);
    let started = Instant::now();
    let got = send(&app, post_req("/v1/payments", "acct", Some("h"), BODY)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.code(), "idempotency_store_unavailable");
    assert_eq!(got.headers["retry-after"], "1");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(metrics.snapshot().store_errors, 1);
}

#[tokio::test(start_paused = true)]
async fn a_claim_recorded_after_its_timeout_is_answered_as_unknown_and_runs_once() {
    // docs/DESIGN.md, "Store outages fail closed": the store records the claim but its answer
    // never reaches the layer. The 503 must not say the request did not happen: the claim
    // stands, the same key is in flight until its lease lapses, then a retry runs it once.
    let calls = Arc::new(AtomicUsize::new(0));
    let routes = slow_counting_routes(calls.clone(), Duration::ZERO);
    let inner = paused_store();
    let stalled = Arc::new(FaultStore::new(inner.clone(), Fault::RecordThenHang));
    let app_stalled = app(IdempotencyLayer::new(stalled), routes.clone());
    let app_healthy = app(
        IdempotencyLayer::new(Arc::new(FaultStore::new(inner, Fault::None))),
        routes,
    );
    let req = || post_req("/v1/payments", "acct", Some("late"), BODY);

    let got = send(&app_stalled, req()).await;
    assert_eq!(got.code(), "idempotency_store_unavailable");
    let detail = got.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("may still have recorded") && detail.contains("the same key"),
        "{detail}"
    );
    assert!(!detail.contains("was not executed"), "{detail}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // The recorded claim holds the key: the retry is told it is in flight, nothing runs.
    let retry = send(&app_healthy, req()).await;
    assert_eq!(retry.code(), "idempotency_request_in_flight");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Past the default 30 s lease the retry takes the key over and runs the request once;
    // the next copy replays it.
    sleep(Duration::from_secs(31)).await;
    let taken = send(&app_healthy, req()).await;
    assert_eq!(taken.status, StatusCode::CREATED);
    let again = send(&app_healthy, req()).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn fifty_concurrent_requests_on_a_slow_store_run_at_most_once() {
    // docs/DESIGN.md, "Store slow or failing": the store answers in 200 ms. With a 5 s timeout the claim arbitrates (one
    // execution, the rest 409); with a 100 ms timeout nothing runs and everyone gets 503.
    for (timeout, want_calls) in [(Duration::from_secs(5), 1), (Duration::from_millis(100), 0)] {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let routes = Router::new().route(
            "/v1/payments",
            post(move || {
                let c = c.clone();
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    sleep(Duration::from_millis(100)).await;
                    (StatusCode::CREATED, "paid")
                }
            }),
        );
        let store = FaultStore::new(paused_store(), Fault::SlowClaim(Duration::from_millis(200)));
        let layer = IdempotencyLayer::new(Arc::new(store)).with_store_timeout(timeout);
        let app = app(layer, routes);
        let tasks: Vec<_> = (0..50)
            .map(|_| spawn_send(&app, post_req("/v1/payments", "acct", Some("s7"), BODY)))
            .collect();
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for t in tasks {
            let got = t.await.unwrap();
            match got.status.as_u16() {
                201 => assert_eq!(&got.body[..], b"paid"),
                409 => assert_eq!(got.code(), "idempotency_request_in_flight"),
                503 => assert_eq!(got.code(), "idempotency_store_unavailable"),
                other => panic!("unexpected {other}"),
            }
            *statuses.entry(got.status.as_u16()).or_default() += 1;
        }
        assert_eq!(calls.load(Ordering::SeqCst), want_calls, "{timeout:?}");
        if want_calls == 1 {
            assert_eq!(statuses, [(201, 1), (409, 49)].into_iter().collect());
        } else {
            assert_eq!(statuses, [(503, 50)].into_iter().collect());
        }
    }
}

fn slow_counting_routes(calls: Arc<AtomicUsize>, work: Duration) -> Router {
    Router::new().route(
        "/v1/payments",
        post(move |body: String| {
            let calls = calls.clone();
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                sleep(work).await;
                (
                    StatusCode::CREATED,
                    [("x-call", n.to_string())],
                    format!("created {body} by call {n}"),
                )
            }
        }),
    )
}

#[tokio::test(start_paused = true)]
async fn near_simultaneous_duplicates_execute_once() {
    // docs/DESIGN.md, "Near-simultaneous duplicates": two POSTs 5 ms apart, a 300 ms handler. Reject mode: the second gets 409.
    // Wait mode: it gets the replay once the first completes.
    for wait in [false, true] {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut policy = Policy::default();
        if wait {
            policy.in_flight = InFlightBehavior::Wait {
                max: Duration::from_secs(2),
                poll: Duration::from_millis(20),
            };
        }
        let layer = IdempotencyLayer::new(Arc::new(paused_store())).with_policy(policy);
        let app = app(
            layer,
            slow_counting_routes(calls.clone(), Duration::from_millis(300)),
        );
        let req = || post_req("/v1/payments", "acct", Some("s5"), BODY);
        let started = Instant::now();
        let first = spawn_send(&app, req());
        sleep(Duration::from_millis(5)).await;
        let second = send(&app, req()).await;
        let first = first.await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "wait={wait}");
        assert_eq!(first.status, StatusCode::CREATED);
        if wait {
            assert!(second.replayed());
            assert_eq!(second.status, StatusCode::CREATED);
            assert_eq!(second.body, first.body);
            assert_eq!(
                comparable_headers(&second.headers),
                comparable_headers(&first.headers)
            );
            // Answered at the first poll after completion (t = 300 ms), not at the bound.
            assert!(
                started.elapsed() < Duration::from_millis(330),
                "{:?}",
                started.elapsed()
            );
        } else {
            assert_eq!(second.code(), "idempotency_request_in_flight");
            assert_eq!(second.headers["retry-after"], "1");
            assert_eq!(second.json()["retryable"], true);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn wait_mode_answers_409_at_its_bound_and_never_runs_the_handler() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Arc::new(paused_store())).with_policy(
        Policy::default().with_in_flight(InFlightBehavior::Wait {
            max: Duration::from_secs(1),
            poll: Duration::from_millis(100),
        }),
    );
    let app = app(
        layer,
        slow_counting_routes(calls.clone(), Duration::from_secs(10)),
    );
    let req = || post_req("/v1/payments", "acct", Some("wait"), BODY);
    let first = spawn_send(&app, req());
    sleep(Duration::from_millis(1)).await;
    let started = Instant::now();
    let second = send(&app, req()).await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(second.code(), "idempotency_request_in_flight");
    assert_eq!(second.headers["retry-after"], "1");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_fenced_heartbeat_is_counted_and_stops_and_the_response_still_returns() {
    // The handler loses its claim while it runs (here it releases the record itself, the
    // simplest way to make its token stale): the next heartbeat is fenced and counted, the
    // heartbeat stops, the completion is fenced and counted too, and the caller still gets the
    // response of the work that was done.
    let mem = paused_store();
    let layer = IdempotencyLayer::new(Arc::new(mem.clone())); // heartbeat every 10 s
    let metrics = layer.metrics();
    let seen: Seen = Arc::default();
    let app = app(
        layer,
        recording_routes(seen.clone(), |_, ctx: IdempotencyContext| async move {
            ctx.claim()
                .store()
                .release(ctx.id(), ctx.token())
                .await
                .unwrap();
            sleep(Duration::from_secs(25)).await; // two heartbeats would fall in here
        }),
    );
    let got = send(&app, post_req("/v1/payments", "acct", Some("f"), BODY)).await;
    assert_eq!(got.status, StatusCode::CREATED);
    assert_eq!(&got.body[..], b"owner 1");
    // One fenced renew (then the heartbeat stopped: no second one), one fenced completion.
    assert_eq!(metrics.snapshot().fencing_rejections, 2);
    let rec = mem.get(&id("acct", "f")).await.unwrap().unwrap();
    assert_eq!(
        rec.state,
        RecordState::Released,
        "the fenced completion changed nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_mode_stops_waiting_when_the_first_request_releases_its_key() {
    use axum::Extension;
    use axum::response::IntoResponse;
    use oncely_tower::HandlerOutcome;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let routes = Router::new().route(
        "/v1/payments",
        post(move || {
            let c = c.clone();
            async move {
                let n = c.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(100)).await;
                if n == 0 {
                    (
                        StatusCode::BAD_REQUEST,
                        Extension(HandlerOutcome::NotExecuted),
                        "rejected",
                    )
                        .into_response()
                } else {
                    (StatusCode::CREATED, "paid").into_response()
                }
            }
        }),
    );
    let layer = IdempotencyLayer::new(Arc::new(paused_store())).with_policy(
        Policy::default().with_in_flight(InFlightBehavior::Wait {
            max: Duration::from_secs(5),
            poll: Duration::from_millis(50),
        }),
    );
    let app = app(layer, routes);
    let req = || post_req("/v1/payments", "acct", Some("rel"), BODY);
    let first = spawn_send(&app, req());
    sleep(Duration::from_millis(1)).await;
    let started = Instant::now();
    let second = send(&app, req()).await;
    assert_eq!(second.code(), "idempotency_request_in_flight");
    assert!(
        started.elapsed() <= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(first.await.unwrap().status, StatusCode::BAD_REQUEST);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the waiting request never ran the handler"
    );
    // The client's retry claims the released key and executes.
    let retry = send(&app, req()).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_disconnects_does_not_cancel_the_handler() {
    // The client times out at 1 s while the handler (an outside call, say) needs 5 s: the
    // handler runs to completion on its own task and its response is stored, so the client's
    // retry gets it at once instead of waiting out the lease.
    let mem = paused_store();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        IdempotencyLayer::new(Arc::new(mem.clone())),
        slow_counting_routes(calls.clone(), Duration::from_secs(5)),
    );
    let req = || post_req("/v1/payments", "acct", Some("gone"), BODY);
    let client = spawn_send(&app, req());
    sleep(Duration::from_secs(1)).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    sleep(Duration::from_secs(5)).await;
    let rec = mem.get(&id("acct", "gone")).await.unwrap().unwrap();
    assert_eq!(rec.state_name(), "complete");
    let retry = send(&app, req()).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A request whose every outside call takes `call` and whose duplicates arrive every 5 s
/// through `store`, on paused time: the heartbeat must keep it from being taken over.
async fn duplicates_never_take_over(store: Arc<FaultStore>, store_timeout: Duration) {
    let layer = IdempotencyLayer::new(store.clone()).with_store_timeout(store_timeout);
    let metrics = layer.metrics();
    let seen: Seen = Arc::default();
    let app = app(
        layer,
        recording_routes(seen.clone(), |_, _| sleep(Duration::from_secs(120))),
    );
    let req = || post_req("/v1/payments", "acct", Some("live"), BODY);
    let started = Instant::now();
    let first = spawn_send(&app, req());
    let mut at = 5;
    while at < 120 {
        sleep_until_secs(started, at).await;
        let dup = send(&app, req()).await;
        assert_eq!(dup.code(), "idempotency_request_in_flight", "at {at} s");
        let rec = store.inner.get(&id("acct", "live")).await.unwrap().unwrap();
        let RecordState::InFlight {
            lease_expires_at, ..
        } = rec.state
        else {
            panic!("not in flight at {at} s: {rec:?}")
        };
        assert!(
            lease_expires_at > oncely_core::Clock::now_millis(&TokioClock::new()),
            "the lease lapsed at {at} s"
        );
        at += 5;
    }
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(seen.lock().unwrap().len(), 1, "the handler ran once");
    let m = metrics.snapshot();
    assert_eq!((m.lease_takeovers, m.fencing_rejections), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_store_that_answers_renewals_slowly_does_not_cost_the_lease() {
    // Each renewal takes half the lease (15 s of 30 s, heartbeat 10 s): renewals keep their
    // rate from the start of the last good one, not from its end.
    let store = Arc::new(FaultStore::new(
        paused_store(),
        Fault::SlowRenew(Duration::from_secs(15)),
    ));
    duplicates_never_take_over(store, Duration::from_secs(20)).await;
}

#[tokio::test(start_paused = true)]
async fn renewals_that_fail_three_times_in_four_do_not_cost_the_lease() {
    // A failed renewal is tried again after a quarter of the interval (2.5 s), not after a
    // whole one: with every three of four renewals failing, a heartbeat that waited a whole
    // interval after each failure would let the 30 s lease lapse after the third.
    let store = Arc::new(FaultStore::new(paused_store(), Fault::FlakyRenew));
    duplicates_never_take_over(store.clone(), Duration::from_secs(5)).await;
    assert!(
        // Per 17.5 s: a good renewal, then three failures 10, 12.5 and 15 s after it.
        store.renews.load(Ordering::SeqCst) >= 24,
        "renewals were tried again after failures"
    );
}

/// What the request's handler did before its outside call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Before {
    Called,
    Refused,
}

/// A handler that checks its lease, then makes its one outside call.
fn calling_routes(
    calls: Arc<AtomicUsize>,
    block: Duration,
    seen: Arc<Mutex<Vec<Before>>>,
) -> Router {
    Router::new().route(
        "/v1/payments",
        post(move |ctx: IdempotencyContext| {
            let (calls, seen) = (calls.clone(), seen.clone());
            async move {
                if ctx.kind() == ClaimKind::New {
                    // Synchronous work that blocks the runtime's only thread: the heartbeat
                    // cannot run meanwhile.
                    std::thread::sleep(block);
                }
                match ctx.ensure_lease().await {
                    Ok(()) => {
                        seen.lock().unwrap().push(Before::Called);
                        calls.fetch_add(1, Ordering::SeqCst);
                        (StatusCode::CREATED, "charged")
                    }
                    Err(StoreError::Fenced) => {
                        seen.lock().unwrap().push(Before::Refused);
                        (StatusCode::CONFLICT, "lost the claim")
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }),
    )
}

/// A clock `offset_ms` ahead of the system's: a store whose clock is not the layer's (a Redis
/// store on the server's time).
struct Ahead(i64);

impl oncely_core::Clock for Ahead {
    fn now_millis(&self) -> oncely_core::UnixMillis {
        oncely_core::SystemClock.now_millis() + self.0
    }
}

#[test]
fn a_request_that_lost_its_lease_makes_no_outside_call() {
    lost_lease_makes_no_outside_call(0);
}

#[test]
fn a_store_clock_ahead_of_the_layers_does_not_make_a_lost_lease_look_held() {
    // The store's clock runs an hour ahead: its lease ends, in its own time, an hour after the
    // layer's clock says. The layer must not read that as an hour of lease left.
    lost_lease_makes_no_outside_call(3_600_000);
}

fn lost_lease_makes_no_outside_call(store_ahead_ms: i64) {
    // Real time. The owner runs on a current-thread runtime and blocks it for three leases, so
    // its heartbeat never runs; another process (a second layer on the same store, on a
    // runtime of its own) takes the key over once the lease lapsed and makes the call. When
    // the owner wakes up, its check before the call learns that it lost the claim: one call in
    // all.
    let lease = Duration::from_millis(300);
    let policy = Policy::default()
        .with_lease(lease)
        .with_heartbeat(Duration::from_millis(100));
    let store = Arc::new(MemoryStore::with_clock(Arc::new(Ahead(store_ahead_ms))));
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let router = |block| {
        app(
            IdempotencyLayer::new(store.clone()).with_policy(policy.clone()),
            calling_routes(calls.clone(), block, seen.clone()),
        )
    };
    let (owner_app, taker_app) = (router(lease * 3), router(Duration::ZERO));
    let req = || post_req("/v1/payments", "acct", Some("blocked"), BODY);
    let taker = std::thread::spawn(move || {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move {
                // The lease has lapsed by now (the owner's heartbeat cannot run).
                tokio::time::sleep(lease * 2).await;
                send(&taker_app, req()).await
            })
    });
    let owner = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move { send(&owner_app, req()).await });
    let taker = taker.join().unwrap();
    assert_eq!(taker.status, StatusCode::CREATED);
    assert_eq!(&taker.body[..], b"charged");
    assert_eq!(owner.status, StatusCode::CONFLICT);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the outside call was made once"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Before::Called, Before::Refused],
        "the taker called; the owner, awake again, was refused"
    );
}
