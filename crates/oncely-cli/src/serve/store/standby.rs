//! Starting while the key store is down: a server restarted during a Redis, PostgreSQL or MySQL
//! outage must come back with the store, not stay down.
//!
//! [`Standby`] is the key store the server uses for Redis, PostgreSQL and MySQL: until the real store
//! has answered (connected, and its tables created), every call fails with
//! [`StoreError::Unavailable`], so keyed routes answer `503 idempotency_store_unavailable` with
//! `Retry-After` (the layer fails closed, nothing runs) and `GET /readyz` answers `503
//! not_ready`; `GET /healthz` stays `200` (the process is alive). A background task retries
//! the connection with a backoff from 500 milliseconds up to 5 seconds, logging the first
//! failure and then every tenth, and swaps the real store in once it answers.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::Backend;
use super::Opened;
use crate::serve::db::Db;
use anyhow::Result;
use oncely_core::{Maintenance, StoreError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A key store that is not reachable yet, then is (see the [module docs](self)).
pub struct Standby {
    inner: OnceLock<Arc<dyn Maintenance>>,
}

#[derive(Debug)]
struct NotYet;

impl std::fmt::Display for NotYet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the key store has not answered since this server started; retrying in the background",
        )
    }
}

impl std::error::Error for NotYet {}

impl Standby {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: OnceLock::new(),
        })
    }

    fn set(&self, store: Arc<dyn Maintenance>) {
        let _ = self.inner.set(store);
    }
}

/// Calls `attempt` until it succeeds, with a backoff from 500 ms up to 5 s.
async fn until_it_answers<T, F>(what: &str, attempt: impl Fn() -> F) -> T
where
    F: std::future::Future<Output = Result<T>>,
{
    let mut wait = Duration::from_millis(500);
    let mut failures = 0u64;
    loop {
        match attempt().await {
            Ok(v) => {
                if failures > 0 {
                    tracing::info!(failures, "{what} answers now; serving");
                }
                return v;
            }
            Err(e) => {
                if failures.is_multiple_of(10) {
                    tracing::warn!(error = %format!("{e:#}"), failures, "{what} does not answer; keyed routes answer 503 and /readyz is not ready until it does");
                }
                failures += 1;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Opens the Redis key store, at once if Redis answers, else in the background.
pub(super) async fn open_redis(url: &str, db: Db) -> Result<Opened> {
    let standby = Standby::new();
    let connect = {
        let url = url.to_owned();
        move || {
            let url = url.clone();
            async move {
                let store: Arc<dyn Maintenance> =
                    Arc::new(oncely_redis::RedisStore::connect(&url).await?);
                anyhow::Ok(store)
            }
        }
    };
    match connect().await {
        Ok(store) => standby.set(store),
        // A Redis that keeps nothing, or a bad URL, is a configuration error: waiting cannot
        // fix it, so the server does not start.
        Err(e)
            if e.downcast_ref::<oncely_redis::ConnectError>()
                .is_some_and(|c| !matches!(c, oncely_redis::ConnectError::Unavailable(_))) =>
        {
            return Err(e.context("open the Redis key store"));
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "the Redis key store does not answer; starting anyway");
            let standby = Arc::clone(&standby);
            tokio::spawn(async move {
                standby.set(until_it_answers("the Redis key store", connect).await);
            });
        }
    }
    super::split(standby, db).await
}

/// An SQL key store's own migrations (`PostgresStore::migrate`, `MySqlStore::migrate`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
type MigrateFn<S> =
    fn(S) -> futures::future::BoxFuture<'static, Result<(), oncely_core::StoreError>>;

/// The standby for an SQL key store and its business database `db`, both on a lazy pool: the
/// store's migrations (`migrate`), then the business tables', run at once if `what` answers,
/// else in the background until it does.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn prepare_sql<S>(
    what: &'static str,
    store: S,
    migrate: MigrateFn<S>,
    db: Db,
    backend: Backend,
) -> Result<Opened>
where
    S: Maintenance + Clone + 'static,
{
    let standby = Standby::new();
    let prepare = {
        let (store, db) = (store.clone(), db.clone());
        move || {
            let (store, db) = (store.clone(), db.clone());
            async move {
                migrate(store.clone()).await?;
                db.migrate().await?;
                let store: Arc<dyn Maintenance> = Arc::new(store);
                anyhow::Ok(store)
            }
        }
    };
    match prepare().await {
        Ok(s) => standby.set(s),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "{what} does not answer; starting anyway");
            let standby = Arc::clone(&standby);
            tokio::spawn(async move {
                standby.set(until_it_answers(what, prepare).await);
            });
        }
    }
    Ok(Opened {
        store: standby,
        backend,
        db,
    })
}

/// Opens the PostgreSQL key store and business database on a lazy pool; its tables are created
/// at once if PostgreSQL answers, else in the background.
#[cfg(feature = "postgres")]
pub(super) async fn open_postgres(url: &str, fewest_round_trips: bool) -> Result<Opened> {
    use oncely_postgres::PostgresStore;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let mut options: PgConnectOptions = url
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid PostgreSQL URL: {e}"))?;
    if !url.contains("lock_timeout") {
        options = options.options([(
            "lock_timeout",
            format!("{}ms", PostgresStore::DEFAULT_LOCK_TIMEOUT.as_millis()),
        )]);
    }
    // The same pool settings as `PostgresStore::connect`, without its first connection.
    let pool = PgPoolOptions::new()
        .max_connections(PostgresStore::DEFAULT_MAX_CONNECTIONS)
        .acquire_timeout(PostgresStore::DEFAULT_ACQUIRE_TIMEOUT)
        .connect_lazy_with(options);
    let store = PostgresStore::from_pool(pool.clone(), Arc::new(oncely_core::SystemClock))
        .with_claim_sent_with_begin(fewest_round_trips)
        .with_completion_sent_with_commit(fewest_round_trips);
    let backend = Backend::Postgres(store.clone());
    let migrate: MigrateFn<PostgresStore> = |s| Box::pin(async move { s.migrate().await });
    prepare_sql(
        "the PostgreSQL key store",
        store,
        migrate,
        Db::Postgres(pool),
        backend,
    )
    .await
}

/// Opens the MySQL / MariaDB key store and business database on a lazy pool (the business
/// tables on the store's pool, with its session settings); its tables are created at once if
/// the database answers, else in the background.
#[cfg(feature = "mysql")]
pub(super) async fn open_mysql(url: &str) -> Result<Opened> {
    let store = oncely_mysql::MySqlStore::connect_lazy(url)
        .map_err(|e| anyhow::anyhow!("invalid MySQL URL: {e}"))?;
    let db = Db::Mysql(store.pool().clone());
    let backend = Backend::Mysql(store.clone());
    let migrate: MigrateFn<oncely_mysql::MySqlStore> =
        |s| Box::pin(async move { s.migrate().await });
    prepare_sql("the MySQL key store", store, migrate, db, backend).await
}

/// Every operation is the real store's, once there is one.
impl oncely_core::StoreWrapper for Standby {
    type Inner = dyn Maintenance;
    fn inner(&self) -> Result<&dyn Maintenance, StoreError> {
        self.inner
            .get()
            .map(|store| &**store)
            .ok_or_else(|| StoreError::unavailable(NotYet))
    }
}
