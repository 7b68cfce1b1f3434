//! The gRPC layer with a real tonic server and client over TCP: replays byte for byte with their
//! trailers, mismatches, in-flight duplicates, an unavailable store, deadlines and the lease,
//! streaming methods. The replay and in-flight tests run on every store the environment has.

mod common;

use common::echo::SayRequest;
use common::{REPEAT, SAY, fresh_key, keyed, raw_call, say, serve};
use oncely_core::{MemoryStore, Policy, RecordState};
use oncely_grpc::decode_details;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_stream::StreamExt as _;
use tonic::Code;
use tonic_types::StatusExt as _;

/// The `ErrorInfo` reason and `RetryInfo` delay of a status.
fn details(s: &tonic::Status) -> (String, Option<Duration>) {
    let d = s.get_error_details();
    let info = d
        .error_info()
        .expect("every answer of the layer has ErrorInfo");
    assert_eq!(info.domain, "oncely.dev");
    assert_eq!(info.metadata["code"].to_ascii_uppercase(), info.reason);
    (
        info.reason.clone(),
        d.retry_info().and_then(|r| r.retry_delay),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_are_byte_identical_with_their_trailers_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    for (name, store) in common::stores(&dir).await {
        let server = serve(store, Policy::default()).await;
        // A success: messages, then `grpc-status: 0` in the trailers.
        let key = fresh_key();
        let first = raw_call(server.addr, SAY, &key, &say("hello")).await;
        let replay = raw_call(server.addr, SAY, &key, &say("hello")).await;
        assert_eq!(first.status, 200, "{name}");
        assert_eq!(
            first.trailers,
            vec![("grpc-status".to_owned(), b"0".to_vec())],
            "{name}"
        );
        assert_eq!(replay.body, first.body, "{name}: the same message bytes");
        assert_eq!(replay.trailers, first.trailers, "{name}: the same trailers");
        let marker = ("idempotent-replayed".to_owned(), b"true".to_vec());
        assert!(replay.headers.contains(&marker), "{name}");
        let without: Vec<_> = replay
            .headers
            .iter()
            .filter(|h| **h != marker)
            .cloned()
            .collect();
        assert_eq!(
            without, first.headers,
            "{name}: the same headers, plus the marker"
        );
        assert_eq!(server.executions(), 1, "{name}");

        // A stored error: `NOT_FOUND` is a final answer, replayed with its message.
        let key = fresh_key();
        let req = SayRequest {
            fail_with: 5,
            ..say("gone")
        };
        let first = raw_call(server.addr, SAY, &key, &req).await;
        let replay = raw_call(server.addr, SAY, &key, &req).await;
        let status = |r: &common::Raw| {
            r.headers
                .iter()
                .chain(&r.trailers)
                .filter(|(n, _)| n.starts_with("grpc-"))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            status(&first),
            vec![
                ("grpc-status".to_owned(), b"5".to_vec()),
                (
                    "grpc-message".to_owned(),
                    b"failed%20on%20purpose:%20gone".to_vec()
                )
            ],
            "{name}"
        );
        assert_eq!(status(&replay), status(&first), "{name}");
        assert_eq!(replay.body, first.body, "{name}");
        assert_eq!(server.executions(), 2, "{name}: the error ran once");

        // Through tonic's own client: the reply of the first execution.
        let mut client = server.client().await;
        let key = fresh_key();
        let a = client.say(keyed(say("tonic"), Some(&key))).await.unwrap();
        let b = client.say(keyed(say("tonic"), Some(&key))).await.unwrap();
        assert_eq!(a.get_ref(), b.get_ref(), "{name}");
        assert_eq!(b.get_ref().execution, 3, "{name}");
        assert!(a.metadata().get("idempotent-replayed").is_none());
        assert_eq!(b.metadata().get("idempotent-replayed").unwrap(), "true");
        assert_eq!(server.metrics.snapshot().replays, 3, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_duplicates_are_aborted_with_retry_info_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    for (name, store) in common::stores(&dir).await {
        let server = serve(store, Policy::default()).await;
        let key = fresh_key();
        let slow = SayRequest {
            delay_ms: 800,
            ..say("slow")
        };
        let mut c1 = server.client().await;
        let (req, k) = (slow.clone(), key.clone());
        let first = tokio::spawn(async move { c1.say(keyed(req, Some(&k))).await });
        // Wait until the first call runs, then send the duplicate.
        while server.executions() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut c2 = server.client().await;
        let dup = c2.say(keyed(slow.clone(), Some(&key))).await.unwrap_err();
        assert_eq!(dup.code(), Code::Aborted, "{name}: {dup:?}");
        let (reason, delay) = details(&dup);
        assert_eq!(reason, "IDEMPOTENCY_REQUEST_IN_FLIGHT");
        assert!(
            delay.is_some_and(|d| d >= Duration::from_secs(1)),
            "{name}: {delay:?}"
        );
        let first = first.await.unwrap().unwrap();
        // The retry after the first completed replays it.
        let again = c2.say(keyed(slow, Some(&key))).await.unwrap();
        assert_eq!(again.get_ref(), first.get_ref(), "{name}");
        assert_eq!(server.executions(), 1, "{name}");
        assert_eq!(server.metrics.snapshot().in_flight_conflicts, 1, "{name}");
    }
}

#[tokio::test]
async fn a_mismatch_is_a_failed_precondition_never_retried_never_replayed() {
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    let mut client = server.client().await;
    let key = fresh_key();
    client.say(keyed(say("a"), Some(&key))).await.unwrap();
    let e = client.say(keyed(say("b"), Some(&key))).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(details(&e), ("IDEMPOTENCY_KEY_MISMATCH".to_owned(), None));
    // The same key on another method is a different call too.
    let e = client
        .repeat(keyed(
            SayRequest {
                count: 1,
                ..say("a")
            },
            Some(&key),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn missing_invalid_and_unscoped_keys_are_refused_before_anything_runs() {
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    let mut client = server.client().await;
    let e = client.say(keyed(say("a"), None)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(details(&e).0, "IDEMPOTENCY_KEY_MISSING");
    let long = "k".repeat(256);
    let e = client.say(keyed(say("a"), Some(&long))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(details(&e).0, "IDEMPOTENCY_KEY_INVALID");
    let mut req = tonic::Request::new(say("a"));
    req.metadata_mut()
        .insert("idempotency-key", "k1".parse().unwrap());
    let e = client.say(req).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(details(&e).0, "IDEMPOTENCY_SCOPE_MISSING");
    assert_eq!(server.executions(), 0);
}

#[tokio::test]
async fn an_unavailable_store_fails_closed_with_retry_info_and_the_retry_runs_once() {
    let switch = Arc::new(common::Switch {
        inner: Arc::new(MemoryStore::new()),
        down: true.into(),
    });
    let server = serve(switch.clone(), Policy::default()).await;
    let mut client = server.client().await;
    let key = fresh_key();
    let e = client.say(keyed(say("a"), Some(&key))).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(
        details(&e),
        (
            "IDEMPOTENCY_STORE_UNAVAILABLE".to_owned(),
            Some(Duration::from_secs(1))
        )
    );
    assert_eq!(server.executions(), 0, "never runs without a claim");
    switch.down.store(false, Ordering::SeqCst);
    let r = client.say(keyed(say("a"), Some(&key))).await.unwrap();
    assert_eq!(r.get_ref().execution, 1);
}

#[tokio::test]
async fn handler_statuses_are_stored_or_released_by_the_store_policy() {
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    let mut client = server.client().await;
    // ABORTED (409) is not stored: the key is released and the retry runs again.
    let key = fresh_key();
    let req = SayRequest {
        fail_with: 10,
        ..say("conflict")
    };
    for _ in 0..2 {
        let e = client
            .say(keyed(req.clone(), Some(&key)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Aborted);
        assert_eq!(e.message(), "failed on purpose: conflict");
    }
    assert_eq!(server.executions(), 2);
    // INVALID_ARGUMENT (400) is a final answer: stored, replayed.
    let key = fresh_key();
    let req = SayRequest {
        fail_with: 3,
        ..say("bad")
    };
    for _ in 0..2 {
        let e = client
            .say(keyed(req.clone(), Some(&key)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    assert_eq!(server.executions(), 3);
}

/// Every one of the 17 gRPC statuses a (non-transactional) handler can answer, through a real
/// server: each is answered to the first call, and a retry with the same key either replays it
/// (stored) or runs the handler again (released). Only `ABORTED` and `RESOURCE_EXHAUSTED` say
/// "nothing was done, try again"; `ALREADY_EXISTS` is a final answer, and the failures
/// (`CANCELLED`, `UNAVAILABLE`, ...) are stored because the handler's effects are unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_handler_status_is_stored_or_released_by_its_meaning() {
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    for (n, code) in oncely_grpc::status::ALL_CODES.into_iter().enumerate() {
        let released = matches!(code, Code::Aborted | Code::ResourceExhausted);
        let key = fresh_key();
        let req = SayRequest {
            fail_with: i32::try_from(n).unwrap(),
            ..say("status")
        };
        let before = server.executions();
        let first = raw_call(server.addr, SAY, &key, &req).await;
        let retry = raw_call(server.addr, SAY, &key, &req).await;
        let grpc_status = |r: &common::Raw| {
            r.headers
                .iter()
                .chain(&r.trailers)
                .find(|(name, _)| name == "grpc-status")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(grpc_status(&first), Some(n.to_string()), "{code:?}");
        assert_eq!(grpc_status(&retry), Some(n.to_string()), "{code:?}");
        let replayed = retry
            .headers
            .contains(&("idempotent-replayed".to_owned(), b"true".to_vec()));
        assert_eq!(replayed, !released, "{code:?}: replayed");
        let runs = if released { 2 } else { 1 };
        assert_eq!(server.executions() - before, runs, "{code:?}: executions");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_deadline_does_not_shorten_the_lease() {
    let store = Arc::new(MemoryStore::new());
    let server = serve(store.clone(), Policy::default()).await;
    let mut client = server.client().await;
    let key = fresh_key();
    let slow = SayRequest {
        delay_ms: 1500,
        ..say("slow")
    };
    let mut req = keyed(slow.clone(), Some(&key));
    req.set_timeout(Duration::from_millis(200));
    let e = client.say(req).await.unwrap_err();
    // tonic says an expired deadline as CANCELLED "Timeout expired" (client and server side).
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled)
            && e.message() == "Timeout expired",
        "{e:?}"
    );
    // The handler saw the deadline, at most 200 ms.
    let seen = server.svc.deadlines.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0] <= Duration::from_millis(200), "{seen:?}");
    // The claim keeps the policy's 30-second lease, not the 200 ms deadline.
    let id = oncely_core::RecordKey::new(
        oncely_core::Scope::new("acct_1"),
        oncely_core::IdempotencyKey::new(&key).unwrap(),
    );
    let rec = oncely_core::KeyStore::get(&*store, &id)
        .await
        .unwrap()
        .unwrap();
    let RecordState::InFlight {
        lease_expires_at, ..
    } = rec.state
    else {
        panic!("expected in flight, got {:?}", rec.state)
    };
    assert!(
        lease_expires_at - rec.created_at >= 29_000,
        "lease {} ms",
        lease_expires_at - rec.created_at
    );
    // So a retry after the deadline, while the handler still runs, does not run it again.
    let e = client
        .say(keyed(slow.clone(), Some(&key)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    // The handler ran to the end and stored its reply: the next retry replays it.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let r = client.say(keyed(slow, Some(&key))).await.unwrap();
    assert_eq!(r.get_ref().execution, 1);
    assert_eq!(r.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn streaming_methods_refuse_keys_and_pass_through_without_one() {
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    let mut client = server.client().await;
    let msgs = || tokio_stream::iter(vec![say("a"), say("b")]);
    // Client streaming and bidirectional with a key: refused, nothing runs.
    let e = client.collect(keyed(msgs(), Some("k1"))).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert_eq!(details(&e).0, "IDEMPOTENCY_STREAMING_UNSUPPORTED");
    let e = client.chat(keyed(msgs(), Some("k1"))).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert_eq!(server.executions(), 0);
    // Without a key: served as usual, every call runs.
    let r = client.collect(keyed(msgs(), None)).await.unwrap();
    assert_eq!(r.get_ref().text, "a,b");
    let replies: Vec<_> = client
        .chat(keyed(msgs(), None))
        .await
        .unwrap()
        .into_inner()
        .collect::<Result<Vec<_>, _>>()
        .await
        .unwrap();
    assert_eq!(
        replies.iter().map(|r| r.text.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(server.executions(), 2);
}

#[tokio::test]
async fn a_server_streaming_reply_is_replayed_message_for_message() {
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    let key = fresh_key();
    let req = SayRequest {
        count: 3,
        ..say("tick")
    };
    let first = raw_call(server.addr, REPEAT, &key, &req).await;
    let replay = raw_call(server.addr, REPEAT, &key, &req).await;
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.trailers, first.trailers);
    assert_eq!(
        first.trailers,
        vec![("grpc-status".to_owned(), b"0".to_vec())]
    );
    let mut client = server.client().await;
    let texts: Vec<String> = client
        .repeat(keyed(req, Some(&key)))
        .await
        .unwrap()
        .into_inner()
        .map(|r| r.unwrap().text)
        .collect()
        .await;
    assert_eq!(texts, ["tick #0", "tick #1", "tick #2"]);
    assert_eq!(server.executions(), 1);
}

#[test]
fn the_accepted_in_flight_mode_has_no_grpc_form() {
    let layer = oncely_tower::IdempotencyLayer::new(Arc::new(MemoryStore::new())).with_policy(
        Policy::default().with_in_flight(oncely_core::InFlightBehavior::Accepted {
            status_url: "/v1/keys/{key}",
        }),
    );
    assert_eq!(
        oncely_grpc::GrpcIdempotencyLayer::from_layer(layer, common::methods()).unwrap_err(),
        oncely_grpc::UnsupportedPolicy::AcceptedInFlight
    );
    // And the details decoder reads what the layer writes.
    assert!(decode_details(b"not base64!").is_err());
}

#[tokio::test]
async fn a_hand_built_unary_reply_is_what_tonic_sends() {
    use http_body_util::BodyExt as _;
    let server = serve(Arc::new(MemoryStore::new()), Policy::default()).await;
    let from_tonic = raw_call(server.addr, SAY, &fresh_key(), &say("same")).await;
    let reply = common::echo::SayReply {
        text: "same".into(),
        execution: 1,
    };
    let ours = oncely_grpc::unary::reply(&reply);
    assert_eq!(ours.headers()["content-type"], "application/grpc");
    assert!(
        from_tonic
            .headers
            .contains(&("content-type".to_owned(), b"application/grpc".to_vec()))
    );
    let collected = ours.into_body().collect().await.unwrap();
    let trailers: Vec<(String, Vec<u8>)> = collected
        .trailers()
        .unwrap()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    assert_eq!(trailers, from_tonic.trailers);
    let body = collected.to_bytes();
    assert_eq!(body, from_tonic.body);
    // And the request decoder reads what a client sends.
    let back: SayRequest = oncely_grpc::unary::decode_request(&{
        let m = prost::Message::encode_to_vec(&say("x"));
        let mut framed = vec![0, 0, 0, 0, u8::try_from(m.len()).unwrap()];
        framed.extend_from_slice(&m);
        framed
    })
    .unwrap();
    assert_eq!(back, say("x"));
    for bad in [&b""[..], b"\x01\0\0\0\0", b"\0\0\0\0\x05ab"] {
        assert!(
            oncely_grpc::unary::decode_request::<SayRequest>(bad).is_err(),
            "{bad:?}"
        );
    }
}
