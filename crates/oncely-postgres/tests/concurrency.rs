//! Real concurrency against PostgreSQL: many tasks on one key, spread over several pool
//! connections and several separate store instances (separate pools, as separate server
//! processes would have). Skipped when `ONCELY_TEST_POSTGRES_URL` is unset.

mod common;

use oncely_conformance::{LEASE, RETENTION, claim_req, fp, tricky_response};
use oncely_core::{
    ClaimKind, ClaimOutcome, Clock, IdempotencyKey, KeyStore, ManualClock, RecordKey, RecordState,
};
use oncely_postgres::PostgresStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TASKS: usize = 300;

#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    claimed: Vec<(ClaimKind, i64)>,
    in_flight: usize,
    replays: usize,
}

/// Fires `TASKS` concurrent claims of `id`, round-robin over `stores`; every granted claim
/// counts one "side effect". Through `KeyStore::claim`, or through the claim of a
/// transactional handler (`PostgresStore::claim_tx`) when `transactional`, whose granted claim
/// commits its transaction at once (the handler's first phase, with its one side effect).
async fn storm_by(
    stores: &[Arc<PostgresStore>],
    id: &RecordKey,
    effects: &AtomicU64,
    transactional: bool,
) -> Tally {
    let start = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let store = stores[i % stores.len()].clone();
        let req = claim_req(id, r#"{"amount":100}"#);
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            if !transactional {
                return store.claim(req).await;
            }
            let (outcome, tx) = store.claim_tx(&req).await?;
            if let Some(tx) = tx {
                tx.commit()
                    .await
                    .map_err(oncely_core::StoreError::unavailable)?;
            }
            Ok(outcome)
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        match t.await.expect("task").expect("no claim may fail") {
            ClaimOutcome::Claimed(c) => {
                effects.fetch_add(1, Ordering::SeqCst);
                tally.claimed.push((c.kind, c.token.0));
            }
            ClaimOutcome::InFlight { .. } => tally.in_flight += 1,
            ClaimOutcome::Replay { response, .. } => {
                assert_eq!(response, tricky_response(), "a replay is byte-identical");
                tally.replays += 1;
            }
            // Mismatch, needs attention, or an outcome this test does not know.
            other => panic!("same body, never marked: {other:?}"),
        }
    }
    tally
}

async fn instances(
    clock: &ManualClock,
    settings: &[(&str, &str)],
) -> Option<Vec<Arc<PostgresStore>>> {
    let mut stores = Vec::new();
    for _ in 0..3 {
        let s = common::instance(clock, 6, Duration::from_secs(5), settings).await?;
        stores.push(Arc::new(s));
    }
    Some(stores)
}

/// 300 concurrent identical claims of one key over 3 instances (6 connections each): exactly
/// one is granted (one side effect), 299 see it in flight. After the lease lapses, 300 more:
/// exactly one takeover. After completion, 300 more: 300 byte-identical replays. 10 runs.
async fn one_winner_runs(settings: &[(&str, &str)], runs: usize) {
    one_winner_runs_by(settings, runs, None).await;
}

/// [`one_winner_runs`] through `KeyStore::claim` (`None`), or through the claim of a
/// transactional handler (see [`storm_by`]) with its claim sent with the `BEGIN` or not.
async fn one_winner_runs_by(settings: &[(&str, &str)], runs: usize, with_begin: Option<bool>) {
    let clock = ManualClock::starting_now();
    let Some(stores) = instances(&clock, settings).await else {
        return;
    };
    let stores: Vec<_> = stores
        .iter()
        .map(|s| {
            Arc::new(
                (**s)
                    .clone()
                    .with_claim_sent_with_begin(with_begin == Some(true)),
            )
        })
        .collect();
    let transactional = with_begin.is_some();
    for run in 0..runs {
        let id = RecordKey::new(
            common::fresh_scope("storm"),
            IdempotencyKey::new("pay-1").unwrap(),
        );
        let effects = AtomicU64::new(0);

        let first = storm_by(&stores, &id, &effects, transactional).await;
        assert_eq!(first.claimed, vec![(ClaimKind::New, 1)], "run {run}");
        assert_eq!(first.in_flight, TASKS - 1, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 1, "run {run}");

        clock.advance(LEASE + Duration::from_millis(1));
        let takeover = storm_by(&stores, &id, &effects, transactional).await;
        assert_eq!(
            takeover.claimed,
            vec![(ClaimKind::Takeover, 2)],
            "run {run}"
        );
        assert_eq!(takeover.in_flight, TASKS - 1, "run {run}");
        assert_eq!(effects.load(Ordering::SeqCst), 2, "run {run}");

        stores[run % 3]
            .complete(
                &id,
                oncely_core::FencingToken(2),
                tricky_response(),
                RETENTION,
            )
            .await
            .unwrap();
        let replay = storm_by(&stores, &id, &effects, transactional).await;
        assert_eq!(replay.replays, TASKS, "run {run}");
        assert_eq!(
            effects.load(Ordering::SeqCst),
            2,
            "run {run}: replays run nothing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_claims_one_winner_across_instances() {
    one_winner_runs(&[], 10).await;
}

/// [`one_winner_runs`] for the claim of a transactional handler, with the claim after its
/// `BEGIN` and sent with it (`PostgresStore::with_claim_sent_with_begin`), 10 runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_transactional_claims_one_winner_across_instances() {
    for with_begin in [false, true] {
        one_winner_runs_by(&[], 10, Some(with_begin)).await;
    }
}

/// Under SERIALIZABLE, concurrent claims of one key raise serialization failures (40001) in
/// the database; the store retries them, so callers still see exactly one winner and no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializable_isolation_conflicts_are_retried_not_surfaced() {
    one_winner_runs(&[("default_transaction_isolation", "serializable")], 3).await;
}

/// docs/DESIGN.md, "Replay on a cold process": instance A completes; instance B (fresh pool, no local state) replays byte for
/// byte, and the stored fingerprint (with its version) matches the one B computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_instance_replays() {
    let clock = ManualClock::starting_now();
    let Some(a) = common::store(clock.clone()).await else {
        return;
    };
    let id = RecordKey::new(
        common::fresh_scope("cold"),
        IdempotencyKey::new("K").unwrap(),
    );
    let ClaimOutcome::Claimed(c) = a.claim(claim_req(&id, r#"{"amount":100}"#)).await.unwrap()
    else {
        panic!("first claim")
    };
    a.complete(&id, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    a.pool().close().await;
    drop(a);

    clock.advance(Duration::from_secs(600));
    let b = common::store(clock.clone()).await.unwrap();
    // The retry serializes the same JSON differently: still the same fingerprint (docs/DESIGN.md,
    // "Serializer differences").
    match b
        .claim(claim_req(&id, r#"{ "amount" : 100 }"#))
        .await
        .unwrap()
    {
        ClaimOutcome::Replay {
            response,
            completed_at,
        } => {
            assert_eq!(response, tricky_response());
            assert_eq!(completed_at, clock.now_millis() - 600_000);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let rec = b.get(&id).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, fp(r#"{"amount":100}"#));
    assert_eq!(rec.fingerprint.version(), 1);
    assert!(matches!(rec.state, RecordState::Complete { .. }));
}

/// Eight processes' worth of stores run the migrations at once against a brand-new database:
/// sqlx's advisory lock makes them take turns; each succeeds and the schema is created once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_on_a_fresh_database() {
    let Some(url) = common::url() else {
        return;
    };
    let admin = PostgresStore::connect(&url).await.unwrap();
    let db = format!("oncely_migrate_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .execute(admin.pool())
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').expect("url with a database name");
    let fresh_url = format!("{base}/{db}");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let fresh_url = fresh_url.clone();
        tasks.push(tokio::spawn(async move {
            let store = PostgresStore::connect(&fresh_url).await?;
            let r = store.migrate().await;
            store.pool().close().await;
            r
        }));
    }
    let mut ok = 0;
    for t in tasks {
        t.await.unwrap().expect("every concurrent migrate succeeds");
        ok += 1;
    }
    assert_eq!(ok, 8);
    let check = PostgresStore::connect(&fresh_url).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _oncely_migrations")
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
        "SELECT count(*) FROM pg_indexes WHERE tablename = 'oncely_idempotency_keys'",
    )
    .fetch_one(check.pool())
    .await
    .unwrap();
    assert_eq!(
        indexes, 5,
        "primary key, expires_at, in-flight leases, marked records, in-flight (scope, key)"
    );
    check.pool().close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {db} WITH (FORCE)"
    )))
    .execute(admin.pool())
    .await
    .unwrap();
}
