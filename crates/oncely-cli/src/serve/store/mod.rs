//! Opening the key store named by `--store`, and the business database beside it.
//!
//! | `--store` | key store | business tables | phase mechanism ([`Backend`]) |
//! |---|---|---|---|
//! | a file path or `sqlite://PATH` (the default) | SQLite | the same database | [`Backend::Sqlite`] |
//! | `postgres://…` | PostgreSQL | the same database | [`Backend::Postgres`] |
//! | `mysql://…` | MySQL 8 / MariaDB 10.6+ | the same database | [`Backend::Mysql`] |
//! | `memory`, `redis://…`, `redis+cluster://…` | memory / Redis | an embedded SQLite file | [`Backend::Split`] |
//!
//! PostgreSQL, MySQL and Redis may be down when the server starts: [`standby`] serves `503`
//! until they answer.

pub mod standby;

use crate::serve::db::Db;
use anyhow::{Context as _, Result, bail};
use oncely_core::{Maintenance, MemoryStore};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Where the key store lives, from `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory`: in this process only.
    Memory,
    /// `sqlite://path`, or a plain file path: the embedded default.
    Sqlite(String),
    /// `postgres://…`
    Postgres(String),
    /// `mysql://user:password@host:3306/db`: MySQL 8 or MariaDB 10.6+ (see
    /// `oncely_mysql::MySqlStore::connect` for the URL's options, such as `ssl-mode`).
    Mysql(String),
    /// `redis://…`, `rediss://…`, or a Redis Cluster: `redis+cluster://host:port,host:port…`
    /// (`rediss+cluster://` for TLS); see `oncely_redis::RedisStore::connect_with` for the
    /// query options (`namespace`, `accept_volatile`, `wait_replicas`, `wait_timeout_ms`).
    Redis(String),
}

impl StoreUrl {
    /// The store's kind, as the `store` label of the metrics: `memory`, `sqlite`, `postgres`,
    /// `mysql` or `redis`.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
            Self::Mysql(_) => "mysql",
            Self::Redis(_) => "redis",
        }
    }
}

impl FromStr for StoreUrl {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(if s == "memory" {
            Self::Memory
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Self::Postgres(s.to_owned())
        } else if s.starts_with("mysql://") {
            Self::Mysql(s.to_owned())
        } else if [
            "redis://",
            "rediss://",
            "redis+cluster://",
            "rediss+cluster://",
        ]
        .iter()
        .any(|p| s.starts_with(p))
        {
            Self::Redis(s.to_owned())
        } else if let Some(path) = s.strip_prefix("sqlite://") {
            Self::Sqlite(path.to_owned())
        } else if s.contains("://") {
            bail!(
                "unknown store {s:?}: expected memory, a file path, sqlite://PATH, postgres://…, mysql://…, redis://… or redis+cluster://…"
            )
        } else {
            Self::Sqlite(s.to_owned())
        })
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Sqlite(p) => write!(f, "sqlite://{p}"),
            Self::Postgres(u) | Self::Mysql(u) | Self::Redis(u) => f.write_str(u),
        }
    }
}

/// The store the handlers' transactions run on ([`oncely_sqlx::SqlStore`]).
#[derive(Clone)]
pub enum Backend {
    /// The SQLite key store's database holds the business tables: one commit per phase.
    Sqlite(oncely_sqlite::SqliteStore),
    /// The PostgreSQL key store's database holds the business tables: one commit per phase.
    #[cfg(feature = "postgres")]
    Postgres(oncely_postgres::PostgresStore),
    /// The MySQL / MariaDB key store's database holds the business tables: one commit per
    /// phase.
    #[cfg(feature = "mysql")]
    Mysql(oncely_mysql::MySqlStore),
    /// Keys in the memory or Redis store, business data in an embedded SQLite database.
    Split(oncely_sqlx::Split<sqlx::Sqlite>),
}

/// Runs `$body` with the backend's store matched by the pattern `$s` and the type `$S` bound to
/// that store's type (an [`oncely_sqlx::SqlStore`]).
macro_rules! with_backend {
    ($backend:expr, $S:ident, $s:pat => $body:expr) => {
        match $backend {
            $crate::serve::store::Backend::Sqlite($s) => {
                type $S = oncely_sqlite::SqliteStore;
                $body
            }
            #[cfg(feature = "postgres")]
            $crate::serve::store::Backend::Postgres($s) => {
                type $S = oncely_postgres::PostgresStore;
                $body
            }
            #[cfg(feature = "mysql")]
            $crate::serve::store::Backend::Mysql($s) => {
                type $S = oncely_mysql::MySqlStore;
                $body
            }
            $crate::serve::store::Backend::Split($s) => {
                type $S = oncely_sqlx::Split<sqlx::Sqlite>;
                $body
            }
        }
    };
}
pub(crate) use with_backend;

impl Backend {
    /// The clock the key store decides by: the SQL stores' own; for a split backend the system
    /// clock (the memory store's; Redis decides on its server's `TIME`).
    pub fn clock(&self) -> Arc<dyn oncely_core::Clock> {
        match self {
            Self::Sqlite(s) => Arc::clone(s.clock()),
            #[cfg(feature = "postgres")]
            Self::Postgres(s) => Arc::clone(s.clock()),
            #[cfg(feature = "mysql")]
            Self::Mysql(s) => Arc::clone(s.clock()),
            Self::Split(_) => Arc::new(oncely_core::SystemClock),
        }
    }
}

/// The opened key store, its phase mechanism and the business database.
pub struct Opened {
    /// The key store.
    pub store: Arc<dyn Maintenance>,
    /// The phase mechanism.
    pub backend: Backend,
    /// The business database.
    pub db: Db,
}

fn sqlite_url(path: &str) -> String {
    format!("sqlite://{path}?mode=rwc")
}

/// Keys in `store` (memory, Redis), business data in the embedded SQLite `db`, with the split
/// store's progress ledger in it.
async fn split(store: Arc<dyn Maintenance>, db: Db) -> Result<Opened> {
    #[allow(clippy::infallible_destructuring_match)]
    let pool = match &db {
        Db::Sqlite(pool) => pool.clone(),
        #[cfg(feature = "postgres")]
        Db::Postgres(_) => unreachable!("the embedded business database is SQLite"),
        #[cfg(feature = "mysql")]
        Db::Mysql(_) => unreachable!("the embedded business database is SQLite"),
    };
    let split = oncely_sqlx::Split::connect(store.clone(), pool)
        .await
        .context("create the split store's progress ledger in the business database")?;
    Ok(Opened {
        backend: Backend::Split(split),
        store,
        db,
    })
}
/// Opens a key store (running its migrations) and the business database next to it.
/// `business_path` is where the embedded business database goes for the memory and Redis stores;
/// `pg_fewest_round_trips` sends a PostgreSQL store's claims with their `BEGIN` and completions
/// with their `COMMIT` (`PostgresStore::with_claim_sent_with_begin`,
/// `PostgresStore::with_completion_sent_with_commit`).
pub async fn open(
    url: &StoreUrl,
    business_path: Option<&str>,
    pg_fewest_round_trips: bool,
) -> Result<Opened> {
    async fn plain_db(path: Option<&str>) -> Result<Db> {
        let opts = match path {
            Some(p) => sqlx::sqlite::SqliteConnectOptions::from_str(&sqlite_url(p))?,
            None => sqlx::sqlite::SqliteConnectOptions::from_str("sqlite::memory:")?,
        }
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
        // An in-memory database exists once per connection: keep exactly one.
        let max = if path.is_some() { 4 } else { 1 };
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(opts)
            .await
            .context("open the embedded business database")?;
        Ok(Db::Sqlite(pool))
    }
    let opened = match url {
        StoreUrl::Memory => {
            split(Arc::new(MemoryStore::new()), plain_db(business_path).await?).await?
        }
        StoreUrl::Sqlite(path) => {
            let store = oncely_sqlite::SqliteStore::connect(&sqlite_url(path))
                .await
                .with_context(|| format!("open the SQLite key store at {path}"))?;
            let db = Db::Sqlite(store.pool().clone());
            Opened {
                store: Arc::new(store.clone()),
                backend: Backend::Sqlite(store),
                db,
            }
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => bail!("this oncely was built without the postgres feature"),
        // PostgreSQL, MySQL and Redis may be down at start: the server starts anyway and answers 503
        // until they answer (standby.rs); the business tables come with the store's.
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(u) => {
            return standby::open_postgres(u, pg_fewest_round_trips).await;
        }
        #[cfg(not(feature = "mysql"))]
        StoreUrl::Mysql(_) => bail!("this oncely was built without the mysql feature"),
        #[cfg(feature = "mysql")]
        StoreUrl::Mysql(u) => return standby::open_mysql(u).await,
        StoreUrl::Redis(u) => {
            let path = business_path.map_or_else(|| default_business_path(u), str::to_owned);
            let db = plain_db(Some(&path)).await?;
            db.migrate().await.context("create the business tables")?;
            return standby::open_redis(u, db).await;
        }
    };
    opened
        .db
        .migrate()
        .await
        .context("create the business tables")?;
    Ok(opened)
}

/// Where the business data of a Redis-backed server goes without `--business-db`: a file in
/// the system's temporary directory named after the Redis URL (so a restart finds its payments
/// again, and nothing is written into the working directory).
fn default_business_path(redis_url: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(redis_url.as_bytes());
    std::env::temp_dir()
        .join(format!(
            "oncely-business-{}.sqlite3",
            hex::encode(&digest[..8])
        ))
        .to_string_lossy()
        .into_owned()
}

/// A key store opened alone, by its own type (see [`open_existing`]).
pub enum Existing {
    /// SQLite.
    Sqlite(oncely_sqlite::SqliteStore),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(oncely_postgres::PostgresStore),
    /// MySQL / MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(oncely_mysql::MySqlStore),
    /// Redis or Redis Cluster.
    Redis(oncely_redis::RedisStore),
}

/// Opens an existing key store alone (for the jobs and `oncely records`): no business tables
/// are created, and a SQLite path that does not exist is an error rather than a new empty
/// store.
pub async fn open_existing(url: &StoreUrl) -> Result<Existing> {
    Ok(match url {
        StoreUrl::Memory => {
            bail!(
                "the memory store lives inside one server process; run the job there (oncely serve runs the reaper and the completer in-process)"
            )
        }
        StoreUrl::Sqlite(path) => {
            if !std::path::Path::new(path).exists() {
                bail!("no key store at {path}: the file does not exist (check the path)");
            }
            Existing::Sqlite(
                oncely_sqlite::SqliteStore::connect(&sqlite_url(path))
                    .await
                    .with_context(|| format!("open the SQLite key store at {path}"))?,
            )
        }
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => bail!("this oncely was built without the postgres feature"),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(u) => {
            let store = oncely_postgres::PostgresStore::connect(u)
                .await
                .context("connect to the PostgreSQL key store")?;
            store
                .migrate()
                .await
                .context("check the key store's tables")?;
            Existing::Postgres(store)
        }
        #[cfg(not(feature = "mysql"))]
        StoreUrl::Mysql(_) => bail!("this oncely was built without the mysql feature"),
        #[cfg(feature = "mysql")]
        StoreUrl::Mysql(u) => {
            let store = oncely_mysql::MySqlStore::connect(u)
                .await
                .context("connect to the MySQL key store")?;
            store
                .migrate()
                .await
                .context("check the key store's tables")?;
            Existing::Mysql(store)
        }
        StoreUrl::Redis(u) => Existing::Redis(
            oncely_redis::RedisStore::connect(u)
                .await
                .context("connect to the Redis key store")?,
        ),
    })
}

/// Opens an existing key store alone, for the jobs (see [`open_existing`]).
pub async fn open_store(url: &StoreUrl) -> Result<Arc<dyn Maintenance>> {
    Ok(match open_existing(url).await? {
        Existing::Sqlite(s) => Arc::new(s),
        #[cfg(feature = "postgres")]
        Existing::Postgres(s) => Arc::new(s),
        #[cfg(feature = "mysql")]
        Existing::Mysql(s) => Arc::new(s),
        Existing::Redis(s) => Arc::new(s),
    })
}
