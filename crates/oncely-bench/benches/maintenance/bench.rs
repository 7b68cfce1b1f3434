//! [`Bench`]: one store under the bench, how it is opened, filled, reset and closed.

use crate::copy::{COPY_BATCH, Dialect, admin_sql};
use crate::records::load_through_store;
use crate::redis_server::{Server, start_redis};
use oncely_bench::env_url;
use oncely_conformance::plans::OwnDatabase;
use oncely_core::Maintenance;
use oncely_mysql::MySqlStore;
use oncely_postgres::PostgresStore;
use oncely_redis::{RedisConfig, RedisStore};
use oncely_sqlite::SqliteStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The store under the bench and what it needs beside the store.
pub(crate) enum Extra {
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

pub(crate) struct Bench {
    pub(crate) name: &'static str,
    pub(crate) store: Arc<dyn Maintenance>,
    pub(crate) extra: Extra,
}

impl Bench {
    /// Opens the store `name`, or says why it is skipped.
    pub(crate) async fn open(name: &str) -> Result<Self, String> {
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
    pub(crate) async fn load(&self, prefix: &str, from: usize, n: usize) {
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
    pub(crate) async fn walk(&self) -> Option<(u64, Duration)> {
        let Extra::Redis { store, .. } = &self.extra else {
            return None;
        };
        let started = Instant::now();
        let walk = store.rebuild_index().await.expect("walk");
        Some((walk.records, started.elapsed()))
    }

    /// Redis: starts counting commands (`CONFIG RESETSTAT`).
    pub(crate) async fn reset(&mut self) {
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
    pub(crate) async fn commands(&mut self) -> Option<u64> {
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
    pub(crate) async fn finish(self) {
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
