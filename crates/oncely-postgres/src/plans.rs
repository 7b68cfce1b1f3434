//! The plans of the queries the maintenance passes and the operator's listing run, on a table
//! of many completed records (`docs/DESIGN.md`, "The maintenance index"): each is an index scan
//! on the index meant for it, never a sequential scan, so a pass costs what its work costs,
//! not what the table holds.
//!
//! Every query is planned as a `PREPARE`d statement both ways PostgreSQL may run it: a custom
//! plan for the values bound (`EXPLAIN (ANALYZE, BUFFERS)`, run inside a transaction that is
//! rolled back), which must name the expected index, and the generic plan a long-lived
//! connection switches to after five executions (`plan_cache_mode = force_generic_plan`),
//! which must not scan the table either. Skipped when `ONCELY_TEST_POSTGRES_URL` is unset; the
//! table holds `ONCELY_TEST_PLAN_ROWS` completed records (20,000 by default; run with
//! `ONCELY_TEST_PLAN_ROWS=1000000 cargo test -p oncely-postgres plans -- --nocapture` to see
//! the plans at a million).

use crate::PostgresStore;
use crate::sql;
use oncely_conformance::plans::{OwnDatabase, Seeded, plan_rows, seed};
use oncely_core::ManualClock;
use sqlx::Connection as _;
use std::sync::Arc;

/// One query: its name, text, the literal arguments of its `EXECUTE`, the indexes its custom
/// plan may use (one of them), and, when its generic plan may scan the table, why PostgreSQL
/// never runs that plan.
struct Case {
    name: &'static str,
    sql: &'static str,
    args: String,
    index: &'static [&'static str],
    generic_scans: Option<&'static str>,
}

fn cases(s: &Seeded) -> Vec<Case> {
    let now = s.now;
    let (id, token) = &s.abandoned;
    let (scope, key) = (id.scope.as_str(), id.key.as_str());
    let note = format!("'{scope}', '{key}', {}, {now}, 0, {now}", token.0);
    // $1 scope, $2 $3 cursor, $4 in flight, $5 marked, $6 abandoned, $7 now, $8 created at
    // most, $9 limit (as `PostgresStore::list_records` binds them).
    let list = |scope: &str, cursor: &str, flags: [bool; 3], created: &str| {
        format!(
            "{scope}, {cursor}, {}, {}, {}, {now}, {created}, 50",
            flags[0], flags[1], flags[2]
        )
    };
    let none = [false; 3];
    let this_scope = format!("'{}'", s.scope.as_str());
    let case = |name, sql, args, index| Case {
        name,
        sql,
        args,
        index,
        generic_scans: None,
    };
    let pkey: &[&str] = &["oncely_idempotency_keys_pkey"];
    // A note names an in-flight record by (scope, key): the primary key or the in-flight
    // index; with few records in flight, the planner may rather read them all from the
    // completer's index (as many rows as are abandoned).
    let note_index: &[&str] = &[
        "oncely_idempotency_keys_pkey",
        "oncely_idempotency_keys_in_flight",
        "oncely_idempotency_keys_abandoned",
    ];
    vec![
        case(
            "list_abandoned",
            sql::LIST_ABANDONED,
            format!("{now}, 100, {now}"),
            &["oncely_idempotency_keys_abandoned"],
        ),
        case(
            "list_marked",
            sql::LIST_MARKED,
            "100".into(),
            &["oncely_idempotency_keys_marked"],
        ),
        case(
            "note_redrive (attempt)",
            sql::NOTE_ATTEMPT,
            note.clone(),
            note_index,
        ),
        case("note_redrive (mark)", sql::NOTE_MARK, note, note_index),
        Case {
            // Planned without its values, the batch is guessed at a third of the table, which
            // the generic plan hash-joins with a sequential scan (cost about 90,000 at 1,000,000
            // records, against about 13 for the custom plan, and about 9,000 for a custom plan
            // of a full batch of 1,000): PostgreSQL switches a prepared statement to its
            // generic plan only when that costs no more than the custom plans did, so the
            // reaper always runs the custom plan, whose every step is an index scan.
            generic_scans: Some("never cheaper than the custom plan"),
            ..case(
                "reap",
                sql::REAP,
                format!("{now}, 1000"),
                &["oncely_idempotency_keys_expires_at"],
            )
        },
        case(
            "list_records",
            sql::LIST_RECORDS,
            list("NULL", "'', ''", none, "NULL"),
            pkey,
        ),
        case(
            "list_records --scope",
            sql::LIST_RECORDS,
            list(&this_scope, "'', ''", none, "NULL"),
            pkey,
        ),
        case(
            "list_records --cursor",
            sql::LIST_RECORDS,
            list("NULL", &format!("{this_scope}, 'k-500'"), none, "NULL"),
            pkey,
        ),
        case(
            "list_records --older-than",
            sql::LIST_RECORDS,
            list("NULL", "'', ''", none, &(now - 1000).to_string()),
            pkey,
        ),
        case(
            "list_records --in-flight",
            sql::LIST_RECORDS,
            list("NULL", "'', ''", [true, false, false], "NULL"),
            &["oncely_idempotency_keys_in_flight"],
        ),
        case(
            "list_records --marked",
            sql::LIST_RECORDS,
            list("NULL", "'', ''", [false, true, false], "NULL"),
            &[
                "oncely_idempotency_keys_in_flight",
                "oncely_idempotency_keys_marked",
            ],
        ),
        case(
            "list_records --abandoned",
            sql::LIST_RECORDS,
            list("NULL", "'', ''", [false, false, true], "NULL"),
            &[
                "oncely_idempotency_keys_in_flight",
                "oncely_idempotency_keys_abandoned",
            ],
        ),
    ]
}

/// The plan of `case` on `conn`: custom (with `ANALYZE, BUFFERS`) or generic.
async fn plan(conn: &mut sqlx::PgConnection, case: &Case, generic: bool) -> String {
    let (mode, options) = if generic {
        ("force_generic_plan", "")
    } else {
        ("force_custom_plan", "(ANALYZE, BUFFERS) ")
    };
    let run = |statement: String| sqlx::raw_sql(sqlx::AssertSqlSafe(statement));
    run(format!("PREPARE oncely_plan AS {}", case.sql))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    run(format!("BEGIN; SET LOCAL plan_cache_mode = {mode}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {options}EXECUTE oncely_plan({})",
        case.args
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    run("ROLLBACK; DEALLOCATE oncely_plan".into())
        .execute(&mut *conn)
        .await
        .unwrap();
    lines.join("\n")
}

/// A database of its own holding `plan_rows()` completed records, then every query's plans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_and_listing_queries_scan_their_indexes() {
    let Some(db) = OwnDatabase::from_env("ONCELY_TEST_POSTGRES_URL", "oncely_plans") else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&db.admin).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {}", db.name)))
        .execute(&mut admin)
        .await
        .unwrap();
    let clock = ManualClock::starting_now();
    let store = PostgresStore::connect(&db.url)
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    store.migrate().await.unwrap();
    let seeded = seed(&store, &clock).await;

    // Copies of the template under new keys: every column as the store wrote it, the key
    // replaced (`jsonb_populate_record` over the row itself).
    let rows = plan_rows();
    sqlx::query(
        "INSERT INTO oncely_idempotency_keys \
         SELECT (jsonb_populate_record(t, jsonb_build_object('key', 'k-' || i))).* \
         FROM oncely_idempotency_keys t, generate_series(1, $1) i \
         WHERE t.scope = $2 AND t.key = $3",
    )
    .bind(i64::try_from(rows).unwrap())
    .bind(seeded.template.scope.as_str())
    .bind(seeded.template.key.as_str())
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::raw_sql("ANALYZE oncely_idempotency_keys")
        .execute(store.pool())
        .await
        .unwrap();

    let mut conn = store.pool().acquire().await.unwrap();
    let mut failed = Vec::new();
    for case in cases(&seeded) {
        let custom = plan(&mut conn, &case, false).await;
        let generic = plan(&mut conn, &case, true).await;
        println!(
            "== {} ({rows} completed records)\n-- custom plan:\n{custom}\n-- generic plan:\n{generic}\n",
            case.name
        );
        if !case.index.iter().any(|i| custom.contains(*i)) {
            failed.push(format!(
                "{}: the custom plan uses none of {:?}",
                case.name, case.index
            ));
        }
        if custom.contains("Seq Scan") {
            failed.push(format!("{}: the custom plan scans the table", case.name));
        }
        if generic.contains("Seq Scan") && case.generic_scans.is_none() {
            failed.push(format!("{}: the generic plan scans the table", case.name));
        }
    }
    drop(conn);
    store.pool().close().await;
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        db.name
    )))
    .execute(&mut admin)
    .await;
    assert!(failed.is_empty(), "{failed:#?}");
}
