//! [`SqliteStore`]: the type, connecting and migrating. Its operations: the owner's writes on
//! a connection (`within.rs`), the [`KeyStore`](oncely_core::KeyStore) operations that run them
//! on a pooled connection (`keystore.rs`), [`Maintenance`](oncely_core::Maintenance)
//! (`maintenance.rs`) and [`Operator`](oncely_core::Operator) (`operator.rs`).

use crate::error::{SqliteStoreError, map_sqlx};
use crate::row::decode_record;
use crate::sql;
use oncely_core::{ClaimOutcome, ClaimRequest, Clock, Decision, StoreError, SystemClock, decide};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// How long a statement waits for SQLite's write lock before failing with `SQLITE_BUSY`
/// (5 seconds; SQLite's `busy_timeout`). SQLite has one writer at a time: a claim waits here
/// while another claim, or a transactional handler holding its transaction
/// ([`SqliteStore::begin_tx`]), writes. When it
/// runs out the operation fails with [`StoreError::Unavailable`] and the layer answers `503`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an operation waits for a free pooled connection before failing with
/// [`StoreError::Unavailable`] (10 seconds).
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pool size [`SqliteStore::connect`] opens (8 connections).
///
/// Why 8 on a small (2-core) machine: the connections mostly wait, not compute. SQLite admits
/// one writer at a time; in WAL mode readers (replays, `409` answers, the completer's list) go on
/// in parallel with it, and a transactional handler keeps its connection for the whole
/// handler. A few spare connections keep those reads and heartbeats from queueing behind a slow
/// phase; more would only add threads (sqlx runs one worker thread per SQLite connection) that
/// contend for the same write lock.
pub const MAX_CONNECTIONS: u32 = 8;

/// The table sqlx records this crate's applied migrations in. Separate from sqlx's default
/// `_sqlx_migrations`, so that an application running its own sqlx migrations on the same
/// database file neither sees ours as "missing" nor collides with our version numbers.
const MIGRATIONS_TABLE: &str = "_oncely_sqlite_migrations";

/// Whether an error is SQLite's `SQLITE_BUSY` or `SQLITE_LOCKED` (any extended code).
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

/// How many times [`SqliteStore::connect`] tries to open a fresh file that other processes are
/// opening at the same moment.
const OPEN_ATTEMPTS: u32 = 5;

/// How many times [`SqliteStore::migrate`] retries when several processes (or pools) migrate a
/// fresh file at the same moment and one of them loses the race.
const MIGRATE_ATTEMPTS: u32 = 5;

/// The SQLite [`KeyStore`](oncely_core::KeyStore): Oncely's embedded default.
///
/// One table, `oncely_idempotency_keys`, with `PRIMARY KEY (scope, key)`; its schema ships in the
/// crate's `migrations/` and is applied by [`SqliteStore::migrate`] (which
/// [`SqliteStore::connect`] runs for you).
///
/// # How each operation is made atomic
///
/// - **claim**: first a plain read; if [`decide`] answers without writing (in flight, replay,
///   mismatch) that answer is returned: it is a consistent snapshot and writes nothing. Otherwise
///   one `BEGIN IMMEDIATE` transaction (it takes SQLite's write lock first, so nothing can
///   interleave) runs `INSERT ... ON CONFLICT (scope, key) DO NOTHING`: one row inserted means
///   the primary key granted this caller the key ([`ClaimKind::New`](oncely_core::ClaimKind::New), token 1). Zero rows means
///   the record exists: it is read again and [`decide`] runs on it (comparing fingerprints on
///   this path too; docs/DESIGN.md, "Validation skipped on one path"); a granted claim is one
///   `UPDATE ... WHERE scope AND key AND token = <the token read>`. Losing the insert race is
///   never an error (docs/DESIGN.md, "Unique violation surfaced as 500").
/// - **renew, checkpoint, complete, release**: one conditional `UPDATE ... WHERE scope AND key
///   AND token = ? AND state = 'in_flight'`; zero rows is [`StoreError::Fenced`].
/// - **reap**: one `DELETE ... WHERE rowid IN (SELECT ... ORDER BY expires_at LIMIT batch)`
///   per call, so the write lock is held for one bounded batch at a time.
///
/// Every "now" comes from the store's [`Clock`] (default [`SystemClock`]), never from SQLite's
/// own time functions, and is stored as integer epoch milliseconds.
///
/// # Durability
///
/// [`SqliteStore::connect`] opens the file in WAL mode with `synchronous = NORMAL`. In WAL mode
/// that is safe against a crash of the *process* (a committed claim or response survives a
/// `SIGKILL`); a power loss or OS crash can lose the last transactions before a checkpoint, never
/// corrupt the file. Use `synchronous = FULL` through [`SqliteStore::from_pool`] if a machine
/// crash must not lose a committed record.
///
/// # Errors
///
/// `SQLITE_BUSY` after [`BUSY_TIMEOUT`], a pool timeout after [`ACQUIRE_TIMEOUT`], I/O errors
/// and a closed pool are [`StoreError::Unavailable`]; a row that does not decode is
/// [`StoreError::Corrupt`]. Nothing panics on stored data.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    pub(crate) clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("filename", &self.pool.connect_options().get_filename())
            .field("pool_size", &self.pool.size())
            .finish_non_exhaustive()
    }
}

/// Parses a store URL or path into connect options with the store's settings: WAL journal,
/// `synchronous = NORMAL`, a [`BUSY_TIMEOUT`] busy timeout, and the file created if missing
/// (unless the URL sets its own `mode=`).
///
/// Accepted forms: `sqlite://path/to/file.db` (with optional `?mode=rwc` and sqlx's other URL
/// parameters), `sqlite:path`, `sqlite::memory:` (a private in-memory database), or a plain
/// filesystem path such as `data/oncely.db` (taken verbatim, `?` and all).
///
/// # Errors
///
/// [`StoreError::Unavailable`] wrapping [`SqliteStoreError::InvalidUrl`] when sqlx rejects a
/// `sqlite:` URL.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions, StoreError> {
    let options = if url.starts_with("sqlite:") {
        SqliteConnectOptions::from_str(url).map_err(|source| {
            StoreError::unavailable(SqliteStoreError::InvalidUrl {
                url: url.to_owned(),
                source,
            })
        })?
    } else {
        SqliteConnectOptions::new().filename(url)
    };
    let options = if url.contains("mode=") {
        options
    } else {
        options.create_if_missing(true)
    };
    Ok(options
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT))
}

/// Whether a URL names an in-memory database (which lives only while a connection is open).
fn is_in_memory(url: &str) -> bool {
    url.starts_with("sqlite:") && (url.contains(":memory:") || url.contains("mode=memory"))
}

impl SqliteStore {
    /// Opens (creating it if missing) the database at `url`, runs the crate's migrations, and
    /// uses the system clock.
    ///
    /// `url` is any form [`connect_options`] accepts: `sqlite://oncely.db?mode=rwc`,
    /// `sqlite::memory:`, or a plain path. The pool holds up to [`MAX_CONNECTIONS`] connections
    /// and waits up to [`ACQUIRE_TIMEOUT`] for one; each connection waits up to
    /// [`BUSY_TIMEOUT`] for the write lock. An in-memory database keeps one connection open for
    /// the store's lifetime (the data vanishes with the last connection) and shares its cache
    /// between the pool's connections.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid, the file cannot be opened or created,
    /// or the migrations fail.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = connect_options(url)?;
        let memory = is_in_memory(url);
        let pool_options = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .min_connections(u32::from(memory))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // No ping on every acquire (sqlx's default): a connection to a file in this
            // process cannot be cut off the way a network connection can, and the ping is a hop
            // to the connection's worker thread and back on every transaction
            // (docs/performance-history-2026-12.md, "round 2").
            .test_before_acquire(false)
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(600))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(1800))
            });
        // The first connection to a fresh file switches it to WAL, which needs an exclusive
        // lock that SQLite's busy timeout does not wait for: when several processes open a new
        // file at once, the losers get SQLITE_BUSY at once. Retry those (a later attempt finds
        // the file already in WAL mode, which needs no such lock).
        let mut attempt = 1;
        let pool = loop {
            match pool_options.clone().connect_with(options.clone()).await {
                Ok(pool) => break pool,
                Err(e) if attempt < OPEN_ATTEMPTS && is_busy(&e) => {
                    tracing::debug!(error = %e, attempt, "oncely-sqlite: opening raced, retrying");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => return Err(map_sqlx(e)),
            }
        };
        let store = Self::from_pool(pool, Arc::new(SystemClock));
        store.migrate().await?;
        Ok(store)
    }

    /// Wraps an existing pool (for an application that configures its own, e.g. with
    /// `synchronous = FULL`). Does **not** run migrations: call [`SqliteStore::migrate`].
    ///
    /// The pool's connections should set a busy timeout (a zero timeout turns every write
    /// contention into [`StoreError::Unavailable`]) and, for concurrent readers, WAL mode; see
    /// [`connect_options`].
    pub fn from_pool(pool: SqlitePool, clock: Arc<dyn Clock>) -> Self {
        Self { pool, clock }
    }

    /// Replaces the clock every "now" is read from (tests pass a
    /// [`ManualClock`](oncely_core::ManualClock)).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The connection pool, for the application's own business tables.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The clock the store reads "now" from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs the crate's migrations (the `oncely_idempotency_keys` table and its indexes).
    /// Idempotent; safe to call from several processes at once on a fresh file (a process that
    /// loses the race retries and then finds the migration applied).
    ///
    /// Applied migrations are tracked in their own table, `_oncely_sqlite_migrations`, so the
    /// application's own sqlx migrations (in `_sqlx_migrations`) are unaffected.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the migrations cannot be applied.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut migrator = sqlx::migrate!();
        migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
        let mut attempt = 1;
        loop {
            match migrator.run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < MIGRATE_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "oncely-sqlite: migration raced, retrying");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => return Err(StoreError::unavailable(e)),
            }
        }
    }

    /// Answers from a plain read when [`decide`] needs no write; `None` when it would claim.
    pub(crate) async fn answer_from_snapshot(
        &self,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let row = sqlx::query(sql::SELECT_ONE)
            .bind(req.id.scope.as_str())
            .bind(req.id.key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let existing = decode_record(&row)?;
        match decide(Some(&existing), req, self.clock.now_millis()) {
            Decision::Answer(answer) => Ok(Some(answer)),
            Decision::Claim { .. } => Ok(None),
        }
    }

    pub(crate) async fn conn(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>, StoreError> {
        self.acquire_clean().await
    }
}
