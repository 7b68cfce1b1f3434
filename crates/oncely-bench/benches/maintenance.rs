//! One completer pass and one reaper pass, with many completed records held and 100 abandoned
//! ones, on Redis, SQLite, PostgreSQL and MySQL/MariaDB: what a pass costs as the records kept
//! grow (`docs/DESIGN.md`, "The maintenance index"). The target: a pass at 1,000,000 records
//! held costs at most twice what it costs at 10,000, on every store.
//!
//! The stores, and how each is filled:
//!
//! - **Redis**: a `redis-server` of the bench's own on a free port (nothing persisted, so it
//!   loads fast; killed at the end), loaded through the store (claim + complete, 256 at a
//!   time, the server's default policy). Besides the pass times it reports the Redis commands
//!   a pass ran (`INFO commandstats`), which do not depend on the machine's load, and the time
//!   of the namespace walk (the index's backstop, at most once an hour), the only maintenance
//!   that reads every record.
//! - **SQLite**: a file in a temporary directory, opened as a server opens it.
//! - **PostgreSQL** (when `ONCELY_BENCH_POSTGRES_URL` or `ONCELY_TEST_POSTGRES_URL` is set) and
//!   **MySQL/MariaDB** (`ONCELY_BENCH_MYSQL_URL` or `ONCELY_TEST_MYSQL_URL`): a database of the
//!   bench's own on that server (`oncely_bench_maint_<uuid>`, dropped at the end), so the
//!   completer never re-drives anybody else's records.
//!
//!   A SQL store gets one completed record through the store's own write path (claim +
//!   complete: the template, exactly the row a server writes), then copies of it under new
//!   keys, 100,000 rows per `INSERT ... SELECT` (the series from `generate_series` on
//!   PostgreSQL, a recursive CTE on SQLite, a cross join of digits on MySQL), every column
//!   copied as the table has it (the column list is read from the catalog, so a later
//!   migration's columns are copied too). PostgreSQL's statistics are then refreshed
//!   (`ANALYZE`, as autovacuum would).
//!
//! Each pass time is the median of 5 passes, each on 100 fresh abandoned records. The plans of
//! the SQL stores' maintenance queries are checked by the stores' own tests (`plans` in
//! `oncely-postgres`, `oncely-sqlite` and `oncely-mysql`; `ONCELY_TEST_PLAN_ROWS` sets their
//! table size).
//!
//! Run (the sizes are the records held, 10,000 when none is given; `ONCELY_BENCH_STORES`
//! picks stores, default `redis,sqlite,postgres,mysql`, those without a URL skipped):
//!
//! ```text
//! ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! ONCELY_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/mysql \
//!   cargo bench -p oncely-bench --bench maintenance -- 10000 100000 1000000
//! ```
//!
//! (1,000,000 records take about 1 GB of Redis memory and a few minutes to load; on PostgreSQL
//! and SQLite about 0.5 GB of disk and under a minute to copy.)
//!
//! A smoke run (a debug build, every store, small sizes; its times mean nothing):
//!
//! ```text
//! ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! ONCELY_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/mysql \
//!   cargo test -p oncely-bench --bench maintenance -- 1000 10000
//! ```
//!
//! PostgreSQL and SQLite at 1,000,000 only:
//!
//! ```text
//! ONCELY_BENCH_STORES=postgres,sqlite \
//! ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo bench -p oncely-bench --bench maintenance -- 10000 1000000
//! ```

#![allow(missing_docs)]

use async_trait::async_trait;
use futures::StreamExt;
use oncely_bench::{claim_request, env_url, response, run_prefix};
use oncely_conformance::plans::OwnDatabase;
use oncely_core::{ClaimOutcome, ClaimRequest, Maintenance, Record, RecordKey, StoredRequest};
use oncely_jobs::{
    DEFAULT_REAP_PAUSE, Redrive, RedriveError, RedrivePolicy, complete_abandoned, reap_all,
};
use oncely_mysql::MySqlStore;
use oncely_postgres::PostgresStore;
use oncely_redis::{RedisConfig, RedisStore};
use oncely_sqlite::SqliteStore;
use sqlx::Connection as _;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The abandoned records of every pass.
const ABANDONED: usize = 100;
/// Passes per size (the median is reported).
const PASSES: usize = 5;
/// Rows copied per `INSERT ... SELECT` into a SQL store.
const COPY_BATCH: usize = 100_000;
/// The stores measured when `ONCELY_BENCH_STORES` is unset.
const DEFAULT_STORES: &str = "redis,sqlite,postgres,mysql";

/// A `redis-server` of the bench's own, killed when dropped (its directory deleted after).
struct Server(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Server, u16) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Server(child, dir), port)
}

/// Runs `statement` on the server of `own` (PostgreSQL or MySQL), outside its database: the
/// bench's own database is created and dropped this way.
async fn admin_sql(own: &OwnDatabase, dialect: Dialect, statement: String) {
    let statement = sqlx::AssertSqlSafe(statement);
    match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(&own.admin)
                .await
                .expect("connect to PostgreSQL");
            sqlx::raw_sql(statement).execute(&mut c).await.expect("DDL");
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(&own.admin)
                .await
                .expect("connect to MySQL");
            sqlx::raw_sql(statement).execute(&mut c).await.expect("DDL");
        }
        Dialect::Sqlite => unreachable!("a SQLite store is a file of its own"),
    }
}

/// The SQL dialects of the bulk copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Postgres,
    Sqlite,
    MySql,
}

impl Dialect {
    /// The `n`th parameter (1-based; MySQL's are positional, so every statement binds them in
    /// the order they appear).
    fn param(self, n: usize) -> String {
        match self {
            Self::Postgres => format!("${n}"),
            Self::Sqlite => format!("?{n}"),
            Self::MySql => "?".to_owned(),
        }
    }

    /// The table's columns, in order, from the catalog.
    fn columns_query(self) -> &'static str {
        match self {
            Self::Postgres => {
                "SELECT CAST(column_name AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = 'oncely_idempotency_keys' \
                 ORDER BY ordinal_position"
            }
            Self::Sqlite => "SELECT name FROM pragma_table_info('oncely_idempotency_keys')",
            Self::MySql => {
                "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = 'oncely_idempotency_keys' \
                 ORDER BY ordinal_position"
            }
        }
    }

    /// The statement that copies the template row once per number of a series: the new
    /// keys' prefix (`$1`, followed by the number), the series' first and last number (`$2`,
    /// `$3`), the template's scope and key (`$4`, `$5`), bound in that order (the order they
    /// appear in). Every other column is copied as it is.
    fn copy_statement(self, columns: &[String]) -> String {
        let quote = |c: &str| match self {
            Self::MySql => format!("`{c}`"),
            Self::Postgres | Self::Sqlite => format!("\"{c}\""),
        };
        let [prefix, first, last, scope, key] = [1, 2, 3, 4, 5].map(|n| self.param(n));
        let (new_key, series) = match self {
            Self::Postgres => (
                format!("{prefix} || CAST(g.i AS TEXT)"),
                format!("SELECT generate_series({first}::bigint, {last}::bigint) AS i"),
            ),
            Self::Sqlite => (
                format!("{prefix} || CAST(g.i AS TEXT)"),
                format!(
                    "WITH RECURSIVE s(i) AS (SELECT CAST({first} AS INTEGER) UNION ALL \
                     SELECT i + 1 FROM s WHERE i < {last}) SELECT i FROM s"
                ),
            ),
            // A cross join of digits (MySQL 8 stops a recursive CTE at 1000 rows by default).
            Self::MySql => {
                let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL \
                              SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL \
                              SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                let places = COPY_BATCH.ilog10();
                let sum: Vec<String> = (0..places)
                    .map(|p| format!("{}*d{p}.d", 10usize.pow(p)))
                    .collect();
                let from: Vec<String> = (0..places).map(|p| format!("{digits} AS d{p}")).collect();
                (
                    format!("CONCAT({prefix}, g.i)"),
                    format!(
                        "SELECT * FROM (SELECT {first} + {} AS i FROM {}) AS n WHERE i <= {last}",
                        sum.join(" + "),
                        from.join(", ")
                    ),
                )
            }
        };
        let names: Vec<String> = columns.iter().map(|c| quote(c)).collect();
        let values: Vec<String> = columns
            .iter()
            .map(|c| {
                if c == "key" {
                    new_key.clone()
                } else {
                    format!("t.{}", quote(c))
                }
            })
            .collect();
        format!(
            "INSERT INTO oncely_idempotency_keys ({}) SELECT {} FROM ({series}) AS g, \
             oncely_idempotency_keys AS t WHERE t.scope = {scope} AND t.{} = {key}",
            names.join(", "),
            values.join(", "),
            quote("key"),
        )
    }
}

/// The store under the bench and what it needs beside the store.
enum Extra {
    Redis {
        store: RedisStore,
        raw: redis::aio::MultiplexedConnection,
        _server: Server,
    },
    Sqlite {
        store: SqliteStore,
        _dir: tempfile::TempDir,
    },
    Postgres {
        store: PostgresStore,
        own: OwnDatabase,
    },
    MySql {
        store: MySqlStore,
        own: OwnDatabase,
    },
}

struct Bench {
    name: &'static str,
    store: Arc<dyn Maintenance>,
    extra: Extra,
}

impl Bench {
    /// Opens the store `name`, or says why it is skipped.
    async fn open(name: &str) -> Result<Self, String> {
        let (name, extra): (&'static str, Extra) = match name {
            "redis" => {
                let (server, port) = start_redis();
                let url = format!("redis://127.0.0.1:{port}?accept_volatile=true");
                let store = RedisStore::connect_with(&url, RedisConfig::new())
                    .await
                    .expect("connect to the bench's redis-server");
                let client =
                    redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a URL");
                let raw = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("a connection");
                (
                    "redis",
                    Extra::Redis {
                        store,
                        raw,
                        _server: server,
                    },
                )
            }
            "sqlite" => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let url = format!(
                    "sqlite://{}?mode=rwc",
                    dir.path().join("bench.sqlite3").display()
                );
                let store = SqliteStore::connect(&url).await.expect("open SQLite");
                ("sqlite", Extra::Sqlite { store, _dir: dir })
            }
            "postgres" => {
                let url = env_url("ONCELY_BENCH_POSTGRES_URL", "ONCELY_TEST_POSTGRES_URL")
                    .ok_or("ONCELY_BENCH_POSTGRES_URL is not set")?;
                let own = OwnDatabase::new(&url, "oncely_bench_maint");
                admin_sql(
                    &own,
                    Dialect::Postgres,
                    format!("CREATE DATABASE {}", own.name),
                )
                .await;
                let store = PostgresStore::connect(&own.url)
                    .await
                    .expect("connect to PostgreSQL");
                store.migrate().await.expect("migrate");
                ("postgres", Extra::Postgres { store, own })
            }
            "mysql" => {
                let url = env_url("ONCELY_BENCH_MYSQL_URL", "ONCELY_TEST_MYSQL_URL")
                    .ok_or("ONCELY_BENCH_MYSQL_URL is not set")?;
                let own = OwnDatabase::new(&url, "oncely_bench_maint");
                admin_sql(
                    &own,
                    Dialect::MySql,
                    format!("CREATE DATABASE {}", own.name),
                )
                .await;
                let store = MySqlStore::connect(&own.url)
                    .await
                    .expect("connect to MySQL");
                store.migrate().await.expect("migrate");
                ("mysql", Extra::MySql { store, own })
            }
            other => return Err(format!("{other:?} is not a store of this bench")),
        };
        let store: Arc<dyn Maintenance> = match &extra {
            Extra::Redis { store, .. } => Arc::new(store.clone()),
            Extra::Sqlite { store, .. } => Arc::new(store.clone()),
            Extra::Postgres { store, .. } => Arc::new(store.clone()),
            Extra::MySql { store, .. } => Arc::new(store.clone()),
        };
        Ok(Self { name, store, extra })
    }

    /// Stores `n` more completed records (keys `{prefix}-{from}` on).
    async fn load(&self, prefix: &str, from: usize, n: usize) {
        let dialect = match &self.extra {
            Extra::Redis { .. } => return load_through_store(&*self.store, prefix, from, n).await,
            Extra::Sqlite { .. } => Dialect::Sqlite,
            Extra::Postgres { .. } => Dialect::Postgres,
            Extra::MySql { .. } => Dialect::MySql,
        };
        if n == 0 {
            return;
        }
        // The template: one record written as a server writes it (key `{prefix}-template-0`).
        let template = format!("{prefix}-template");
        if from == 0 {
            load_through_store(&*self.store, &template, 0, 1).await;
        }
        let template = format!("{template}-0");
        let key_prefix = format!("{prefix}-");
        // Copies the template on `$pool`, a batch of the series per statement.
        macro_rules! copy {
            ($pool:expr) => {{
                let columns: Vec<String> = sqlx::query_scalar(dialect.columns_query())
                    .fetch_all($pool)
                    .await
                    .expect("the table's columns");
                let statement = dialect.copy_statement(&columns);
                for first in (from..from + n).step_by(COPY_BATCH) {
                    let last = (first + COPY_BATCH).min(from + n) - 1;
                    let done = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                        .bind(key_prefix.as_str())
                        .bind(i64::try_from(first).expect("a size"))
                        .bind(i64::try_from(last).expect("a size"))
                        .bind("acct_bench")
                        .bind(template.as_str())
                        .execute($pool)
                        .await
                        .expect("copy the template row");
                    assert_eq!(done.rows_affected(), (last + 1 - first) as u64);
                }
            }};
        }
        match &self.extra {
            Extra::Sqlite { store, .. } => copy!(store.pool()),
            Extra::MySql { store, .. } => copy!(store.pool()),
            Extra::Postgres { store, .. } => {
                copy!(store.pool());
                sqlx::raw_sql("ANALYZE oncely_idempotency_keys")
                    .execute(store.pool())
                    .await
                    .expect("ANALYZE");
            }
            Extra::Redis { .. } => unreachable!("loaded above"),
        }
    }

    /// Redis: the records the namespace walk found and how long it took; `None` elsewhere
    /// (nothing of the kind exists on a SQL store).
    async fn walk(&self) -> Option<(u64, Duration)> {
        let Extra::Redis { store, .. } = &self.extra else {
            return None;
        };
        let started = Instant::now();
        let walk = store.rebuild_index().await.expect("walk");
        Some((walk.records, started.elapsed()))
    }

    /// Redis: starts counting commands (`CONFIG RESETSTAT`).
    async fn reset(&mut self) {
        if let Extra::Redis { raw, .. } = &mut self.extra {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(raw)
                .await
                .expect("CONFIG RESETSTAT");
        }
    }

    /// Redis: the calls of every command since [`Bench::reset`], summed (the statistics
    /// commands left out).
    async fn commands(&mut self) -> Option<u64> {
        let Extra::Redis { raw, .. } = &mut self.extra else {
            return None;
        };
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(raw)
            .await
            .expect("INFO");
        Some(
            info.lines()
                .filter_map(|l| {
                    let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                    let calls: u64 = rest
                        .strip_prefix("calls=")?
                        .split(',')
                        .next()?
                        .parse()
                        .ok()?;
                    (!name.starts_with("config") && name != "info").then_some(calls)
                })
                .sum(),
        )
    }

    /// Drops the bench's own database, if any.
    async fn finish(self) {
        match &self.extra {
            Extra::Postgres { own, .. } => {
                let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", own.name);
                admin_sql(own, Dialect::Postgres, drop).await;
            }
            Extra::MySql { own, .. } => {
                let drop = format!("DROP DATABASE IF EXISTS {}", own.name);
                admin_sql(own, Dialect::MySql, drop).await;
            }
            Extra::Redis { .. } | Extra::Sqlite { .. } => {}
        }
    }
}

/// A re-drive as the server's would end: the key taken over (its lease lapsed) and completed.
struct CompleteThroughStore(Arc<dyn Maintenance>);

#[async_trait]
impl Redrive for CompleteThroughStore {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        let id = RecordKey::new(record.scope.clone(), record.key.clone());
        let req = ClaimRequest::new(
            id.clone(),
            record.fingerprint,
            Duration::from_secs(30),
            Duration::from_secs(86_400),
            Duration::from_secs(259_200),
        );
        match self.0.claim(req).await {
            Ok(ClaimOutcome::Claimed(c)) => {
                self.0
                    .complete(&id, c.token, response(256), Duration::from_secs(259_200))
                    .await
                    .map_err(|e| RedriveError::Unreachable(e.into()))?;
                Ok(201)
            }
            Ok(other) => Err(RedriveError::Unreachable(
                format!("not claimed: {other:?}").into(),
            )),
            Err(e) => Err(RedriveError::Unreachable(e.into())),
        }
    }
}

/// Stores `n` more completed records through the store (claim + complete), 256 at a time.
async fn load_through_store(store: &dyn Maintenance, prefix: &str, from: usize, n: usize) {
    let body = response(256);
    futures::stream::iter(from..from + n)
        .for_each_concurrent(256, |i| {
            let body = body.clone();
            async move {
                let req = claim_request(&format!("{prefix}-{i}"));
                let ClaimOutcome::Claimed(c) = store.claim(req.clone()).await.expect("claim")
                else {
                    panic!("a fresh key is claimed");
                };
                store
                    .complete(&req.id, c.token, body, req.retention)
                    .await
                    .expect("complete");
            }
        })
        .await;
}

/// Claims 100 fresh keys with a 1-millisecond lease and a stored request, and waits until
/// their leases lapsed: the abandoned requests of the next pass.
async fn abandon(store: &dyn Maintenance, prefix: &str, round: usize) {
    for i in 0..ABANDONED {
        let mut req = claim_request(&format!("{prefix}-abandoned-{round}-{i}")).with_request(Some(
            StoredRequest::new("POST", "/v1/orders", vec![], b"{}".to_vec()),
        ));
        req.lease = Duration::from_millis(1);
        assert!(matches!(
            store.claim(req).await.expect("claim"),
            ClaimOutcome::Claimed(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One line of the report.
struct Row {
    store: &'static str,
    size: usize,
    completer: Duration,
    completer_cmds: Option<u64>,
    reaper: Duration,
    reaper_cmds: Option<u64>,
    walk: Option<Duration>,
}

/// Every size on one store, smallest first (each size adds records to the last).
async fn measure(bench: &mut Bench, sizes: &[usize], rows: &mut Vec<Row>) {
    let redrive = CompleteThroughStore(bench.store.clone());
    let policy = RedrivePolicy::default();
    let prefix = run_prefix();
    let (mut held, mut round) = (0, 0);
    for &size in sizes {
        let started = Instant::now();
        bench.load(&prefix, held, size - held.min(size)).await;
        held = held.max(size);
        eprintln!(
            "{}: {size} completed records held (loaded in {:.1} s)",
            bench.name,
            started.elapsed().as_secs_f64()
        );
        let walk = bench.walk().await;
        if let Some((records, _)) = walk {
            assert!(records >= size as u64, "the walk found {records}");
        }
        // The first pass ever on a Redis namespace walks it too; this one is not measured.
        abandon(&*bench.store, &prefix, round).await;
        round += 1;
        complete_abandoned(&*bench.store, &redrive, Duration::ZERO, ABANDONED, &policy).await;
        let (mut completer, mut reaper) = (Vec::new(), Vec::new());
        let (mut completer_cmds, mut reaper_cmds) = (None, None);
        for _ in 0..PASSES {
            abandon(&*bench.store, &prefix, round).await;
            round += 1;
            bench.reset().await;
            let started = Instant::now();
            let report =
                complete_abandoned(&*bench.store, &redrive, Duration::ZERO, ABANDONED, &policy)
                    .await;
            completer.push(started.elapsed());
            completer_cmds = bench.commands().await;
            assert_eq!(report.completed, ABANDONED as u64, "{report:?}");
            bench.reset().await;
            let started = Instant::now();
            let report = reap_all(&*bench.store, 1000, DEFAULT_REAP_PAUSE)
                .await
                .expect("reap");
            reaper.push(started.elapsed());
            reaper_cmds = bench.commands().await;
            assert_eq!(report.deleted, 0, "{report:?}");
        }
        rows.push(Row {
            store: bench.name,
            size,
            completer: median(completer),
            completer_cmds,
            reaper: median(reaper),
            reaper_cmds,
            walk: walk.map(|(_, d)| d),
        });
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| {
            a.replace(['_', ','], "")
                .parse()
                .expect("a number of records")
        })
        .collect();
    if sizes.is_empty() {
        sizes.push(10_000);
    }
    sizes.sort_unstable();
    let stores = std::env::var("ONCELY_BENCH_STORES").unwrap_or_else(|_| DEFAULT_STORES.into());
    let mut rows = Vec::new();
    for name in stores.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut bench = match Bench::open(name).await {
            Ok(b) => b,
            Err(why) => {
                eprintln!("{name}: skipped ({why})");
                continue;
            }
        };
        measure(&mut bench, &sizes, &mut rows).await;
        bench.finish().await;
    }
    let count = |c: Option<u64>| c.map_or_else(|| "-".to_owned(), |c| c.to_string());
    println!(
        "| store | records held | completer pass (100 abandoned) | commands | reaper pass | commands | walk of the namespace |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        let base = rows
            .iter()
            .find(|r| r.store == row.store)
            .expect("the store's first row");
        println!(
            "| {} | {} | {:.2} ms ({:.2}x) | {} | {:.2} ms ({:.2}x) | {} | {} |",
            row.store,
            row.size,
            ms(row.completer),
            row.completer.as_secs_f64() / base.completer.as_secs_f64(),
            count(row.completer_cmds),
            ms(row.reaper),
            row.reaper.as_secs_f64() / base.reaper.as_secs_f64(),
            count(row.reaper_cmds),
            row.walk
                .map_or_else(|| "-".to_owned(), |w| format!("{:.2} s", w.as_secs_f64())),
        );
    }
}
