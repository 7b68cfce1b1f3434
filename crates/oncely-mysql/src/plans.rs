//! The plans of the queries the maintenance passes and the operator's listing run, on a table
//! of many completed records (`docs/DESIGN.md`, "The maintenance index"): `EXPLAIN` reads
//! each through the index meant for it, and none is a full table scan (access type `ALL`), so a
//! pass costs what its work costs, not what the table holds. MySQL re-plans a prepared
//! statement on every execution with its values, so the values are written into the text
//! here. Skipped when `ONCELY_TEST_MYSQL_URL` is unset; the table holds `ONCELY_TEST_PLAN_ROWS`
//! completed records (20,000 by default; run with `ONCELY_TEST_PLAN_ROWS=1000000 cargo test -p
//! oncely-mysql plans -- --nocapture` to see the plans at a million).

use crate::MySqlStore;
use crate::sql;
use oncely_conformance::plans::{OwnDatabase, Seeded, plan_rows, seed};
use oncely_core::ManualClock;
use sqlx::Connection as _;
use sqlx::Row as _;
use std::sync::Arc;

/// One query: its name, text, its parameters as SQL literals (in the order the store binds
/// them), and the indexes its plan may use (one of them, on every step).
struct Case {
    name: &'static str,
    sql: &'static str,
    args: Vec<String>,
    index: &'static [&'static str],
}

/// `sql` with each `?` replaced by the next of `args`.
fn inline(sql: &str, args: &[String]) -> String {
    let mut args = args.iter();
    sql.chars()
        .map(|c| match c {
            '?' => args.next().expect("an argument per parameter").clone(),
            c => c.to_string(),
        })
        .collect()
}

fn cases(s: &Seeded) -> Vec<Case> {
    let now = s.now.to_string();
    let (id, token) = &s.abandoned;
    let quote = |v: &str| format!("'{v}'");
    let note = vec![
        now.clone(),
        quote(id.scope.as_str()),
        quote(id.key.as_str()),
        token.0.to_string(),
        now.clone(),
        "0".into(),
    ];
    // Scope (twice), the cursor's scope (twice) and key, in flight, marked, abandoned, now,
    // created at most (twice), limit (as `MySqlStore::list_records` binds them).
    let list = |scope: &str, cursor: [&str; 2], flags: [u8; 3], created: &str| {
        [scope, scope, cursor[0], cursor[0], cursor[1]]
            .into_iter()
            .map(str::to_owned)
            .chain(flags.iter().map(u8::to_string))
            .chain([
                now.clone(),
                created.to_owned(),
                created.to_owned(),
                "50".into(),
            ])
            .collect()
    };
    let this_scope = quote(s.scope.as_str());
    let case = |name, sql, args, index| Case {
        name,
        sql,
        args,
        index,
    };
    let pkey: &[&str] = &["PRIMARY"];
    let leases: &[&str] = &["oncely_idempotency_keys_leases"];
    let none = [0; 3];
    vec![
        case(
            "list_abandoned",
            sql::LIST_ABANDONED,
            vec![now.clone(), now.clone(), "100".into()],
            leases,
        ),
        case("list_marked", sql::LIST_MARKED, vec!["100".into()], leases),
        case(
            "note_redrive (attempt)",
            sql::NOTE_ATTEMPT,
            note.clone(),
            pkey,
        ),
        case("note_redrive (mark)", sql::NOTE_MARK, note, pkey),
        case(
            "reap",
            sql::REAP_SELECT,
            vec![now.clone(), "1000".into()],
            &["oncely_idempotency_keys_expires_at"],
        ),
        case(
            "list_records",
            sql::LIST_RECORDS,
            list("NULL", ["''", "''"], none, "NULL"),
            pkey,
        ),
        case(
            "list_records --scope",
            sql::LIST_RECORDS,
            list(&this_scope, ["''", "''"], none, "NULL"),
            pkey,
        ),
        case(
            "list_records --cursor",
            sql::LIST_RECORDS,
            list("NULL", [&this_scope, "'k-500'"], none, "NULL"),
            pkey,
        ),
        case(
            "list_records --older-than",
            sql::LIST_RECORDS,
            list("NULL", ["''", "''"], none, &(s.now - 1000).to_string()),
            pkey,
        ),
        case(
            "list_records --in-flight",
            sql::LIST_RECORDS,
            list("NULL", ["''", "''"], [1, 0, 0], "NULL"),
            pkey,
        ),
        case(
            "list_records --marked",
            sql::LIST_RECORDS,
            list("NULL", ["''", "''"], [0, 1, 0], "NULL"),
            &["PRIMARY", "oncely_idempotency_keys_leases"],
        ),
        case(
            "list_records --abandoned",
            sql::LIST_RECORDS,
            list("NULL", ["''", "''"], [0, 0, 1], "NULL"),
            &["PRIMARY", "oncely_idempotency_keys_leases"],
        ),
    ]
}

/// A database of its own holding `plan_rows()` completed records, then every query's plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_and_listing_queries_read_their_indexes() {
    let Some(db) = OwnDatabase::from_env("ONCELY_TEST_MYSQL_URL", "oncely_plans") else {
        return;
    };
    let mut admin = sqlx::MySqlConnection::connect(&db.admin).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {}", db.name)))
        .execute(&mut admin)
        .await
        .unwrap();
    let clock = ManualClock::starting_now();
    let store = MySqlStore::connect(&db.url)
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    store.migrate().await.unwrap();
    let seeded = seed(&store, &clock).await;

    // Copies of the template under new keys, every column as the store wrote it: the copies
    // made in a temporary table (a cross join of digits for the series), their keys replaced
    // there, then inserted; the statistics refreshed.
    let rows = plan_rows();
    let digits = "(SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
                  SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL \
                  SELECT 8 UNION ALL SELECT 9)";
    let series: Vec<String> = (0..rows.max(2).ilog10() + 1)
        .map(|p| format!("{digits} AS d{p}"))
        .collect();
    let template = &seeded.template;
    let mut conn = store.pool().acquire().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TEMPORARY TABLE copies AS SELECT t.* FROM oncely_idempotency_keys t, {} \
         WHERE t.scope = '{}' AND t.`key` = '{}' LIMIT {rows}; \
         SET @n = 0; UPDATE copies SET `key` = CONCAT('k-', @n := @n + 1); \
         INSERT INTO oncely_idempotency_keys SELECT * FROM copies; \
         DROP TEMPORARY TABLE copies; ANALYZE TABLE oncely_idempotency_keys",
        series.join(", "),
        template.scope.as_str(),
        template.key.as_str()
    )))
    .execute(&mut *conn)
    .await
    .unwrap();

    let mut failed = Vec::new();
    for case in cases(&seeded) {
        let statement = format!("EXPLAIN {}", inline(case.sql, &case.args));
        let steps = sqlx::query(sqlx::AssertSqlSafe(statement))
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let field = |row: &sqlx::mysql::MySqlRow, name: &str| {
            row.try_get_unchecked::<Option<String>, _>(name)
                .unwrap()
                .unwrap_or_default()
        };
        println!("== {} ({rows} completed records)", case.name);
        for step in &steps {
            let (kind, key) = (field(step, "type"), field(step, "key"));
            println!(
                "table {} type {kind} key {key} rows {} extra {}",
                field(step, "table"),
                field(step, "rows"),
                field(step, "Extra"),
            );
            if kind == "ALL" {
                failed.push(format!("{}: the plan scans the table", case.name));
            }
            if !case.index.contains(&key.as_str()) {
                failed.push(format!(
                    "{}: the plan reads {key:?}, none of {:?}",
                    case.name, case.index
                ));
            }
        }
        println!();
    }
    drop(conn);
    store.pool().close().await;
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {}",
        db.name
    )))
    .execute(&mut admin)
    .await;
    assert!(failed.is_empty(), "{failed:#?}");
}
