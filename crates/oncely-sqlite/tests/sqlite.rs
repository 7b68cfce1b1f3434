//! SQLite-specific behaviour: cold reopen (docs/DESIGN.md, "Replay on a cold
//! process"), real concurrency on a file with several
//! pool connections and two pools, corrupt rows, connection settings, migrations, failure
//! mapping, and the reaper on a large table.

mod common;

use common::TempStore;
use oncely_conformance::{LEASE, RETENTION, WINDOW, claim_req, fp, fresh_id, tricky_response};
use oncely_core::fingerprint::FINGERPRINT_VERSION;
use oncely_core::{
    ClaimKind, ClaimOutcome, ClaimRequest, DefaultFingerprinter, FencingToken, Fingerprinter,
    IdempotencyKey, KeyStore, Maintenance, ManualClock, RecordKey, RecordState, RequestParts,
    Scope, StoreError, SystemClock,
};
use oncely_sqlite::{SqliteStore, SqliteStoreError, connect_options};
use sqlx::Row;
use sqlx::sqlite::SqlitePoolOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn expect_claimed(outcome: ClaimOutcome) -> oncely_core::Claim {
    match outcome {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// docs/DESIGN.md, "Replay on a cold process": POST K {"amount":100} -> 201 through one store; a second store opened cold on the
/// same file (no shared memory at all) replays the 201 byte for byte, with the fingerprint and
/// its version read back from the file; a different body is still a mismatch there.
#[tokio::test]
async fn cold_reopen_replays_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("s2.db").display());
    let id = RecordKey::new(Scope::new("tenant-T"), IdempotencyKey::new("K").unwrap());
    let request = |body: &'static str| {
        ClaimRequest::new(
            id.clone(),
            DefaultFingerprinter.fingerprint(
                &RequestParts::new("POST", "/v1/payments", body.as_bytes())
                    .with_content_type(Some(b"application/json")),
            ),
            LEASE,
            WINDOW,
            RETENTION,
        )
    };

    let a = SqliteStore::connect(&url).await.unwrap();
    let c = expect_claimed(a.claim(request(r#"{"amount":100}"#)).await.unwrap());
    assert_eq!(c.kind, ClaimKind::New);
    a.complete(&id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    a.pool().close().await;
    drop(a);

    let b = SqliteStore::connect(&url).await.unwrap();
    let rec = b
        .get(&id)
        .await
        .unwrap()
        .expect("record survives the reopen");
    assert_eq!(rec.fingerprint.version(), FINGERPRINT_VERSION);
    assert_eq!(rec.fingerprint, request(r#"{"amount":100}"#).fingerprint);
    // The same JSON with whitespace and key order changed replays on the cold store
    // (docs/DESIGN.md, "Serializer differences").
    match b.claim(request(r#"{ "amount" : 100 }"#)).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => {
            assert_eq!(response, tricky_response());
            assert_eq!(response.body, vec![b'{', 0, 1, 2, 0xff, b'}']);
            assert_eq!(
                response.headers[4],
                ("x-bytes".to_owned(), vec![0x80, 0xff, b'a'])
            );
        }
        other => panic!("expected a replay on the cold store, got {other:?}"),
    }
    assert_eq!(
        b.claim(request(r#"{"amount":101}"#)).await.unwrap(),
        ClaimOutcome::Mismatch
    );
}

/// 200 concurrent claims of one key on a file database, split across two stores (two pools of
/// up to 8 connections each, as two processes would be): exactly one is claimed, the other 199
/// see it in flight; once the winner completes, 200 more concurrent claims all replay its
/// response. 20 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_claims_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let path = path.to_str().unwrap();
    let a = Arc::new(SqliteStore::connect(path).await.unwrap());
    let b = Arc::new(SqliteStore::connect(path).await.unwrap());
    for round in 0..20 {
        let id = fresh_id();
        let mut tasks = Vec::new();
        for i in 0..200 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&id, r#"{"amount":100}"#);
            tasks.push(tokio::spawn(async move { store.claim(req).await }));
        }
        let mut winners = Vec::new();
        let mut in_flight = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(ClaimOutcome::Claimed(c)) => winners.push(c),
                Ok(ClaimOutcome::InFlight { .. }) => in_flight += 1,
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(in_flight, 199, "round {round}");
        assert_eq!(winners[0].kind, ClaimKind::New);
        assert_eq!(winners[0].token.0, 1);
        a.complete(&id, winners[0].token, tricky_response(), RETENTION)
            .await
            .unwrap();

        let mut tasks = Vec::new();
        for i in 0..200 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let req = claim_req(&id, r#"{"amount":100}"#);
            tasks.push(tokio::spawn(async move { store.claim(req).await }));
        }
        for t in tasks {
            match t.await.unwrap() {
                Ok(ClaimOutcome::Replay { response, .. }) => {
                    assert_eq!(response, tricky_response())
                }
                other => panic!("round {round}: expected a replay, got {other:?}"),
            }
        }
    }
}

/// The in-memory form (`sqlite::memory:`) is a working store too, private to its `connect`,
/// and concurrent claims on it (several connections sharing one cache) still have one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_memory_store_works_and_is_private() {
    let a = Arc::new(SqliteStore::connect("sqlite::memory:").await.unwrap());
    let b = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let id = fresh_id();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let store = a.clone();
        let req = claim_req(&id, "{}");
        tasks.push(tokio::spawn(async move { store.claim(req).await }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            ClaimOutcome::Claimed(c) => claimed.push(c),
            ClaimOutcome::InFlight { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed.len(), 1);
    a.complete(&id, claimed[0].token, tricky_response(), RETENTION)
        .await
        .unwrap();
    assert!(matches!(
        a.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::Replay { .. }
    ));
    // Another in-memory store is a different database.
    assert_eq!(b.get(&id).await.unwrap(), None);
}

/// `connect` sets WAL, synchronous NORMAL and a 5 s busy timeout on its connections, creates a
/// missing file from a plain path, and records its migrations in its own table.
#[tokio::test]
async fn connection_settings_and_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested-name.db");
    assert!(!path.exists());
    let store = SqliteStore::connect(path.to_str().unwrap()).await.unwrap();
    assert!(path.exists(), "connect creates the file");
    let mut conn = store.pool().acquire().await.unwrap();
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(journal, "wal");
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(synchronous, 1, "NORMAL");
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(busy, 5000);
    drop(conn);

    // Idempotent, and tracked apart from an application's own `_sqlx_migrations`.
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         ORDER BY name",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        tables,
        vec!["_oncely_sqlite_migrations", "oncely_idempotency_keys"]
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'oncely_%' \
         ORDER BY name",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        indexes,
        vec![
            "oncely_idempotency_keys_abandoned",
            "oncely_idempotency_keys_expires_at",
            "oncely_idempotency_keys_marked"
        ]
    );
    // The reaper's and the completer's queries use those indexes.
    let plan = |sql: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query(sql)
                .fetch_all(&pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<String, _>("detail"))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    let reap = plan(
        "EXPLAIN QUERY PLAN SELECT rowid FROM oncely_idempotency_keys WHERE expires_at <= 1 \
         ORDER BY expires_at LIMIT 10",
    )
    .await;
    assert!(
        reap.contains("oncely_idempotency_keys_expires_at"),
        "{reap}"
    );
    let list = plan(
        "EXPLAIN QUERY PLAN SELECT * FROM oncely_idempotency_keys WHERE state = 'in_flight' \
         AND marked_at IS NULL AND lease_expires_at <= 1 \
         AND (redrive_next_at IS NULL OR redrive_next_at <= 1) \
         ORDER BY lease_expires_at LIMIT 10",
    )
    .await;
    assert!(list.contains("oncely_idempotency_keys_abandoned"), "{list}");
    let marked = plan(
        "EXPLAIN QUERY PLAN SELECT * FROM oncely_idempotency_keys WHERE state = 'in_flight' \
         AND marked_at IS NOT NULL ORDER BY marked_at, scope, key LIMIT 10",
    )
    .await;
    assert!(
        marked.contains("oncely_idempotency_keys_marked"),
        "{marked}"
    );
}

/// A database made by the first version of the schema (before the completer's columns) keeps
/// its rows through the migration that adds them: an in-flight row reads as never re-driven and
/// not marked, takes the completer's notes, and a complete row still replays byte for byte.
#[tokio::test]
async fn rows_from_before_the_redrive_columns_survive_the_migration() {
    use oncely_core::{Clock, RedriveNote, Redrives};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    // The first migration alone, recorded exactly as the store records it.
    let first = dir.path().join("first");
    std::fs::create_dir(&first).unwrap();
    let name = "20261130000001_oncely_idempotency_keys.sql";
    std::fs::write(
        first.join(name),
        include_str!("../migrations/20261130000001_oncely_idempotency_keys.sql"),
    )
    .unwrap();
    let mut old = sqlx::migrate::Migrator::new(first.as_path()).await.unwrap();
    old.dangerous_set_table_name("_oncely_sqlite_migrations");
    let pool = sqlx::SqlitePool::connect_with(connect_options(path.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    old.run(&pool).await.unwrap();
    let (done, flying) = (fresh_id(), fresh_id());
    let insert = "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, \
         fingerprint, token, state, lease_expires_at, recovery_point, response_status, \
         response_headers, response_body, response_body_retained, completed_at, created_at, \
         expires_at, request) VALUES (?1, 'key-1', 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
         ?11, 1000, ?12, ?13)";
    let now = oncely_core::SystemClock.now_millis();
    let resp = tricky_response();
    sqlx::query(insert)
        .bind(done.scope.as_str())
        .bind(&claim_req(&done, "{}").fingerprint.digest()[..])
        .bind(3_i64)
        .bind("complete")
        .bind(None::<i64>)
        .bind(None::<String>)
        .bind(i64::from(resp.status))
        .bind(resp.encode_headers())
        .bind(resp.body.clone())
        .bind(1_i64)
        .bind(now)
        .bind(now + 3_600_000)
        .bind(None::<Vec<u8>>)
        .execute(&pool)
        .await
        .unwrap();
    let req = claim_req(&flying, r#"{"a":1}"#);
    sqlx::query(insert)
        .bind(flying.scope.as_str())
        .bind(&req.fingerprint.digest()[..])
        .bind(2_i64)
        .bind("in_flight")
        .bind(now - 120_000)
        .bind(Some("payment_recorded"))
        .bind(None::<i64>)
        .bind(None::<Vec<u8>>)
        .bind(None::<Vec<u8>>)
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(now + 3_600_000)
        .bind(req.request.as_ref().map(|r| r.encode()))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let store = SqliteStore::connect(path.to_str().unwrap()).await.unwrap();
    match store.claim(claim_req(&done, "{}")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, resp),
        other => panic!("{other:?}"),
    }
    let rec = store.get(&flying).await.unwrap().unwrap();
    assert_eq!(rec.redrives, Redrives::default());
    assert_eq!(rec.recovery_point(), Some("payment_recorded"));
    assert_eq!(rec.request, req.request);
    let listed = store
        .list_abandoned(Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    let noted = store
        .note_redrive(
            &flying,
            FencingToken(2),
            0,
            RedriveNote::Attempt {
                backoff: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    assert_eq!(noted.attempts, 1);
    assert_eq!(store.get(&flying).await.unwrap().unwrap().redrives, noted);
}

/// Several pools connecting to one fresh file at the same moment all migrate successfully
/// (the losers of the race retry and find the migration applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_connects_all_succeed() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fresh.db").to_str().unwrap().to_owned();
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let path = path.clone();
            tasks.push(tokio::spawn(
                async move { SqliteStore::connect(&path).await },
            ));
        }
        let stores: Vec<SqliteStore> = futures_join(tasks).await;
        let id = fresh_id();
        expect_claimed(stores[0].claim(claim_req(&id, "{}")).await.unwrap());
        assert!(matches!(
            stores[5].claim(claim_req(&id, "{}")).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ));
    }
}

async fn futures_join(
    tasks: Vec<tokio::task::JoinHandle<Result<SqliteStore, StoreError>>>,
) -> Vec<SqliteStore> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().expect("every concurrent connect succeeds"));
    }
    out
}

/// Rows that do not fit the record are `StoreError::Corrupt` on every read path, never a panic.
#[tokio::test]
async fn corrupt_rows_are_corrupt_errors() {
    let store = TempStore::open(ManualClock::starting_now()).await;
    let now = oncely_core::Clock::now_millis(&SystemClock);
    let insert = "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, \
                  fingerprint, token, state, lease_expires_at, response_status, \
                  response_headers, response_body, response_body_retained, completed_at, \
                  created_at, expires_at, request) \
                  VALUES (?1, 'K', ?2, ?3, 1, ?4, ?5, ?6, ?7, X'00', ?8, ?9, ?10, ?10, ?11)";
    let digest = fp("{}").digest().to_vec();
    #[derive(Clone)]
    struct Bad {
        name: &'static str,
        version: i64,
        digest: Vec<u8>,
        state: &'static str,
        lease: Option<i64>,
        status: Option<i64>,
        headers: Option<Vec<u8>>,
        retained: Option<i64>,
        completed: Option<i64>,
        request: Option<Vec<u8>>,
    }
    let ok_complete = Bad {
        name: "",
        version: 1,
        digest: digest.clone(),
        state: "complete",
        lease: None,
        status: Some(201),
        headers: Some(b"[]".to_vec()),
        retained: Some(1),
        completed: Some(now),
        request: None,
    };
    let cases = vec![
        Bad {
            name: "short digest",
            digest: vec![1, 2, 3],
            ..ok_complete.clone()
        },
        Bad {
            name: "negative version",
            version: -1,
            ..ok_complete.clone()
        },
        Bad {
            name: "headers not JSON",
            headers: Some(b"\xff{".to_vec()),
            ..ok_complete.clone()
        },
        Bad {
            name: "status out of range",
            status: Some(70_000),
            ..ok_complete.clone()
        },
        Bad {
            name: "complete without status",
            status: None,
            ..ok_complete.clone()
        },
        Bad {
            name: "body_retained not a boolean",
            retained: Some(7),
            ..ok_complete.clone()
        },
        Bad {
            name: "in flight without lease",
            state: "in_flight",
            ..ok_complete.clone()
        },
        Bad {
            name: "request not JSON",
            request: Some(b"nope".to_vec()),
            ..ok_complete.clone()
        },
    ];
    for case in cases {
        let scope = format!("corrupt-{}", uuid::Uuid::new_v4());
        sqlx::query(insert)
            .bind(&scope)
            .bind(case.version)
            .bind(&case.digest)
            .bind(case.state)
            .bind(case.lease)
            .bind(case.status)
            .bind(&case.headers)
            .bind(case.retained)
            .bind(case.completed)
            .bind(now + 3_600_000)
            .bind(&case.request)
            .execute(store.pool())
            .await
            .unwrap();
        let id = RecordKey::new(Scope::new(scope), IdempotencyKey::new("K").unwrap());
        assert!(
            matches!(store.get(&id).await, Err(StoreError::Corrupt(_))),
            "{}: get",
            case.name
        );
        assert!(
            matches!(
                store.claim(claim_req(&id, "{}")).await,
                Err(StoreError::Corrupt(_))
            ),
            "{}: claim",
            case.name
        );
    }
    // An in-flight row with a corrupt request is corrupt on the completer's path too.
    let scope = format!("corrupt-{}", uuid::Uuid::new_v4());
    sqlx::query(insert)
        .bind(&scope)
        .bind(1_i64)
        .bind(&digest)
        .bind("in_flight")
        .bind(Some(1_i64)) // lapsed in 1970: listed by any grace
        .bind(None::<i64>)
        .bind(None::<Vec<u8>>)
        .bind(None::<i64>)
        .bind(None::<i64>)
        .bind(now + 3_600_000)
        .bind(Some(b"{".to_vec()))
        .execute(store.pool())
        .await
        .unwrap();
    assert!(matches!(
        store.list_abandoned(Duration::ZERO, 10).await,
        Err(StoreError::Corrupt(_))
    ));
}

/// A claim that cannot get SQLite's write lock within the busy timeout, and any operation on a
/// closed pool, is `StoreError::Unavailable` (the layer's fail-closed `503`), not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_closed_are_unavailable() {
    let clock = ManualClock::starting_now();
    let holder = TempStore::open(clock.clone()).await;
    let id = fresh_id();
    let c = expect_claimed(holder.claim(claim_req(&id, "{}")).await.unwrap());
    // A phase holds the write lock (BEGIN IMMEDIATE, then its fencing write)...
    let mut phase = holder.begin_tx().await.unwrap();
    holder
        .renew_in(&mut phase, &id, c.token, LEASE)
        .await
        .unwrap();
    // ...while a second pool with a 200 ms busy timeout tries to claim another key.
    let options = connect_options(holder.path().to_str().unwrap())
        .unwrap()
        .busy_timeout(Duration::from_millis(200));
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let impatient = SqliteStore::from_pool(pool, Arc::new(clock.clone()));
    let started = Instant::now();
    let other = fresh_id();
    match impatient.claim(claim_req(&other, "{}")).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(200));
    // Reads are not blocked by the writer (WAL): the in-flight answer still comes back.
    assert!(matches!(
        impatient.claim(claim_req(&id, "{}")).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    drop(phase);
    // Once the lock is free the same claim goes through.
    expect_claimed(impatient.claim(claim_req(&other, "{}")).await.unwrap());

    impatient.pool().close().await;
    assert!(matches!(
        impatient.claim(claim_req(&fresh_id(), "{}")).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        impatient.renew(&other, FencingToken(1), LEASE).await,
        Err(StoreError::Unavailable(_))
    ));
}

/// Invalid URLs are reported, not panicked on.
#[tokio::test]
async fn invalid_url_is_an_error() {
    match SqliteStore::connect("sqlite://x.db?mode=bogus").await {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.downcast_ref::<SqliteStoreError>().is_some(), "{e}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The reaper removes 20,000 expired records in bounded batches while concurrent claims keep
/// succeeding; records inside retention stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_clears_a_large_backlog_while_claims_continue() {
    let clock = ManualClock::starting_now();
    let store = Arc::new(TempStore::open(clock.clone()).await);
    let now = oncely_core::Clock::now_millis(&clock);
    // 20,000 completed records whose retention ended an hour ago, 2,000 abandoned in-flight
    // ones among them, written in one statement.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
         INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, fingerprint, \
           token, state, lease_expires_at, response_status, response_headers, response_body, \
           response_body_retained, completed_at, created_at, expires_at) \
         SELECT 'old', 'k' || i, 1, zeroblob(32), 1, \
           CASE WHEN i % 10 = 0 THEN 'in_flight' ELSE 'complete' END, \
           CASE WHEN i % 10 = 0 THEN ?1 ELSE NULL END, \
           CASE WHEN i % 10 = 0 THEN NULL ELSE 201 END, \
           CASE WHEN i % 10 = 0 THEN NULL ELSE X'5B5D' END, \
           X'', CASE WHEN i % 10 = 0 THEN NULL ELSE 1 END, \
           CASE WHEN i % 10 = 0 THEN NULL ELSE ?1 END, ?1, ?2 FROM n",
    )
    .bind(now - 4 * 86_400_000)
    .bind(now - 3_600_000)
    .execute(store.pool())
    .await
    .unwrap();
    let keep = fresh_id();
    let c = expect_claimed(store.claim(claim_req(&keep, "{}")).await.unwrap());
    store
        .complete(&keep, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();

    let reaper = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut total = oncely_core::ReapReport::default();
            let mut batches = 0;
            loop {
                let r = store.reap(500).await.unwrap();
                assert!(r.deleted <= 500);
                total.deleted += r.deleted;
                total.orphaned += r.orphaned;
                batches += 1;
                if r.deleted < 500 {
                    return (total, batches);
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut claims = Vec::new();
    for _ in 0..200 {
        let store = store.clone();
        claims.push(tokio::spawn(async move {
            let id = fresh_id();
            store.claim(claim_req(&id, "{}")).await
        }));
    }
    for t in claims {
        assert!(matches!(t.await.unwrap(), Ok(ClaimOutcome::Claimed(_))));
    }
    let (total, batches) = reaper.await.unwrap();
    assert_eq!(total.deleted, 20_000);
    assert_eq!(total.orphaned, 2_000);
    assert_eq!(batches, 41, "40 full batches of 500, then an empty one");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM oncely_idempotency_keys")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 201, "the kept record and the 200 new claims");
    match store.get(&keep).await.unwrap().unwrap().state {
        RecordState::Complete { response, .. } => assert_eq!(response, tricky_response()),
        other => panic!("{other:?}"),
    }
}

/// A record written before responses kept trailers (its headers column in the oldest form)
/// still replays; a gRPC response keeps its trailers.
#[tokio::test]
async fn legacy_headers_column_still_replays() {
    let t = TempStore::open(ManualClock::starting_now()).await;
    let pool = t.store.pool().clone();
    oncely_conformance::legacy_record_still_replays(&t.store, async |id: &RecordKey, column: Vec<u8>| {
        let done = sqlx::query(
            "UPDATE oncely_idempotency_keys SET response_headers = ?1 WHERE scope = ?2 AND key = ?3",
        )
        .bind(column)
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(done.rows_affected(), 1);
    })
    .await;
}
