//! Records of the first form, written by older versions (the identity as `scope`/`key` fields, header values and the
//! request as arrays of byte values, the request kept after completion) still work on the real
//! server: they decode, replay, are listed as abandoned, are taken over and complete. New
//! records carry no identity fields and, once complete, no request. Skips, with a printed
//! reason, when `ONCELY_TEST_REDIS_URL` is unset.

mod common;

use common::{claim_req, fresh_id, redis_url, response};
use oncely_conformance::fp;
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, KeyStore, Maintenance, ManualClock, RecordKey, RecordState,
    StoredRequest,
};
use oncely_redis::{ClockSource, RedisConfig, RedisStore};
use std::sync::Arc;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

async fn store(clock: &ManualClock) -> Option<(RedisStore, redis::aio::MultiplexedConnection)> {
    let url = redis_url()?;
    let config =
        RedisConfig::new().with_namespace(format!("oncely-forms-{}", uuid::Uuid::new_v4()));
    let store = RedisStore::connect_with(&url, config)
        .await
        .expect("connect to ONCELY_TEST_REDIS_URL")
        .with_clock_source(ClockSource::Application(Arc::new(clock.clone())));
    let conn = redis::Client::open(url.split('?').next().unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((store, conn))
}

/// The bytes of `s` as the pre-issue-12 encoding wrote every byte string: `[104,105]`.
fn byte_array(s: &[u8]) -> String {
    format!("{s:?}").replace(' ', "")
}

fn old_request(body: &str) -> (String, StoredRequest) {
    let json = format!(
        r#"{{"method":"POST","uri":"/v1/payments","headers":[["content-type",{}]],"body":{}}}"#,
        byte_array(b"application/json"),
        byte_array(body.as_bytes())
    );
    let decoded = StoredRequest::new(
        "POST",
        "/v1/payments",
        vec![("content-type".into(), b"application/json".to_vec())],
        body.as_bytes().to_vec(),
    );
    (json, decoded)
}

/// Writes a record hash exactly as older versions wrote it (the first form).
async fn write_old(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &RedisStore,
    id: &RecordKey,
    body: &str,
    state: &[(&str, Vec<u8>)],
) {
    let digest = fp(body);
    let (req, _) = old_request(body);
    let mut cmd = redis::cmd("HSET");
    cmd.arg(store.key_of(id))
        .arg("scope")
        .arg(id.scope.as_str())
        .arg("key")
        .arg(id.key.as_str())
        .arg("fp_v")
        .arg(digest.version().to_string())
        .arg("fp")
        .arg(digest.digest().to_vec())
        .arg("token")
        .arg("4")
        .arg("created")
        .arg("1000")
        .arg("req")
        .arg(req);
    for (name, value) in state {
        cmd.arg(*name).arg(value.as_slice());
    }
    let _: () = cmd.query_async(conn).await.unwrap();
}

async fn fields(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let mut names: Vec<String> = redis::cmd("HKEYS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    names.sort();
    names
}

#[tokio::test]
async fn an_old_complete_record_decodes_and_replays() {
    let clock = ManualClock::starting_now();
    let Some((store, mut conn)) = store(&clock).await else {
        return;
    };
    let id = fresh_id("old-complete");
    let now = clock.now_millis();
    let headers = format!(
        r#"[["content-type",{}],["x-multi",{}],["x-multi",{}]]"#,
        byte_array(b"application/json"),
        byte_array(b"1"),
        byte_array(b"2")
    );
    write_old(
        &mut conn,
        &store,
        &id,
        r#"{"n":1}"#,
        &[
            ("state", b"complete".to_vec()),
            ("status", b"201".to_vec()),
            ("headers", headers.into_bytes()),
            ("body", b"old".to_vec()),
            ("retained", b"1".to_vec()),
            ("completed", now.to_string().into_bytes()),
            ("expires", (now + 3_600_000).to_string().into_bytes()),
        ],
    )
    .await;
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!((&rec.scope, &rec.key), (&id.scope, &id.key));
    assert_eq!(rec.request, Some(old_request(r#"{"n":1}"#).1));
    assert_eq!(
        rec.state,
        RecordState::Complete {
            response: response("old"),
            completed_at: now
        }
    );
    match store
        .claim(claim_req(&id, r#"{"n":1}"#, LEASE))
        .await
        .unwrap()
    {
        ClaimOutcome::Replay {
            response: r,
            completed_at,
        } => assert_eq!((r, completed_at), (response("old"), now)),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        store
            .claim(claim_req(&id, r#"{"n":2}"#, LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Mismatch
    ));
}

#[tokio::test]
async fn an_old_abandoned_record_is_listed_taken_over_and_completed() {
    let clock = ManualClock::starting_now();
    let Some((store, mut conn)) = store(&clock).await else {
        return;
    };
    let id = fresh_id("old-abandoned");
    let now = clock.now_millis();
    write_old(
        &mut conn,
        &store,
        &id,
        r#"{"n":1}"#,
        &[
            ("state", b"in_flight".to_vec()),
            ("lease", (now - 60_000).to_string().into_bytes()),
            ("rp", b"charged".to_vec()),
            ("expires", (now + 3_600_000).to_string().into_bytes()),
        ],
    )
    .await;
    let listed = store
        .list_abandoned(Duration::from_secs(1), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((&listed[0].scope, &listed[0].key), (&id.scope, &id.key));
    assert_eq!(listed[0].request, Some(old_request(r#"{"n":1}"#).1));
    let c = match store
        .claim(claim_req(&id, r#"{"n":1}"#, LEASE))
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a takeover, got {other:?}"),
    };
    assert_eq!(
        (c.kind, c.recovery_point.as_deref(), c.token.0),
        (ClaimKind::Takeover, Some("charged"), 5)
    );
    // The takeover rewrote the hash in today's form, keeping the old request for the completer.
    let key = store.key_of(&id);
    let names = fields(&mut conn, &key).await;
    assert!(!names.contains(&"scope".to_owned()), "{names:?}");
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (rec.created_at, rec.request),
        (1000, Some(old_request(r#"{"n":1}"#).1))
    );
    store
        .complete(&id, c.token, response("done"), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        fields(&mut conn, &key).await,
        [
            "body",
            "completed",
            "created",
            "expires",
            "fp",
            "fp_v",
            "headers",
            "retained",
            "state",
            "status",
            "token"
        ]
    );
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (&rec.scope, &rec.key, &rec.request),
        (&id.scope, &id.key, &None)
    );
    assert!(matches!(
        store
            .claim(claim_req(&id, r#"{"n":1}"#, LEASE))
            .await
            .unwrap(),
        ClaimOutcome::Replay { .. }
    ));
}

#[tokio::test]
async fn an_old_in_flight_record_completes_without_its_request() {
    let clock = ManualClock::starting_now();
    let Some((store, mut conn)) = store(&clock).await else {
        return;
    };
    let id = fresh_id("old-in-flight");
    let now = clock.now_millis();
    write_old(
        &mut conn,
        &store,
        &id,
        "{}",
        &[
            ("state", b"in_flight".to_vec()),
            ("lease", (now + 30_000).to_string().into_bytes()),
            ("expires", (now + 3_600_000).to_string().into_bytes()),
        ],
    )
    .await;
    // Its owner (an older process) completes with the token it holds.
    store
        .complete(
            &id,
            oncely_core::FencingToken(4),
            response("late"),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    let names = fields(&mut conn, &store.key_of(&id)).await;
    assert!(!names.contains(&"req".to_owned()), "{names:?}");
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!((&rec.scope, &rec.request), (&id.scope, &None));
    assert_eq!(rec.state_name(), "complete");
}
