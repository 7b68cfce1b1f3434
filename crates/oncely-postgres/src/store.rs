//! [`PostgresStore`]: the type, its pools and settings. Its operations: the claim
//! (`claim.rs`) and the owner's writes (`within.rs`) on a connection, the
//! [`KeyStore`](oncely_core::KeyStore) operations that run them on a pooled connection
//! (`keystore.rs`), [`Maintenance`](oncely_core::Maintenance) (`maintenance.rs`) and
//! [`Operator`](oncely_core::Operator) (`operator.rs`).

use crate::error::{PostgresStoreError, map};
use crate::sql;
use oncely_core::{Clock, StoreError, SystemClock};
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;

/// A [`KeyStore`](oncely_core::KeyStore) on PostgreSQL (or a Postgres-compatible database),
/// shared by any number of server instances.
///
/// Cloning is cheap and shares the pool and the clock.
///
/// # How a claim is arbitrated
///
/// 1. Read the record with a plain (MVCC) `SELECT`; this never waits for a lock.
/// 2. No record: `INSERT ... ON CONFLICT (scope, key) DO NOTHING RETURNING token`. The primary
///    key lets exactly one concurrent insert win (token 1, [`ClaimKind::New`](oncely_core::ClaimKind::New)); a loser gets no
///    row, which is the normal "record exists" path (never an error: docs/DESIGN.md, "Unique violation surfaced as 500"), and goes back
///    to step 1 to read the winner.
/// 3. A record: [`decide`](oncely_core::decide) on it. An answer (in flight, replay, mismatch) writes nothing. A
///    claim (takeover, after the replay window, over a released record) is one conditional
///    `UPDATE` guarded by the token *and* the state, lease, completion time and recovery point
///    that were read; 0 rows means another write got there first, and the claim goes back to
///    step 1. Never check-then-insert: the database decides every race.
///
/// The loop is bounded ([`PostgresStore::MAX_CLAIM_ROUNDS`]); each extra round means another
/// request changed the record in between, so in practice a claim takes at most two.
///
/// Every other write (`renew`, `checkpoint`, `complete`, `release`) is one `UPDATE ... WHERE
/// scope, key AND token = $token AND state = 'in_flight'`; 0 rows is [`StoreError::Fenced`].
///
/// # Isolation, retries and lock waits
///
/// The store's statements are single-statement transactions. Under PostgreSQL's default
/// `READ COMMITTED` they raise no serialization failures; under `SERIALIZABLE` or `REPEATABLE
/// READ` (a server default, or a distributed database that is serializable by default)
/// concurrent claims of one key can fail with `40001` (and any workload with `40P01`): the
/// store retries those statements itself, up to 8 times with a 1 to 100 millisecond jittered
/// backoff, so they never reach the caller as a `500`.
///
/// A statement waits for a row lock only when it writes a row that another transaction is
/// writing: a claim of a key whose first request's transaction (the one that carries its
/// claim, [`PostgresStore::begin_tx`], then the `*_in` operations) is still open waits until
/// that transaction ends. A later phase of `oncely-sqlx` writes the record only in its closing
/// statement (the recovery point or the stored response, fenced by the token), so a heartbeat
/// `renew` never waits for a phase: a takeover that got in while the phase ran makes that
/// closing write match no row, and nothing of the phase commits. The wait is bounded by PostgreSQL's `lock_timeout`:
/// [`PostgresStore::connect`] sets it to [`PostgresStore::DEFAULT_LOCK_TIMEOUT`] (4 seconds) on
/// its connections; past it the operation fails with [`StoreError::Unavailable`] (`503`,
/// retryable). A store built with [`PostgresStore::from_pool`] inherits whatever the pool's
/// connect options say: set `lock_timeout` there (and declare it with
/// [`PostgresStore::with_pool_lock_timeout`]). Claim and phase transactions are bounded at
/// [`PostgresStore::TX_LOCK_TIMEOUT`] (4 seconds) either way: by the session's setting when the
/// store knows it (`connect` reads it back from the server, so a pooler that drops startup
/// options is noticed), else by a `SET LOCAL` sent with their `BEGIN`. The claim of a
/// transactional handler ([`PostgresStore::claim_tx`]) waits for a key another transaction holds in
/// tries of [`PostgresStore::CLAIM_TRY_LOCK_TIMEOUT`] (10 milliseconds) instead, holding no
/// connection between them, for at most [`PostgresStore::CLAIM_WAIT`] (1 second). Plain claims against a record in a phase do
/// not wait: they read the last committed version and answer "in flight" (docs/DESIGN.md, "Slow database behind a proxy").
///
/// # Clocks
///
/// Times (lease expiries, completion times, retention) are computed from the store's
/// [`Clock`] (default [`SystemClock`]), i.e. the *application server's* clock, not the
/// database's `now()`. That keeps one time source for the whole of Oncely (and lets tests run
/// leases and windows on a [`ManualClock`](oncely_core::ManualClock)). The cost: an instance
/// whose clock is skewed by `s` grants leases that end `s` early or late in the other
/// instances' eyes, and judges other instances' leases by `s` too. Keep instance clocks in
/// sync with NTP (typical skew: milliseconds, against leases of seconds); a lease shorter than
/// the worst skew would allow a premature takeover. Fencing tokens keep even a premature
/// takeover safe: the old owner's writes are rejected.
///
/// # Example
///
/// ```no_run
/// # async fn example() -> Result<(), oncely_core::StoreError> {
/// use oncely_postgres::PostgresStore;
/// let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The pool lease renewals run on ([`PostgresStore::LEASE_POOL_CONNECTIONS`] connections,
    /// from the main pool's connect options, opened at the first renewal).
    lease_pool: Arc<std::sync::OnceLock<PgPool>>,
    clock: Arc<dyn Clock>,
    /// Whether every connection of the pool runs with a `lock_timeout` of at most
    /// [`PostgresStore::TX_LOCK_TIMEOUT`], so a claim's transaction needs no `SET LOCAL`.
    pub(crate) pool_lock_timeout_bounded: bool,
    /// The `lock_timeout` of a phase's statements, in milliseconds: the session's when the
    /// store relies on it, else [`PostgresStore::TX_LOCK_TIMEOUT`].
    pub(crate) phase_lock_timeout_ms: u64,
    /// Whether a phase's final completion goes out in one simple-query message with its
    /// `COMMIT` (see [`PostgresStore::with_completion_sent_with_commit`]).
    completion_with_commit: bool,
    /// Whether a transactional handler's claim goes out with its `BEGIN` in one message (see
    /// [`PostgresStore::with_claim_sent_with_begin`]).
    claim_with_begin: bool,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// The `lock_timeout` [`PostgresStore::connect`] sets on its connections: 4 seconds, the
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT) of claim and phase transactions, so that
    /// these begin with a plain `BEGIN`.
    pub const DEFAULT_LOCK_TIMEOUT: Duration = Self::TX_LOCK_TIMEOUT;
    /// The pool size [`PostgresStore::connect`] uses: 10 connections.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;
    /// How long [`PostgresStore::connect`]'s pool waits for a free connection before the
    /// operation fails with [`StoreError::Unavailable`]: 5 seconds.
    pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
    /// How many connections lease renewals
    /// ([`KeyStore::renew`](oncely_core::KeyStore::renew), the layer's heartbeat) have to
    /// themselves: 2, in a pool of their own, made from the main pool's connect options and
    /// opened at the first renewal. A renewal never waits for a connection of the main pool,
    /// so a pool that handlers' long transactions hold entirely cannot make a live request
    /// lose its lease. Count them when you size the database's `max_connections`.
    pub const LEASE_POOL_CONNECTIONS: u32 = 2;
    /// The most read-decide-write rounds one claim makes before giving up with
    /// [`StoreError::Unavailable`]: 32.
    pub const MAX_CLAIM_ROUNDS: u32 = 32;
    /// How long a statement of a claim or phase transaction waits for a lock: 4 seconds, the
    /// session's `lock_timeout` on connections made by [`PostgresStore::connect`] (or declared
    /// with [`PostgresStore::with_pool_lock_timeout`]), else set with `SET LOCAL lock_timeout`
    /// in the same message as `BEGIN` (no round trip, but about 10 µs of server time). It is
    /// shorter than the layer's store timeout (5 seconds) on purpose: a duplicate waiting for the
    /// first request's transaction then always ends as `409 idempotency_request_in_flight`,
    /// never as a `503` store timeout.
    pub const TX_LOCK_TIMEOUT: Duration = Duration::from_secs(4);

    /// Connects a pool to `url` (`postgres://user@host:port/db`), with
    /// [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS),
    /// [`DEFAULT_ACQUIRE_TIMEOUT`](Self::DEFAULT_ACQUIRE_TIMEOUT) and `lock_timeout` set to
    /// [`DEFAULT_LOCK_TIMEOUT`](Self::DEFAULT_LOCK_TIMEOUT) (unless the URL already sets
    /// `lock_timeout`), on the [`SystemClock`]. Opens one connection at once to fail fast, and
    /// reads the `lock_timeout` the server applied to it: when that is at most
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT) (as it is unless the URL or a pooler in between
    /// changed it), claim and phase transactions begin with a plain `BEGIN` (see
    /// [`with_pool_lock_timeout`](Self::with_pool_lock_timeout)). Does not run the migrations:
    /// call [`PostgresStore::migrate`].
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid (wrapping
    /// [`PostgresStoreError::InvalidUrl`]) or the database cannot be reached (wrapping the
    /// [`sqlx::Error`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let mut options: PgConnectOptions = url.parse().map_err(PostgresStoreError::InvalidUrl)?;
        if !url.contains("lock_timeout") {
            options = options.options([(
                "lock_timeout",
                format!("{}ms", Self::DEFAULT_LOCK_TIMEOUT.as_millis()),
            )]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(Self::DEFAULT_MAX_CONNECTIONS)
            .acquire_timeout(Self::DEFAULT_ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        // The session's lock_timeout as the server sees it (a pooler in between may drop the
        // startup options): only a bound seen here lets transactions skip `SET LOCAL`.
        let seen: Option<(String,)> =
            sqlx::query_as("SELECT setting FROM pg_settings WHERE name = 'lock_timeout'")
                .fetch_optional(&pool)
                .await
                .map_err(StoreError::unavailable)?;
        let seen = seen.and_then(|(ms,)| ms.parse::<u64>().ok());
        let store = Self::from_pool(pool, Arc::new(SystemClock));
        Ok(match seen {
            Some(ms) => store.with_pool_lock_timeout(Duration::from_millis(ms)),
            None => store,
        })
    }

    /// A store over an existing pool (for instance the application's own) and clock. See the
    /// type docs for the `lock_timeout` to configure on the pool.
    pub fn from_pool(pool: PgPool, clock: Arc<dyn Clock>) -> Self {
        Self {
            pool,
            lease_pool: Arc::default(),
            clock,
            pool_lock_timeout_bounded: false,
            phase_lock_timeout_ms: duration_millis_u64(Self::TX_LOCK_TIMEOUT),
            completion_with_commit: false,
            claim_with_begin: false,
        }
    }

    /// Declares the `lock_timeout` that every connection of the pool runs with (set in its
    /// connect options, as [`connect`](Self::connect) sets
    /// [`DEFAULT_LOCK_TIMEOUT`](Self::DEFAULT_LOCK_TIMEOUT)). When it is at most
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT) (and not zero, which PostgreSQL reads as "no
    /// limit"), claim and phase transactions begin with a plain `BEGIN`; otherwise, and for a
    /// pool whose `lock_timeout` was not declared, they begin with
    /// `BEGIN; SET LOCAL lock_timeout = '4000ms'` in one message, which costs the database
    /// about 10 µs per transaction (measured with pgbench on this project's machine).
    ///
    /// Declare it only for a pool whose connections are really configured so: behind a
    /// connection pooler that drops startup options (PgBouncer's `ignore_startup_parameters`)
    /// the setting is not there, and a waiting duplicate would then wait until the layer's
    /// store timeout (`503`) instead of being answered in flight (`409`) after 4 seconds. And
    /// anything that changes `lock_timeout` for a session (`SET`, not `SET LOCAL`, through the
    /// pool or in a handler's transaction) changes it for every later request on that pooled
    /// connection: use `SET LOCAL`.
    #[must_use]
    pub fn with_pool_lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.pool_lock_timeout_bounded =
            !lock_timeout.is_zero() && lock_timeout <= Self::TX_LOCK_TIMEOUT;
        self.phase_lock_timeout_ms = duration_millis_u64(if self.pool_lock_timeout_bounded {
            lock_timeout
        } else {
            Self::TX_LOCK_TIMEOUT
        });
        self
    }

    /// Whether claim and phase transactions rely on the pool's session `lock_timeout` (a plain
    /// `BEGIN`) rather than sending `SET LOCAL lock_timeout` with it: true for a store from
    /// [`connect`](Self::connect) whose connection showed a bound of at most
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT), or one declared with
    /// [`with_pool_lock_timeout`](Self::with_pool_lock_timeout).
    pub fn relies_on_session_lock_timeout(&self) -> bool {
        self.pool_lock_timeout_bounded
    }

    /// Sends a transactional handler's final completion and its `COMMIT` as one simple-query
    /// message, one round trip where the default takes two
    /// ([`complete_and_commit_in`](Self::complete_and_commit_in); docs/DESIGN.md, "The
    /// completion goes out with the commit"). Off by default.
    ///
    /// The message's values are literals, so the server parses and plans the completion on
    /// every request instead of reusing the prepared statement's plan: about 0.13 to 0.25
    /// milliseconds of database CPU per completion (`EXPLAIN ANALYZE` over 100,000 records on
    /// this project's machine). Over loopback, where a round trip costs about 30 µs, that made
    /// the transactional layer 10 to 20% slower (docs/PERFORMANCE.md); turn it on where the
    /// database is across a network (a round trip of 0.3 milliseconds or more) and latency
    /// matters more than the database's CPU.
    #[must_use]
    pub fn with_completion_sent_with_commit(mut self, on: bool) -> Self {
        self.completion_with_commit = on;
        self
    }

    /// Whether the final completion goes out with the `COMMIT` in one message
    /// ([`with_completion_sent_with_commit`](Self::with_completion_sent_with_commit)).
    pub fn completion_sent_with_commit(&self) -> bool {
        self.completion_with_commit
    }

    /// Sends a transactional handler's claim of a new key with the `BEGIN` of its transaction,
    /// as one simple-query message, one round trip where the default takes two
    /// ([`claim_tx`](Self::claim_tx); docs/DESIGN.md, "The claim goes out with the begin").
    /// Off by default. With
    /// [`with_completion_sent_with_commit`](Self::with_completion_sent_with_commit) as well, a
    /// first execution makes as many round trips as the same handler without the layer.
    ///
    /// sqlx's `begin_with` reads no rows of its statement, so the message tells only by its
    /// success or failure: a plain `INSERT` of the claim (no `ON CONFLICT`), then `BEGIN`, which
    /// turns the message's implicit transaction into the handler's. A key that exists fails the
    /// insert with a unique violation (`23505`), the message's implicit transaction rolls back
    /// and the claim reads the record and decides as usual: a replay costs the failed message
    /// and a read, about as many round trips as without this option. Two costs to weigh:
    ///
    /// - the server logs every failed insert (each replay, each mismatch, each duplicate that
    ///   arrives while the first request's transaction is open) as an `ERROR` of about 800
    ///   bytes (at the default `log_min_error_statement`): its `DETAIL` holds the scope and the
    ///   key in clear text, its statement the request's fingerprint (and the request itself, for
    ///   a route that keeps it for resumption);
    /// - the insert's values are literals, planned by the server on every claim where the
    ///   prepared insert reuses its plan.
    ///
    /// Turn it on where the database is across a network (a round trip of 0.3 milliseconds or
    /// more) and a first execution's latency matters more than the database's CPU and logs.
    #[must_use]
    pub fn with_claim_sent_with_begin(mut self, on: bool) -> Self {
        self.claim_with_begin = on;
        self
    }

    /// Whether a transactional handler's claim goes out with its `BEGIN`
    /// ([`with_claim_sent_with_begin`](Self::with_claim_sent_with_begin)).
    pub fn claim_sent_with_begin(&self) -> bool {
        self.claim_with_begin
    }

    /// Replaces the clock (the default is [`SystemClock`]).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The connection pool, for the application's own business tables.
    pub fn pool(&self) -> &sqlx::Pool<Postgres> {
        &self.pool
    }

    /// The pool of [`LEASE_POOL_CONNECTIONS`](Self::LEASE_POOL_CONNECTIONS) connections that
    /// lease renewals use, made at the first call (inside the runtime, where sqlx's pool
    /// starts its maintenance task).
    pub(crate) fn lease_pool(&self) -> &PgPool {
        self.lease_pool.get_or_init(|| {
            PgPoolOptions::new()
                .max_connections(Self::LEASE_POOL_CONNECTIONS)
                .acquire_timeout(Self::DEFAULT_ACQUIRE_TIMEOUT)
                .connect_lazy_with((*self.pool.connect_options()).clone())
        })
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs the crate's migrations (the `oncely_idempotency_keys` table and its indexes).
    /// Idempotent, and safe when several processes run it at once against one database: sqlx's
    /// migrator holds a PostgreSQL advisory lock (keyed by the database name) for the whole
    /// run, so the runs take turns and the later ones find nothing to do. The history is kept
    /// in the table `_oncely_migrations`, apart from the application's own sqlx migrations.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] wrapping [`PostgresStoreError::Migrate`] when the database
    /// cannot be reached or a migration fails.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut migrator = sqlx::migrate!();
        migrator.dangerous_set_table_name(sql::MIGRATIONS_TABLE);
        migrator
            .run(&self.pool)
            .await
            .map_err(|e| PostgresStoreError::Migrate(e).into())
    }

    /// A connection of the main pool for one [`KeyStore`](oncely_core::KeyStore) operation.
    pub(crate) async fn acquire(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        self.pool.acquire().await.map_err(map)
    }
}

/// A duration in whole milliseconds (at least 1: PostgreSQL reads a `lock_timeout` of 0 as no
/// limit).
pub(crate) fn duration_millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
