//! The plans of the queries the maintenance passes and the operator's listing run, on a table
//! of many completed records (`docs/DESIGN.md`, "The maintenance index"): each searches the
//! index meant for it (`EXPLAIN QUERY PLAN`), and none is a `SCAN` of the table without one, so
//! a pass costs what its work costs, not what the table holds. The table holds
//! `ONCELY_TEST_PLAN_ROWS` completed records (20,000 by default; run with
//! `ONCELY_TEST_PLAN_ROWS=1000000 cargo test -p oncely-sqlite plans -- --nocapture` to see the
//! plans at a million).

use crate::SqliteStore;
use crate::sql;
use oncely_conformance::plans::{Seeded, plan_rows, seed};
use oncely_core::ManualClock;
use sqlx::Row as _;
use std::sync::Arc;

/// A bound parameter.
#[derive(Clone)]
enum Arg {
    Int(i64),
    Text(String),
    Null,
}

/// One query: its name, text, its parameters (bound as the store binds them), and the indexes
/// its plan may search (one of them).
struct Case {
    name: &'static str,
    sql: &'static str,
    args: Vec<Arg>,
    index: &'static [&'static str],
}

fn cases(s: &Seeded) -> Vec<Case> {
    use Arg::{Int, Null, Text};
    let now = s.now;
    let (id, token) = &s.abandoned;
    let text = |v: &str| Text(v.to_owned());
    let note = vec![
        Int(now),
        text(id.scope.as_str()),
        text(id.key.as_str()),
        Int(token.0),
        Int(now),
        Int(0),
    ];
    // ?1 scope, ?2 ?3 cursor, ?4 in flight, ?5 marked, ?6 abandoned, ?7 now, ?8 created at
    // most, ?9 limit (as `SqliteStore::list_records` binds them).
    let list = |scope: Arg, cursor: [&str; 2], flags: [i64; 3], created: Arg| {
        vec![
            scope,
            text(cursor[0]),
            text(cursor[1]),
            Int(flags[0]),
            Int(flags[1]),
            Int(flags[2]),
            Int(now),
            created,
            Int(50),
        ]
    };
    let this_scope = s.scope.as_str();
    let case = |name, sql, args, index| Case {
        name,
        sql,
        args,
        index,
    };
    let pkey: &[&str] = &["sqlite_autoindex_oncely_idempotency_keys_1"];
    let none = [0; 3];
    vec![
        case(
            "list_abandoned",
            sql::LIST_ABANDONED,
            vec![Int(now), Int(100), Int(now)],
            &["oncely_idempotency_keys_abandoned"],
        ),
        case(
            "list_marked",
            sql::LIST_MARKED,
            vec![Int(100)],
            &["oncely_idempotency_keys_marked"],
        ),
        case(
            "note_redrive (attempt)",
            sql::NOTE_ATTEMPT,
            note.clone(),
            pkey,
        ),
        case("note_redrive (mark)", sql::NOTE_MARK, note, pkey),
        case(
            "reap",
            sql::REAP_BATCH,
            vec![Int(now), Int(1000)],
            &["oncely_idempotency_keys_expires_at"],
        ),
        case(
            "list_records",
            sql::LIST_RECORDS,
            list(Null, ["", ""], none, Null),
            pkey,
        ),
        case(
            "list_records --scope",
            sql::LIST_RECORDS,
            list(text(this_scope), ["", ""], none, Null),
            pkey,
        ),
        case(
            "list_records --cursor",
            sql::LIST_RECORDS,
            list(Null, [this_scope, "k-500"], none, Null),
            pkey,
        ),
        case(
            "list_records --older-than",
            sql::LIST_RECORDS,
            list(Null, ["", ""], none, Int(now - 1000)),
            pkey,
        ),
        case(
            "list_records --in-flight",
            sql::LIST_RECORDS,
            list(Null, ["", ""], [1, 0, 0], Null),
            pkey,
        ),
        case(
            "list_records --marked",
            sql::LIST_RECORDS,
            list(Null, ["", ""], [0, 1, 0], Null),
            pkey,
        ),
        case(
            "list_records --abandoned",
            sql::LIST_RECORDS,
            list(Null, ["", ""], [0, 0, 1], Null),
            pkey,
        ),
    ]
}

/// The `EXPLAIN QUERY PLAN` of `case`, one line per step.
async fn plan(store: &SqliteStore, case: &Case) -> Vec<String> {
    let statement = format!("EXPLAIN QUERY PLAN {}", case.sql);
    let mut query = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()));
    for arg in &case.args {
        query = match arg.clone() {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
            Arg::Null => query.bind(None::<i64>),
        };
    }
    query
        .fetch_all(store.pool())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
        .iter()
        .map(|row| row.try_get::<String, _>("detail").unwrap())
        .collect()
}

/// A file holding `plan_rows()` completed records, then every query's plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_and_listing_queries_search_their_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("plans.sqlite3").display()
    );
    let clock = ManualClock::starting_now();
    let store = SqliteStore::connect(&url)
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let seeded = seed(&store, &clock).await;

    // Copies of the template under new keys, every column as the store wrote it: the copies
    // made in a table without the primary key, their keys replaced there, then inserted.
    let rows = plan_rows();
    let template = &seeded.template;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TEMP TABLE copies AS WITH RECURSIVE s(i) AS \
         (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {rows}) \
         SELECT t.* FROM s, oncely_idempotency_keys t \
         WHERE t.scope = '{}' AND t.key = '{}'; \
         UPDATE copies SET key = 'k-' || rowid; \
         INSERT INTO oncely_idempotency_keys SELECT * FROM copies; \
         DROP TABLE copies",
        template.scope.as_str(),
        template.key.as_str()
    )))
    .execute(store.pool())
    .await
    .unwrap();

    let mut failed = Vec::new();
    for case in cases(&seeded) {
        let steps = plan(&store, &case).await;
        println!(
            "== {} ({rows} completed records)\n{}\n",
            case.name,
            steps.join("\n")
        );
        if !steps
            .iter()
            .any(|s| s.split_whitespace().any(|w| case.index.contains(&w)))
        {
            failed.push(format!(
                "{}: the plan searches none of {:?}",
                case.name, case.index
            ));
        }
        if steps
            .iter()
            .any(|s| s.starts_with("SCAN oncely_idempotency_keys") && !s.contains(" INDEX "))
        {
            failed.push(format!("{}: the plan scans the table", case.name));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
