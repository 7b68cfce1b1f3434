//! [`MySqlStore`]: the type, its pools and settings, connecting and migrating. Its operations:
//! the claim and the owner's writes on a connection (`within.rs`), the
//! [`KeyStore`](oncely_core::KeyStore) operations that run them on a pooled connection
//! (`keystore.rs`), [`Maintenance`](oncely_core::Maintenance) (`maintenance.rs`) and
//! [`Operator`](oncely_core::Operator) (`operator.rs`).

use crate::error::{MySqlStoreError, map};
use crate::sql;
use oncely_core::{Clock, StoreError, SystemClock};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Executor, MySql};
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use oncely_core::KeyStore;

/// A [`KeyStore`] on MySQL 8 or MariaDB 10.6+ (InnoDB), shared by any number of server
/// instances.
///
/// Cloning is cheap and shares the pools and the clock.
///
/// # How a claim is arbitrated
///
/// One transaction ([`MySqlStore::begin_tx`], then [`MySqlStore::claim_in`]; the pool-level
/// [`KeyStore::claim`] commits it, a transactional handler's claim rides in it):
///
/// 1. `INSERT ... ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token)` on the primary key
///    `(scope, key)`. Exactly one of any number of concurrent inserts inserts the row (token 1,
///    [`ClaimKind::New`](oncely_core::ClaimKind::New)), in one statement; the others find it,
///    which changes nothing and is never an error (see "Unique violation surfaced as 500" in
///    docs/DESIGN.md). A duplicate waits while the row's inserting transaction is open, and
///    finds the row as that transaction left it: committed, or gone after a rollback (then it
///    inserts it itself). No `RETURNING` (MySQL has none): the statement's last insert id tells
///    an insert (0) from a duplicate (the existing token).
/// 2. A duplicate holds the row's exclusive lock from its insert: it reads the record with a
///    locking read (the latest committed version) and applies [`decide`](oncely_core::decide).
///    An answer (in flight, replay, mismatch) writes nothing. A claim (takeover, after the
///    replay window, over a released record) is one `UPDATE` guarded by the token that was
///    read. Never check-then-insert: the database decides every race.
///
/// Every other write (`renew`, `checkpoint`, `complete`, `release`) is one `UPDATE ... WHERE
/// scope, key AND token = ? AND state = 'in_flight'`; 0 rows is [`StoreError::Fenced`]. The
/// pool-level operation is the in-transaction one (`renew_in`, `checkpoint_in`, ...) on a
/// pooled connection: one statement in autocommit, which is its own transaction.
///
/// # Isolation, locks, deadlocks and lock waits
///
/// The transactions run at the session's isolation level, InnoDB's `REPEATABLE READ` unless
/// configured otherwise; the store reads what it decides on with locking reads, which see the
/// latest committed version at every level. The claim's insert takes, on a duplicate primary
/// key, an exclusive record lock and no gap lock. Gap and next-key locks still come in where
/// `REPEATABLE READ` takes them: when a transaction that inserted a key rolls back while others
/// wait for it, the waiters' locks become gap locks and their inserts can deadlock each other.
/// InnoDB then rolls one transaction back whole (error 1213), and the store runs that
/// transaction again, up to 8 times with a 1 to 100 millisecond jittered backoff, so a lost
/// deadlock never reaches the caller as a `500`.
///
/// A claim waits for a row lock only while another transaction holds the key's row: a
/// transactional handler's first phase (its uncommitted claim), or a phase's closing write for
/// the moment before its commit. A later phase of `oncely-sqlx` writes the record only in its
/// closing statement, so the layer's heartbeat never waits for a phase. Every wait is bounded
/// by `innodb_lock_wait_timeout`, which each claim and phase transaction sets to
/// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT) (4 seconds) in the message that begins it, and
/// [`connect`](Self::connect) on every connection (so a statement outside such a transaction is
/// bounded too): never the server's 50-second default. A claim past it is answered in flight
/// (`409`); another operation fails with [`StoreError::Unavailable`] (`503`, retryable). The
/// claim of [`MySqlStore::claim_tx`] (a transactional handler's, and the pool-level
/// [`KeyStore::claim`]) waits for a held key in tries instead: on MariaDB each try's insert
/// does not wait at all, and gives its connection back between tries, for at most
/// [`CLAIM_WAIT`](Self::CLAIM_WAIT) (1 second) in all (docs/DESIGN.md, "Duplicates while the
/// first transaction is open"); on MySQL 8 a try waits up to the 4 seconds.
///
/// # Clocks
///
/// Times (lease expiries, completion times, retention) are computed from the store's
/// [`Clock`] (default [`SystemClock`]), i.e. the *application server's* clock, not the
/// database's `NOW()`, as on PostgreSQL. An instance whose clock is skewed by `s` grants
/// leases that end `s` early or late in the other instances' eyes: keep instance clocks in sync
/// (NTP) and leases far above the skew. Fencing tokens keep even a premature takeover safe.
///
/// # Example
///
/// ```no_run
/// # async fn example() -> Result<(), oncely_core::StoreError> {
/// use oncely_mysql::MySqlStore;
/// let store = MySqlStore::connect("mysql://app@db.internal:3306/app").await?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// The pool lease renewals run on ([`MySqlStore::LEASE_POOL_CONNECTIONS`] connections, from
    /// the main pool's connect options, opened at the first renewal).
    lease_pool: Arc<std::sync::OnceLock<MySqlPool>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

/// The pool options every pool of the store starts from: `size` connections, each given the
/// store's session settings (`sql::SESSION_SETTINGS`: the 4-second lock-wait bound and a strict
/// `sql_mode`) when it connects.
fn pool_options(size: u32) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(MySqlStore::DEFAULT_ACQUIRE_TIMEOUT)
        .after_connect(|conn, _meta| {
            Box::pin(async move { conn.execute(sql::SESSION_SETTINGS).await.map(drop) })
        })
}

impl MySqlStore {
    /// The pool size [`MySqlStore::connect`] uses: 10 connections.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;
    /// How long [`MySqlStore::connect`]'s pool waits for a free connection before the
    /// operation fails with [`StoreError::Unavailable`]: 5 seconds.
    pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
    /// How many connections lease renewals ([`KeyStore::renew`], the layer's heartbeat) have to
    /// themselves: 2, in a pool of their own, made from the main pool's connect options and
    /// opened at the first renewal, so that a pool that handlers' transactions hold entirely
    /// cannot make a live request lose its lease. Count them when you size `max_connections`.
    pub const LEASE_POOL_CONNECTIONS: u32 = 2;
    /// The most insert-decide-write rounds one claim makes before giving up with
    /// [`StoreError::Unavailable`]: 32. The claim holds the row's lock from its insert on, so a
    /// second round is only needed when the row vanished in between.
    pub const MAX_CLAIM_ROUNDS: u32 = 32;
    /// The longest scope the store keeps, in bytes of UTF-8: 1024 (the `scope` column is
    /// `VARBINARY(1024)`, so that the primary key stays inside InnoDB's 3072-byte index key
    /// limit). A longer one is refused ([`MySqlStoreError::ScopeTooLong`]), never cut short.
    pub const MAX_SCOPE_BYTES: usize = 1024;
    /// The most rows one reaper call deletes, whatever batch it is asked for: 10,000 (each row
    /// is two placeholders of the batch's `DELETE`, and a prepared statement takes at most
    /// 65,535).
    pub const MAX_REAP_BATCH: usize = 10_000;

    /// Connects a pool to `url` (`mysql://user:password@host:3306/db`; sqlx's other URL
    /// parameters, such as `ssl-mode`, apply) with
    /// [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS) and
    /// [`DEFAULT_ACQUIRE_TIMEOUT`](Self::DEFAULT_ACQUIRE_TIMEOUT), on the [`SystemClock`]. sqlx
    /// sets the connection's character set to `utf8mb4`; every connection then also runs with
    /// `innodb_lock_wait_timeout` at [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT) (4 seconds)
    /// and a strict `sql_mode` (`STRICT_TRANS_TABLES` added unless a strict mode is already
    /// set), for the application's statements on [`pool`](Self::pool) too. Opens one connection
    /// at once to fail fast. Does not run the migrations: call [`MySqlStore::migrate`].
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid (wrapping
    /// [`MySqlStoreError::InvalidUrl`]) or the database cannot be reached (wrapping the
    /// [`sqlx::Error`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options: MySqlConnectOptions = url.parse().map_err(MySqlStoreError::InvalidUrl)?;
        let pool = pool_options(Self::DEFAULT_MAX_CONNECTIONS)
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(Self::from_pool(pool, Arc::new(SystemClock)))
    }

    /// [`connect`](Self::connect) without its first connection: the pool (the same size,
    /// timeouts and session settings) connects at its first use, so a server can start while
    /// the database is down and answer `503` until it is up.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] wrapping [`MySqlStoreError::InvalidUrl`] when the URL is
    /// invalid.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        let options: MySqlConnectOptions = url.parse().map_err(MySqlStoreError::InvalidUrl)?;
        let pool = pool_options(Self::DEFAULT_MAX_CONNECTIONS).connect_lazy_with(options);
        Ok(Self::from_pool(pool, Arc::new(SystemClock)))
    }

    /// A store over an existing pool (for instance the application's own) and clock.
    ///
    /// Claim and phase transactions bound their lock waits themselves (they begin with
    /// `SET SESSION innodb_lock_wait_timeout = 4`, which then stays for the session). Give the
    /// pool's connections a strict `sql_mode` (the default of MySQL 5.7+ and MariaDB 10.2.4+)
    /// for the application's own tables; the store's own columns are safe either way (no
    /// value of the store's can be cut short: the scope's length is checked, every other
    /// column holds what it is given).
    pub fn from_pool(pool: MySqlPool, clock: Arc<dyn Clock>) -> Self {
        Self {
            pool,
            lease_pool: Arc::default(),
            clock,
        }
    }

    /// Replaces the clock (the default is [`SystemClock`]).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The connection pool, for the application's own business tables.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The pool of [`LEASE_POOL_CONNECTIONS`](Self::LEASE_POOL_CONNECTIONS) connections that
    /// lease renewals use, made at the first call (inside the runtime, where sqlx's pool starts
    /// its maintenance task).
    pub(crate) fn lease_pool(&self) -> &MySqlPool {
        self.lease_pool.get_or_init(|| {
            pool_options(Self::LEASE_POOL_CONNECTIONS)
                .connect_lazy_with((*self.pool.connect_options()).clone())
        })
    }

    /// How long [`MySqlStore::migrate`] waits for another process's migration run to end: 60
    /// seconds.
    pub const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(60);

    /// Runs the crate's migrations (the `oncely_idempotency_keys` table and its indexes).
    /// Idempotent, and safe when several processes run it at once against one database: the
    /// run holds a named lock (`GET_LOCK`, keyed by the database's name) on its connection, so
    /// the runs take turns (each waiting up to [`MIGRATE_LOCK_WAIT`](Self::MIGRATE_LOCK_WAIT))
    /// and the later ones find nothing to do. The lock is the store's own, not sqlx's
    /// migrator's: that one asks `GET_LOCK` to wait with a timeout of -1, which MySQL reads as
    /// "for ever" and MariaDB as "not at all" (it answers NULL at once), so on MariaDB two runs
    /// would apply the same migration together. The history is kept in the table
    /// `_oncely_migrations`, apart from the application's own sqlx migrations. DDL commits by
    /// itself on MySQL and MariaDB, so a migration is not one transaction: each is written to
    /// be run again after a failure part-way (`IF NOT EXISTS`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] wrapping [`MySqlStoreError::Migrate`] when the database
    /// cannot be reached or a migration fails, or [`MySqlStoreError::MigrateLock`] when
    /// another run held the lock for longer than the wait.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let got: Option<i64> = sqlx::query_scalar(sql::MIGRATE_LOCK)
            .bind(Self::MIGRATE_LOCK_WAIT.as_secs())
            .fetch_one(&mut *conn)
            .await
            .map_err(map)?;
        if got != Some(1) {
            return Err(MySqlStoreError::MigrateLock.into());
        }
        let mut migrator = sqlx::migrate!();
        migrator.dangerous_set_table_name(sql::MIGRATIONS_TABLE);
        migrator.set_locking(false);
        // `run_direct`, not `run(&mut *conn)`: the same, without the `Acquire` bound whose
        // lifetimes make the future not `Send` (sqlx keeps it public for that reason).
        let ran = migrator.run_direct(None, &mut *conn, false).await;
        // A named lock belongs to the session: a pooled connection must not keep it.
        if sqlx::query(sql::MIGRATE_UNLOCK)
            .execute(&mut *conn)
            .await
            .is_err()
        {
            let _ = conn.detach().close().await;
        }
        ran.map_err(|e| MySqlStoreError::Migrate(e).into())
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<MySql>, StoreError> {
        self.pool.acquire().await.map_err(map)
    }
}
