//! Real concurrency against PostgreSQL: many tasks on one key, spread over several pool
//! connections and several separate store instances (separate pools, as separate server
//! processes would have). Skipped when `ONCELY_TEST_POSTGRES_URL` is unset.

mod common;

use oncely_conformance::instances::{one_winner_across_instances, one_winner_across_instances_by};
use oncely_core::{ClaimOutcome, ClaimRequest, IdempotencyKey, ManualClock, RecordKey, StoreError};
use oncely_postgres::PostgresStore;
use std::sync::Arc;
use std::time::Duration;

const TASKS: usize = 300;

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
/// exactly one takeover. After completion, 300 more: 300 byte-identical replays.
async fn one_winner_runs(settings: &[(&str, &str)], runs: usize) {
    let clock = ManualClock::starting_now();
    let Some(stores) = instances(&clock, settings).await else {
        return;
    };
    let fresh_id = || {
        RecordKey::new(
            common::fresh_scope("storm"),
            IdempotencyKey::new("pay-1").unwrap(),
        )
    };
    one_winner_across_instances(&stores, &clock, fresh_id, TASKS, runs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_claims_one_winner_across_instances() {
    one_winner_runs(&[], 10).await;
}

/// The claim of a transactional handler (`PostgresStore::claim_tx`), whose granted claim
/// commits its transaction at once (the handler's first phase, with its one side effect).
async fn claim_and_commit(
    store: Arc<PostgresStore>,
    req: ClaimRequest,
) -> Result<ClaimOutcome, StoreError> {
    let (outcome, tx) = store.claim_tx(&req).await?;
    if let Some(tx) = tx {
        tx.commit().await.map_err(StoreError::unavailable)?;
    }
    Ok(outcome)
}

/// [`one_winner_runs`] through the claim of a transactional handler, with the claim after its
/// `BEGIN` and sent with it (`PostgresStore::with_claim_sent_with_begin`), 10 runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_transactional_claims_one_winner_across_instances() {
    for with_begin in [false, true] {
        let clock = ManualClock::starting_now();
        let Some(stores) = instances(&clock, &[]).await else {
            return;
        };
        let stores: Vec<_> = stores
            .iter()
            .map(|s| Arc::new((**s).clone().with_claim_sent_with_begin(with_begin)))
            .collect();
        let fresh_id = || {
            RecordKey::new(
                common::fresh_scope("storm-tx"),
                IdempotencyKey::new("pay-1").unwrap(),
            )
        };
        one_winner_across_instances_by(&stores, &clock, fresh_id, TASKS, 10, claim_and_commit)
            .await;
    }
}

/// Under SERIALIZABLE, concurrent claims of one key raise serialization failures (40001) in
/// the database; the store retries them, so callers still see exactly one winner and no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializable_isolation_conflicts_are_retried_not_surfaced() {
    one_winner_runs(&[("default_transaction_isolation", "serializable")], 3).await;
}

/// docs/DESIGN.md, "Replay on a cold process": instance A completes; instance B (fresh pool, no
/// local state) replays byte for byte, and the stored fingerprint (with its version) matches
/// the one B computes.
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
    let cold = async {
        a.pool().close().await;
        clock.advance(Duration::from_secs(600));
        common::store(clock.clone()).await.unwrap()
    };
    oncely_conformance::instances::cold_instance_replays(&a, &id, &clock, cold).await;
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
