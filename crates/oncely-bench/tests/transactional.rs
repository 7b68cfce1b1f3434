//! The code behind `benches/transactional.rs`, run with tiny counts so it cannot rot: every
//! variant answers `201`, writes one order row per request, and (floor, layer) leaves a
//! complete record whose stored response names that order; a replay through the layer writes
//! nothing; the layer's first execution commits once and its replay never commits; on
//! PostgreSQL, the statements per request are counted (a replay is two logged statements: the
//! claim's insert, which does nothing, and the record's read). No timing.
//!
//! One test function, so the process-wide statement counter sees only its own statements.
//! PostgreSQL runs when `ONCELY_TEST_POSTGRES_URL` (or `ONCELY_BENCH_POSTGRES_URL`) is set,
//! MySQL / MariaDB when `ONCELY_TEST_MYSQL_URL` (or `ONCELY_BENCH_MYSQL_URL`) is.

#![allow(missing_docs)]

use oncely_bench::run_prefix;
use oncely_bench::transactional::{Bench, Db, Variant, count};

const N: usize = 6;

/// The statements of requests among `seen`: all but the settings sqlx sends when the pool opens
/// a new connection (SQLite's `PRAGMA ...`; MySQL's `SET sql_mode=...`, followed by the MySQL
/// store's own session settings, whose logged summary reads like the claim's
/// `SET SESSION innodb_lock_wait_timeout = …`). A pool may open a connection mid-run (an idle
/// one closed, or more requests at once than idle connections), which is no statement of a
/// request.
fn statements(seen: &[String]) -> usize {
    let opened = seen
        .iter()
        .filter(|s| s.starts_with("SET sql_mode="))
        .count();
    seen.iter().filter(|s| !s.starts_with("PRAGMA")).count() - 2 * opened
}

async fn check(bench: &Bench) {
    let db = bench.db.name();
    // Statements per (variant, concurrency), for the comparison below.
    let mut sent = std::collections::BTreeMap::new();
    for v in Variant::ALL {
        for concurrency in [1, 3] {
            let prefix = run_prefix();
            count::start();
            bench
                .drive(v, &prefix, N, concurrency)
                .await
                .unwrap_or_else(|e| panic!("{db} {}: {e}", v.name()));
            let seen = count::stop();
            bench
                .verify(v, &prefix, N)
                .await
                .unwrap_or_else(|e| panic!("{db} {}: {e}", v.name()));
            let business = seen
                .iter()
                .filter(|s| s.starts_with("INSERT INTO bench_orders"))
                .count();
            assert_eq!(
                business,
                N,
                "{db} {}: one order insert per request",
                v.name()
            );
            sent.insert((v.name(), concurrency), statements(&seen));
            if bench.db == Db::Postgres {
                // sqlx logs PostgreSQL's COMMIT (not SQLite's): one per request.
                assert_eq!(
                    count::commits(&seen),
                    N,
                    "{db} {}: commits {seen:?}",
                    v.name()
                );
                // The statements sqlx logs per request (`BEGIN` is not logged): the baseline's
                // insert and commit; the floor's and the layer's claim, insert, completion and
                // commit (the layer's claim is one statement, as the floor's). With
                // `ONCELY_BENCH_PG_COMPLETION_WITH_COMMIT=1` the layer's completion and commit
                // go out as one message, logged once (docs/DESIGN.md, "The completion goes out
                // with the commit"); with `ONCELY_BENCH_PG_CLAIM_WITH_BEGIN=1` its claim goes
                // out with the `BEGIN`, which sqlx does not log ("The claim goes out with the
                // begin").
                let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
                let layer = 4
                    - usize::from(on("ONCELY_BENCH_PG_COMPLETION_WITH_COMMIT"))
                    - usize::from(on("ONCELY_BENCH_PG_CLAIM_WITH_BEGIN"));
                let per_request = match v {
                    Variant::Baseline => 2,
                    Variant::Layer => layer,
                    Variant::Floor => 4,
                };
                assert_eq!(
                    statements(&seen),
                    N * per_request,
                    "{db} {}: statements {seen:?}",
                    v.name()
                );
            }
            if v == Variant::Layer {
                // The same keys again: replays, which neither run the handler nor commit.
                count::start();
                bench
                    .drive(v, &prefix, N, concurrency)
                    .await
                    .unwrap_or_else(|e| panic!("{db} replay: {e}"));
                let seen = count::stop();
                assert_eq!(count::commits(&seen), 0, "{db} replay: no commit");
                if bench.db == Db::Sqlite {
                    // One statement per replay: the lock-free read (the claim's first hop,
                    // which stops at the record's row).
                    assert_eq!(statements(&seen), N, "{db} replay statements: {seen:?}");
                    assert!(
                        seen.iter()
                            .all(|s| s.starts_with("SELECT") || s.starts_with("PRAGMA")),
                        "{seen:?}"
                    );
                } else if bench.db == Db::Mysql {
                    // Three logged statements per replay: the message that begins the claim's
                    // transaction (the lock-wait bound, `BEGIN`, the savepoint), the claim's
                    // insert, which finds the key and changes nothing, and the locking read of
                    // the committed record (then the transaction is rolled back).
                    assert_eq!(statements(&seen), 3 * N, "{db} replay: statements {seen:?}");
                    let reads = seen.iter().filter(|s| s.starts_with("SELECT")).count();
                    assert_eq!(reads, N, "{db} replay: {seen:?}");
                } else {
                    // Two logged statements per replay: the claim's insert, which does
                    // nothing, then the read of the committed record (then the empty
                    // transaction is rolled back). With the claim sent with the `BEGIN` on
                    // PostgreSQL, the read alone: the failed insert went out with the `BEGIN`,
                    // which sqlx does not log.
                    let with_begin = bench.db == Db::Postgres
                        && std::env::var("ONCELY_BENCH_PG_CLAIM_WITH_BEGIN")
                            .is_ok_and(|v| v == "1");
                    let inserts_logged = usize::from(!with_begin);
                    assert_eq!(
                        seen.len(),
                        (1 + inserts_logged) * N,
                        "{db} replay: statements {seen:?}"
                    );
                    let inserts = seen
                        .iter()
                        .filter(|s| s.starts_with("INSERT INTO oncely_idempotency_keys"))
                        .count();
                    let reads = seen.iter().filter(|s| s.starts_with("SELECT")).count();
                    assert_eq!(
                        (inserts, reads),
                        (inserts_logged * N, N),
                        "{db} replay: {seen:?}"
                    );
                }
                assert!(
                    !seen
                        .iter()
                        .any(|s| s.starts_with("INSERT INTO bench_orders")),
                    "{db} replay ran the handler: {seen:?}"
                );
                bench
                    .verify(v, &prefix, N)
                    .await
                    .unwrap_or_else(|e| panic!("{db} after replays: {e}"));
            }
        }
    }
    if bench.db == Db::Sqlite {
        for concurrency in [1, 3] {
            // The first execution goes to the database in as many statements as the floor:
            // the read, `BEGIN IMMEDIATE` and the claim in one, the order, the completion (sqlx
            // logs neither the floor's `BEGIN IMMEDIATE` nor the layer's adoption of its
            // transaction, nor `COMMIT`).
            assert_eq!(sent[&("floor", concurrency)], 3 * N, "{db} floor");
            assert_eq!(
                sent[&("layer", concurrency)],
                sent[&("floor", concurrency)],
                "{db} layer against the floor at concurrency {concurrency}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_variant_writes_one_order_and_the_record_per_request() {
    assert!(
        count::install(),
        "no other global subscriber in this test binary"
    );
    check(&Bench::sqlite().await.expect("SQLite on a temporary file")).await;
    match Bench::postgres().await {
        Ok(bench) => {
            check(&bench).await;
            bench.cleanup().await.expect("cleanup");
        }
        Err(why) => eprintln!("postgres: skipped: {why}"),
    }
    match Bench::mysql().await {
        Ok(bench) => {
            check(&bench).await;
            bench.cleanup().await.expect("cleanup");
        }
        Err(why) => eprintln!("mysql: skipped: {why}"),
    }
}
