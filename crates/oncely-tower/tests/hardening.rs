//! The in-flight answers a generated SDK needs (`202` + status URL, a sized `Retry-After`,
//! `x-should-retry`), graceful shutdown ([`Drain`]), and the request's tracing span on the
//! layer's tasks. Paused tokio time: the store and the layer share one `TokioClock`.

mod common;

use async_trait::async_trait;
use axum::Router;
use axum::routing::post;
use common::*;
use http::StatusCode;
use oncely_core::{
    ClaimKind, ClaimOutcome, ClaimRequest, FencingToken, IdempotencyKey, InFlightBehavior,
    KeyStore, MemoryStore, Policy, Record, RecordKey, RecordState, Scope, StoreError, TokioClock,
    UnixMillis,
};
use oncely_tower::{Drain, IdempotencyContext, IdempotencyLayer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::sleep;
use tracing::Instrument as _;

const BODY: &str = r#"{"amount":100}"#;

fn id(key: &str) -> RecordKey {
    RecordKey::new(Scope::new("acct"), IdempotencyKey::new(key).unwrap())
}

/// A handler that counts its calls and then works for `work` (or until `gate` is notified).
fn routes(calls: Arc<AtomicUsize>, work: Duration, gate: Option<Arc<Notify>>) -> Router {
    Router::new().route(
        "/v1/payments",
        post(move |ctx: IdempotencyContext| {
            let (calls, gate) = (calls.clone(), gate.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tracing::info!(token = ctx.token().0, "handler running");
                match gate {
                    Some(g) => g.notified().await,
                    None => sleep(work).await,
                }
                (StatusCode::CREATED, "created")
            }
        }),
    )
}

fn layer(
    store: Arc<dyn KeyStore>,
    clock: TokioClock,
    in_flight: InFlightBehavior,
) -> IdempotencyLayer {
    IdempotencyLayer::new(store)
        .with_clock(clock)
        .with_policy(Policy::default().with_in_flight(in_flight))
}

#[tokio::test(start_paused = true)]
async fn accepted_mode_answers_202_with_the_status_url_and_never_runs_the_handler_twice() {
    let clock = TokioClock::new();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock)));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        layer(
            store,
            clock,
            InFlightBehavior::Accepted {
                status_url: "/v1/idempotency-keys/{key}",
            },
        ),
        routes(calls.clone(), Duration::from_secs(5), None),
    );
    let req = || post_req("/v1/payments", "acct", Some("k/1"), BODY);
    let first = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req()).await })
    };
    sleep(Duration::from_millis(10)).await;
    let second = send(&app, req()).await;
    assert_eq!(second.status, StatusCode::ACCEPTED);
    assert_eq!(second.headers["location"], "/v1/idempotency-keys/k%2F1");
    assert_eq!(second.headers["retry-after"], "1");
    let v = second.json();
    assert_eq!(v["state"], "in_flight");
    assert_eq!(v["status_url"], "/v1/idempotency-keys/k%2F1");
    assert_eq!(v["code"], "idempotency_request_in_flight");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn in_flight_retry_after_grows_with_the_first_requests_age_within_the_lease() {
    let clock = TokioClock::new();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock)));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        layer(store, clock, InFlightBehavior::Reject),
        routes(calls.clone(), Duration::from_secs(100), None),
    );
    let req = || post_req("/v1/payments", "acct", Some("slow"), BODY);
    let first = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req()).await })
    };
    sleep(Duration::from_millis(10)).await;
    let early = send(&app, req()).await;
    assert_eq!(early.code(), "idempotency_request_in_flight");
    assert_eq!(early.headers["retry-after"], "1");
    assert_eq!(early.headers["x-should-retry"], "true");
    // Eight seconds in, the request is expected to need about as long again.
    sleep(Duration::from_millis(7_990)).await;
    let later = send(&app, req()).await;
    assert_eq!(later.headers["retry-after"], "8");
    assert!(
        later.json()["detail"]
            .as_str()
            .unwrap()
            .contains("8 second(s)")
    );
    // Fifty seconds in (renewed every 10 s), never past the lease: at most 30 s.
    sleep(Duration::from_secs(42)).await;
    let old = send(&app, req()).await;
    let ra: u64 = old.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((20..=30).contains(&ra), "{ra}");
    first.abort();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn every_problem_says_whether_to_retry() {
    let store = Arc::new(MemoryStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(
        IdempotencyLayer::new(store),
        routes(calls, Duration::ZERO, None),
    );
    let missing = send(&app, post_req("/v1/payments", "acct", None, BODY)).await;
    assert_eq!(missing.code(), "idempotency_key_missing");
    assert_eq!(missing.headers["x-should-retry"], "false");
    let ok = send(&app, post_req("/v1/payments", "acct", Some("m"), BODY)).await;
    assert_eq!(ok.status, StatusCode::CREATED);
    let mismatch = send(&app, post_req("/v1/payments", "acct", Some("m"), "{}")).await;
    assert_eq!(mismatch.code(), "idempotency_key_mismatch");
    assert_eq!(mismatch.headers["x-should-retry"], "false");

    let down = Arc::new(FaultStore::new(MemoryStore::new(), Fault::FailAll));
    let app = app_down(down);
    let res = send(&app, post_req("/v1/payments", "acct", Some("d"), BODY)).await;
    assert_eq!(res.code(), "idempotency_store_unavailable");
    assert_eq!(res.headers["x-should-retry"], "true");
}

fn app_down(store: Arc<FaultStore>) -> Router {
    app(
        IdempotencyLayer::new(store),
        routes(Arc::default(), Duration::ZERO, None),
    )
}

#[tokio::test(start_paused = true)]
async fn a_draining_layer_claims_nothing_new_and_suspends_what_still_runs() {
    let clock = TokioClock::new();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock)));
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let l = layer(store.clone(), clock, InFlightBehavior::Reject);
    let drain = l.drain();
    let app = app(l, routes(calls.clone(), Duration::ZERO, Some(gate.clone())));

    let running = {
        let app = app.clone();
        tokio::spawn(async move {
            send(&app, post_req("/v1/payments", "acct", Some("run"), BODY)).await
        })
    };
    sleep(Duration::from_millis(10)).await;
    assert_eq!(drain.running(), 1);

    drain.start();
    // A new keyed request is not claimed at all.
    let refused = send(&app, post_req("/v1/payments", "acct", Some("new"), BODY)).await;
    assert_eq!(refused.code(), "server_shutting_down");
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers["x-should-retry"], "true");
    assert_eq!(refused.headers["connection"], "close");
    assert!(refused.headers.contains_key("retry-after"));
    assert!(store.get(&id("new")).await.unwrap().is_none());

    // The bound passes with the handler still running: it is suspended.
    assert!(
        tokio::time::timeout(Duration::from_secs(5), drain.idle())
            .await
            .is_err()
    );
    assert_eq!(drain.abandon().await, 1);
    // Past a heartbeat (10 s): nothing renewed the lease after the suspension.
    sleep(Duration::from_secs(15)).await;
    let rec = store.get(&id("run")).await.unwrap().unwrap();
    let RecordState::InFlight {
        lease_expires_at, ..
    } = rec.state
    else {
        panic!("{rec:?}")
    };
    assert!(lease_expires_at < oncely_core::Clock::now_millis(&clock));
    // A retry (on another instance, or after the restart) takes over at once.
    let outcome = store
        .claim(ClaimRequest::new(
            id("run"),
            rec.fingerprint,
            Duration::from_secs(30),
            Duration::from_secs(86_400),
            Duration::from_secs(259_200),
        ))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, ClaimOutcome::Claimed(c) if c.kind == ClaimKind::Takeover),
        "{outcome:?}"
    );
    gate.notify_waiters();
    let _ = running.await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A memory store whose `claim` starts the drain right after it claimed: the window between a
/// claim and its handler's start, made deterministic.
struct DrainOnClaim {
    inner: MemoryStore,
    drain: OnceLock<Drain>,
    claims: Mutex<Vec<FencingToken>>,
}

#[async_trait]
impl oncely_core::StoreWrapper for DrainOnClaim {
    type Inner = MemoryStore;
    fn inner(&self) -> Result<&MemoryStore, StoreError> {
        Ok(&self.inner)
    }
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let out = self.inner.claim(req).await?;
        if let ClaimOutcome::Claimed(c) = &out {
            self.claims.lock().unwrap().push(c.token);
        }
        self.drain.get().unwrap().start();
        Ok(out)
    }
}

#[tokio::test]
async fn a_claim_whose_handler_had_not_started_is_released_on_shutdown() {
    let store = Arc::new(DrainOnClaim {
        inner: MemoryStore::new(),
        drain: OnceLock::new(),
        claims: Mutex::default(),
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let l = IdempotencyLayer::new(store.clone());
    store.drain.set(l.drain()).unwrap();
    let app = app(l, routes(calls.clone(), Duration::ZERO, None));
    let res = send(&app, post_req("/v1/payments", "acct", Some("c"), BODY)).await;
    assert_eq!(res.code(), "server_shutting_down");
    assert_eq!(store.claims.lock().unwrap().len(), 1, "it was claimed");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    let rec = store.inner.get(&id("c")).await.unwrap().unwrap();
    assert_eq!(
        rec.state,
        RecordState::Released,
        "the key behaves as absent"
    );
}

/// Records, for every event, the names of the spans it happened in.
#[derive(Clone, Default)]
struct SpanNames(Arc<Mutex<Vec<Seen>>>);

/// An event's message and the names of its spans, innermost first.
type Seen = (String, Vec<String>);

impl<S> tracing_subscriber::Layer<S> for SpanNames
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let spans = ctx
            .event_scope(event)
            .map(|s| s.map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        let mut message = String::new();
        struct Msg<'a>(&'a mut String);
        impl tracing::field::Visit for Msg<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        event.record(&mut Msg(&mut message));
        self.0.lock().unwrap().push((message, spans));
    }
}

#[tokio::test(start_paused = true)]
async fn the_handler_and_heartbeat_tasks_keep_the_requests_span() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let names = SpanNames::default();
    let subscriber = tracing_subscriber::registry().with(names.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    // Every renewal fails (logged by the heartbeat task), the handler logs once.
    let clock = TokioClock::new();
    let store = Arc::new(FaultStore::new(
        MemoryStore::with_clock(Arc::new(clock)),
        Fault::NoRenew,
    ));
    let app = app(
        IdempotencyLayer::new(store).with_clock(clock),
        routes(Arc::default(), Duration::from_secs(12), None),
    );
    let res = send(&app, post_req("/v1/payments", "acct", Some("span"), BODY))
        .instrument(tracing::info_span!("request", id = 7))
        .await;
    assert_eq!(res.status, StatusCode::CREATED);
    let seen = names.0.lock().unwrap().clone();
    let of = |needle: &str| {
        seen.iter()
            .find(|(m, _)| m.contains(needle))
            .unwrap_or_else(|| panic!("no event {needle:?} in {seen:?}"))
            .1
            .clone()
    };
    assert!(
        of("handler running").contains(&"request".to_owned()),
        "{seen:?}"
    );
    assert!(
        of("lease renewal failed").contains(&"request".to_owned()),
        "{seen:?}"
    );
}

/// A memory store whose renewals are fenced and whose reads never answer.
struct FencedRenewHangingGet(MemoryStore);

#[async_trait]
impl oncely_core::StoreWrapper for FencedRenewHangingGet {
    type Inner = MemoryStore;
    fn inner(&self) -> Result<&MemoryStore, StoreError> {
        Ok(&self.0)
    }
    async fn renew(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: Duration,
    ) -> Result<UnixMillis, StoreError> {
        Err(StoreError::Fenced)
    }
    async fn get(&self, _: &RecordKey) -> Result<Option<Record>, StoreError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_read_that_never_answers_cannot_hold_the_response() {
    // The renewal at 10 s is fenced, and the heartbeat reads the record to tell why: that read
    // never answers. It is bounded by the store timeout, so the response still comes.
    let clock = TokioClock::new();
    let store = Arc::new(FencedRenewHangingGet(MemoryStore::with_clock(Arc::new(
        clock,
    ))));
    let app = app(
        IdempotencyLayer::new(store).with_clock(clock),
        routes(Arc::default(), Duration::from_secs(12), None),
    );
    let res = tokio::time::timeout(
        Duration::from_secs(600),
        send(&app, post_req("/v1/payments", "acct", Some("hb"), BODY)),
    )
    .await
    .expect("the response came");
    assert_eq!(res.status, StatusCode::CREATED);
}

/// The outside systems of [`charging_routes`]: how many charges and e-mails were sent.
#[derive(Default)]
struct Ledger {
    charges: AtomicUsize,
    emails: AtomicUsize,
}

/// A two-step payment through `IdempotencyContext::call`: a charge that takes `charge`, a
/// recovery point, then an e-mail. A refused call suspends the request at its recovery point.
fn charging_routes(ledger: Arc<Ledger>, charge: Duration) -> Router {
    use axum::{Extension, response::IntoResponse};
    use oncely_tower::HandlerOutcome;
    let suspended = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Extension(HandlerOutcome::Suspended),
            "suspended",
        )
            .into_response()
    };
    Router::new().route(
        "/v1/payments",
        post(move |ctx: IdempotencyContext| {
            let ledger = ledger.clone();
            async move {
                let step: Option<String> = ctx.resume_from().unwrap();
                if step.as_deref() != Some("charged") {
                    let charged = ctx
                        .call(|| async {
                            ledger.charges.fetch_add(1, Ordering::SeqCst);
                            sleep(charge).await;
                        })
                        .await;
                    if charged.is_err() {
                        return suspended();
                    }
                    if ctx.checkpoint(&"charged").await.is_err() {
                        // Fenced: another request took the key over.
                        return StatusCode::CONFLICT.into_response();
                    }
                }
                let sent = ctx
                    .call(|| async {
                        ledger.emails.fetch_add(1, Ordering::SeqCst);
                    })
                    .await;
                if sent.is_err() {
                    return suspended();
                }
                (StatusCode::CREATED, "paid").into_response()
            }
        }),
    )
}

/// Two instances (`a`, drained, and `b`) on one store; a payment on `a` whose charge takes 10
/// s; `a` drains with a shutdown grace of 1 s, 1 s in, and abandons with `wait` for outside
/// calls, while duplicates go to `b` every 500 ms until one is answered `201`. Returns what
/// `abandon` returned, `a`'s answer, every answer of `b`, and the ledger.
async fn drain_during_a_charge(wait: Duration) -> (usize, Got, Vec<Got>, Arc<Ledger>) {
    let clock = TokioClock::new();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock)));
    let ledger = Arc::new(Ledger::default());
    let charge = Duration::from_secs(10);
    let a = layer(store.clone(), clock, InFlightBehavior::Reject);
    let drain = a.drain().with_outside_call_wait(wait);
    let a = app(a, charging_routes(ledger.clone(), charge));
    let b = app(
        layer(store.clone(), clock, InFlightBehavior::Reject),
        charging_routes(ledger.clone(), charge),
    );
    let req = || post_req("/v1/payments", "acct", Some("pay-1"), BODY);
    let first = {
        let a = a.clone();
        tokio::spawn(async move { send(&a, req()).await })
    };
    sleep(Duration::from_secs(1)).await;
    drain.start();
    let abandoned = tokio::spawn(async move {
        if tokio::time::timeout(Duration::from_secs(1), drain.idle())
            .await
            .is_err()
        {
            drain.abandon().await
        } else {
            0
        }
    });
    let mut answers = Vec::new();
    loop {
        sleep(Duration::from_millis(500)).await;
        let got = send(&b, req()).await;
        let done = got.status == StatusCode::CREATED;
        answers.push(got);
        if done || answers.len() > 200 {
            break;
        }
    }
    let first = first.await.unwrap();
    (abandoned.await.unwrap(), first, answers, ledger)
}

/// Every duplicate was answered in flight until the last, the retry that resumed and finished.
fn in_flight_then_resumed(answers: &[Got]) {
    let (last, before) = answers.split_last().unwrap();
    assert_eq!(
        last.status,
        StatusCode::CREATED,
        "the retry resumed and finished"
    );
    assert!(before.len() >= 15, "{} duplicates", before.len());
    for d in before {
        assert_eq!(d.code(), "idempotency_request_in_flight", "{d:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_an_outside_call_and_suspends_at_the_next_recovery_point() {
    let (suspended, first, answers, ledger) = drain_during_a_charge(Duration::from_secs(30)).await;
    assert_eq!(
        ledger.charges.load(Ordering::SeqCst),
        1,
        "the card was charged once"
    );
    // The drain waited for the charge (10 s, past the 1 s grace), then the request recorded
    // it and stopped before the e-mail: suspended there, not in the middle of the charge.
    assert_eq!(suspended, 1);
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    in_flight_then_resumed(&answers);
    assert_eq!(ledger.emails.load(Ordering::SeqCst), 1, "one receipt");
}

#[tokio::test(start_paused = true)]
async fn a_drain_that_cannot_wait_for_an_outside_call_keeps_its_lease() {
    // The drain gives up 3 s in, the charge still running: it does not cut the lease, so no
    // duplicate takes the key over while the charge may still land.
    let (suspended, first, answers, ledger) = drain_during_a_charge(Duration::from_secs(3)).await;
    assert_eq!(
        ledger.charges.load(Ordering::SeqCst),
        1,
        "the card was charged once"
    );
    assert_eq!(suspended, 0);
    in_flight_then_resumed(&answers);
    // Here the process lives on: the request stopped at its next recovery point itself.
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(ledger.emails.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_suspended_by_a_drain_makes_no_further_outside_call() {
    // Not inside an outside call when the drain abandons it (it works for 5 s first): it is
    // suspended at once, and its charge, due after that, is refused.
    let clock = TokioClock::new();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock)));
    let charges = Arc::new(AtomicUsize::new(0));
    let l = layer(store.clone(), clock, InFlightBehavior::Reject);
    let drain = l.drain();
    let routes = {
        let charges = charges.clone();
        Router::new().route(
            "/v1/payments",
            post(move |ctx: IdempotencyContext| {
                let charges = charges.clone();
                async move {
                    sleep(Duration::from_secs(5)).await;
                    let charged = ctx
                        .call(|| async {
                            charges.fetch_add(1, Ordering::SeqCst);
                        })
                        .await;
                    match charged {
                        Ok(()) => StatusCode::CREATED,
                        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
                    }
                }
            }),
        )
    };
    let a = app(l, routes);
    let first = tokio::spawn(async move {
        send(&a, post_req("/v1/payments", "acct", Some("late"), BODY)).await
    });
    sleep(Duration::from_secs(1)).await;
    drain.start();
    assert_eq!(drain.abandon().await, 1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        charges.load(Ordering::SeqCst),
        0,
        "no charge after the suspension"
    );
}
