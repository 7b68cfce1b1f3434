//! What is particular to MySQL and MariaDB: byte-exact keys and scopes (no collation folds or
//! pads them), binary bodies and `utf8mb4` recovery points, the scope's length, the session
//! settings of `connect`, rows matched (not changed) as an owner write's count, the reaper's
//! `SKIP LOCKED`, concurrent migrations (MariaDB's `GET_LOCK`), and how a transaction that
//! ended behind its owner's back is told from one the server rolled back. Skipped when
//! `ONCELY_TEST_MYSQL_URL` is unset.

mod common;

use oncely_conformance::{LEASE, RETENTION, claim_req, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, IdempotencyKey, KeyStore, Maintenance, ManualClock, RecordKey,
    RecordState, Scope, StoreError, StoredResponse,
};
use oncely_mysql::{MySqlStore, MySqlStoreError};
use sqlx::Executor;
use std::sync::Arc;
use std::time::Duration;

fn id(scope: &str, key: &str) -> RecordKey {
    RecordKey::new(Scope::new(scope), IdempotencyKey::new(key).unwrap())
}

fn claimed(outcome: ClaimOutcome) -> oncely_core::Claim {
    match outcome {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Keys that differ only in case, and scopes that differ in case, accents or trailing spaces,
/// are different records: a `_ci`, `_ai` or `PAD SPACE` collation would make them one, and a
/// tenant's retry would replay another tenant's response.
#[tokio::test]
async fn keys_and_scopes_compare_byte_for_byte() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    let base = common::fresh_scope("bytes").to_string();
    let ids = [
        id(&base, "Order-1"),
        id(&base, "order-1"),
        id(&format!("{base}-t"), "k"),
        id(&format!("{base}-T"), "k"),
        id(&format!("{base}-t "), "k"),
        id(&format!("{base}-té"), "k"),
        id(&format!("{base}-te"), "k"),
    ];
    for id in &ids {
        let c = claimed(store.claim(claim_req(id, "{}")).await.unwrap());
        assert_eq!((c.kind, c.token.0), (ClaimKind::New, 1), "{id:?}");
    }
    for id in &ids {
        let rec = store.get(id).await.unwrap().expect("its own record");
        assert_eq!(
            (rec.scope.as_str(), rec.key.as_str()),
            (id.scope.as_str(), id.key.as_str())
        );
    }
}

/// A response body of every byte value (and 1 MiB of them), header values that are not UTF-8,
/// and a recovery point with characters outside the Basic Multilingual Plane (4 bytes in UTF-8,
/// what MySQL's 3-byte `utf8` cannot hold) come back exactly.
#[tokio::test]
async fn binary_bodies_and_unicode_recovery_points_survive() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    let id = RecordKey::new(
        common::fresh_scope("binary"),
        IdempotencyKey::new("k").unwrap(),
    );
    let c = claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    let point = "{\"step\":\"charged\",\"note\":\"🚀 naïve 漢字 \\u0000\"}";
    store.checkpoint(&id, c.token, point, LEASE).await.unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.recovery_point(), Some(point));
    let body: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let response = StoredResponse::new(
        200,
        vec![
            (
                "content-type".to_owned(),
                b"application/octet-stream".to_vec(),
            ),
            ("x-raw".to_owned(), vec![0xff, 0x00, 0xfe, b'\n']),
        ],
        body,
    );
    store
        .complete(&id, c.token, response.clone(), RETENTION)
        .await
        .unwrap();
    let rec = store.get(&id).await.unwrap().unwrap();
    let RecordState::Complete { response: got, .. } = rec.state else {
        panic!("complete: {:?}", rec.state)
    };
    assert_eq!(got, response);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().fingerprint,
        claim_req(&id, "{}").fingerprint
    );
}

/// A scope one byte over its column is refused before any statement, also on a pool whose
/// sessions are not strict (where MySQL would cut the value to the column and store it under
/// another tenant's scope); one exactly at the limit is kept whole.
#[tokio::test]
async fn a_scope_longer_than_its_column_is_refused_never_cut() {
    let Some(url) = common::url() else { return };
    let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move { conn.execute("SET SESSION sql_mode = ''").await.map(drop) })
        })
        .connect_with(options)
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool, Arc::new(ManualClock::starting_now()));
    store.migrate().await.unwrap();
    let prefix = common::fresh_scope("long").to_string();
    let at_limit = format!(
        "{prefix}{}",
        "s".repeat(MySqlStore::MAX_SCOPE_BYTES - prefix.len())
    );
    let c = claimed(
        store
            .claim(claim_req(&id(&at_limit, "k"), "{}"))
            .await
            .unwrap(),
    );
    assert_eq!(c.token.0, 1);
    assert_eq!(
        store
            .get(&id(&at_limit, "k"))
            .await
            .unwrap()
            .unwrap()
            .scope
            .as_str(),
        at_limit
    );
    let over = format!("{at_limit}x");
    let e = store
        .claim(claim_req(&id(&over, "k"), "{}"))
        .await
        .unwrap_err();
    let StoreError::Unavailable(source) = &e else {
        panic!("refused: {e:?}")
    };
    assert!(
        matches!(
            source.downcast_ref::<MySqlStoreError>(),
            Some(MySqlStoreError::ScopeTooLong { len }) if *len == MySqlStore::MAX_SCOPE_BYTES + 1
        ),
        "{e}"
    );
    // The record at the limit is untouched (a cut scope would have hit it: in flight).
    let rec = store.get(&id(&at_limit, "k")).await.unwrap().unwrap();
    assert_eq!((rec.token.0, rec.state_name()), (1, "in_flight"));
}

/// `connect` gives every connection the 4-second lock-wait bound and a strict `sql_mode`.
#[tokio::test]
async fn connect_sessions_are_strict_and_bounded() {
    let Some(url) = common::url() else { return };
    let store = MySqlStore::connect(&url).await.unwrap();
    let (wait, mode): (u64, String) =
        sqlx::query_as("SELECT @@SESSION.innodb_lock_wait_timeout, @@SESSION.sql_mode")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(wait, MySqlStore::TX_LOCK_TIMEOUT.as_secs());
    assert!(mode.split(',').any(|m| m.starts_with("STRICT_")), "{mode}");
}

/// An owner write that sets a column to its current value (a renewal in the same millisecond)
/// still counts its row (sqlx connects with `CLIENT_FOUND_ROWS`): not fenced.
#[tokio::test]
async fn an_owner_write_that_changes_nothing_is_not_fenced() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    let id = RecordKey::new(
        common::fresh_scope("same"),
        IdempotencyKey::new("k").unwrap(),
    );
    let c = claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
    let first = store.renew(&id, c.token, LEASE).await.unwrap();
    let again = store.renew(&id, c.token, LEASE).await.unwrap();
    assert_eq!(first, again, "the clock did not move");
    store.checkpoint(&id, c.token, "p", LEASE).await.unwrap();
    store.checkpoint(&id, c.token, "p", LEASE).await.unwrap();
}

/// The reaper passes over a row another transaction holds (`SKIP LOCKED`) instead of waiting
/// for it, and reaps it once it is free.
#[tokio::test]
async fn the_reaper_skips_rows_others_hold() {
    // 2001: apart from the conformance suite's clocks (2000 and 2002), so this test reaps only
    // what it made (and leftovers of earlier runs).
    let clock = ManualClock::new(978_307_200_000);
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    let hour = Duration::from_secs(3600);
    let (held, free) = (
        RecordKey::new(
            common::fresh_scope("held"),
            IdempotencyKey::new("k").unwrap(),
        ),
        RecordKey::new(
            common::fresh_scope("free"),
            IdempotencyKey::new("k").unwrap(),
        ),
    );
    for id in [&held, &free] {
        let c = claimed(store.claim(claim_req(id, "{}")).await.unwrap());
        store
            .complete(id, c.token, tricky_response(), hour)
            .await
            .unwrap();
    }
    clock.advance(2 * hour);
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query(
        "SELECT token FROM oncely_idempotency_keys WHERE scope = ? AND `key` = ? FOR UPDATE",
    )
    .bind(held.scope.as_str().as_bytes())
    .bind(held.key.as_str().as_bytes())
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    let reap_all = || async {
        loop {
            let r = tokio::time::timeout(Duration::from_secs(20), store.reap(1000))
                .await
                .expect("the reaper does not wait for the held row")
                .expect("reap");
            if r.deleted < 1000 {
                break;
            }
        }
    };
    reap_all().await;
    assert!(store.get(&held).await.unwrap().is_some(), "held: skipped");
    assert_eq!(store.get(&free).await.unwrap(), None, "free: reaped");
    holder.commit().await.unwrap();
    reap_all().await;
    assert_eq!(store.get(&held).await.unwrap(), None, "reaped once free");
}

/// Eight processes' worth of stores run the migrations at once against a brand-new database:
/// they take turns under the store's named lock; each succeeds and each migration is applied
/// once. (sqlx's own lock waits for nothing on MariaDB, where two runs then applied the same
/// migration and one failed on its history's primary key.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_on_a_fresh_database() {
    let Some(url) = common::url() else { return };
    let admin = MySqlStore::connect(&url).await.unwrap();
    let db = format!("oncely_migrate_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(admin.pool())
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').expect("url with a database name");
    let fresh_url = format!("{base}/{db}");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let fresh_url = fresh_url.clone();
        tasks.push(tokio::spawn(async move {
            let store = MySqlStore::connect(&fresh_url).await?;
            let r = store.migrate().await;
            store.pool().close().await;
            r
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("every concurrent migrate succeeds");
    }
    let check = MySqlStore::connect(&fresh_url).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _oncely_migrations WHERE success")
        .fetch_one(check.pool())
        .await
        .unwrap();
    let shipped = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count();
    assert_eq!(
        applied, shipped as i64,
        "each shipped migration applied once"
    );
    let indexes: i64 = sqlx::query_scalar(
        "SELECT COUNT(DISTINCT index_name) FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = 'oncely_idempotency_keys'",
    )
    .fetch_one(check.pool())
    .await
    .unwrap();
    assert_eq!(indexes, 3, "primary key, expires_at, leases");
    check.pool().close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {db}")))
        .execute(admin.pool())
        .await
        .unwrap();
}

/// A transaction its owner's connection ended with `COMMIT` or `ROLLBACK` (then a failed
/// statement, as a handler's error path) is told apart from one still open, and from one the
/// server rolled back as a deadlock's victim (which must stay a transient failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_ended_behind_is_told_from_a_deadlock() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    for end in ["COMMIT", "ROLLBACK"] {
        let mut tx = store.begin_tx().await.unwrap();
        assert!(store.transaction_is_open(&mut tx).await.unwrap());
        assert!(
            !store.ended_by_its_owner(&mut tx).await,
            "{end}: still open"
        );
        sqlx::raw_sql(end).execute(&mut *tx).await.unwrap();
        assert!(!store.transaction_is_open(&mut tx).await.unwrap(), "{end}");
        let _ = sqlx::query("SELECT * FROM oncely_no_such_table")
            .execute(&mut *tx)
            .await;
        assert!(store.ended_by_its_owner(&mut tx).await, "{end}");
        tx.rollback().await.unwrap();
    }
    // Two transactions lock two rows in opposite orders: InnoDB rolls one back (1213).
    let scope = common::fresh_scope("deadlock");
    let (x, y) = (
        RecordKey::new(scope.clone(), IdempotencyKey::new("x").unwrap()),
        RecordKey::new(scope, IdempotencyKey::new("y").unwrap()),
    );
    let mut tokens = Vec::new();
    for id in [&x, &y] {
        tokens.push(claimed(store.claim(claim_req(id, "{}")).await.unwrap()).token);
    }
    let (mut a, mut b) = (
        store.begin_tx().await.unwrap(),
        store.begin_tx().await.unwrap(),
    );
    store.renew_in(&mut a, &x, tokens[0], LEASE).await.unwrap();
    store.renew_in(&mut b, &y, tokens[1], LEASE).await.unwrap();
    let (store2, y2, ty) = (store.clone(), y.clone(), tokens[1]);
    let a_then = tokio::spawn(async move {
        let r = store2.renew_in(&mut a, &y2, ty, LEASE).await;
        (r, a)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_then = store.renew_in(&mut b, &x, tokens[0], LEASE).await;
    let (a_then, mut a) = a_then.await.unwrap();
    let (victim, survivor) = match (&a_then, &b_then) {
        (Err(_), Ok(_)) => (&mut a, b),
        (Ok(_), Err(_)) => (&mut b, a),
        other => panic!("one deadlock victim: {other:?}"),
    };
    assert!(
        !store.ended_by_its_owner(victim).await,
        "the server rolled it back"
    );
    assert!(!store.transaction_is_open(victim).await.unwrap());
    survivor.commit().await.unwrap();
}
