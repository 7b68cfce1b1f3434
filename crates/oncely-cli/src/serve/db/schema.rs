//! The business schema: the tables of SQLite and PostgreSQL, their MySQL form, and
//! [`Db::migrate`], safe when several servers start at once.

use super::conn::Db;
use anyhow::Result;

/// The business schema of SQLite and PostgreSQL, written once for both.
const SCHEMA: &[&str] = &[
    // One row per logical request: a key reused after the replay window is a new request and
    // makes a new row, so (scope, idempotency_key) is indexed, not unique. Which row belongs to
    // a resumed request is carried by its recovery point (`payment_recorded:pay_…`).
    "CREATE TABLE IF NOT EXISTS oncely_payments (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        amount BIGINT NOT NULL,
        currency TEXT NOT NULL,
        source TEXT NOT NULL,
        description TEXT,
        status TEXT NOT NULL,
        charge_id TEXT,
        receipt_id TEXT,
        created_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS oncely_payments_by_scope ON oncely_payments (scope, created_at)",
    "CREATE TABLE IF NOT EXISTS oncely_orders (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        items TEXT NOT NULL,
        created_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS oncely_orders_by_scope ON oncely_orders (scope, created_at)",
    // One row per application of a webhook event. Deliberately no unique constraint on
    // (sender, event_id): the table counts applications, so a duplicate would show as a second
    // row; the receiver's claim, in the same transaction, is what keeps them to one (the
    // webhook gate counts the rows). A production receiver may add one as a second fence.
    "CREATE TABLE IF NOT EXISTS oncely_webhook_events (
        id TEXT PRIMARY KEY,
        sender TEXT NOT NULL,
        event_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        scope TEXT,
        payment_id TEXT,
        received_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS oncely_webhook_events_by_payment ON oncely_webhook_events (scope, payment_id, received_at)",
];

/// Serializes concurrent business-schema migrations (PostgreSQL; released at commit).
#[cfg(feature = "postgres")]
const MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock(7461621001)";

/// The business schema on MySQL and MariaDB: the same tables, with the indexes declared inside
/// `CREATE TABLE IF NOT EXISTS` (MySQL has no `CREATE INDEX IF NOT EXISTS`) and key columns of
/// bounded length (a `TEXT` column cannot be a key). The scope is bytes (`VARBINARY`), as in the
/// key store: every text collation folds case or ignores trailing spaces, either of which would
/// let one caller read another's rows. The ids are server-made (`pay_…`), so a text collation
/// (`utf8mb4_bin`, the tables' default) is exact enough for them.
#[cfg(feature = "mysql")]
const MYSQL_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS oncely_payments (
        id VARCHAR(255) PRIMARY KEY,
        scope VARBINARY(1024) NOT NULL,
        idempotency_key TEXT NOT NULL,
        amount BIGINT NOT NULL,
        currency TEXT NOT NULL,
        source TEXT NOT NULL,
        description TEXT,
        status VARCHAR(16) NOT NULL,
        charge_id TEXT,
        receipt_id TEXT,
        created_at BIGINT NOT NULL,
        INDEX oncely_payments_by_scope (scope, created_at)
    ) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS oncely_orders (
        id VARCHAR(255) PRIMARY KEY,
        scope VARBINARY(1024) NOT NULL,
        idempotency_key TEXT NOT NULL,
        items LONGTEXT NOT NULL,
        created_at BIGINT NOT NULL,
        INDEX oncely_orders_by_scope (scope, created_at)
    ) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS oncely_webhook_events (
        id VARCHAR(255) PRIMARY KEY,
        sender TEXT NOT NULL,
        event_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        scope VARBINARY(1024),
        payment_id VARCHAR(255),
        received_at BIGINT NOT NULL,
        INDEX oncely_webhook_events_by_payment (scope, payment_id, received_at)
    ) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
];

/// Serializes concurrent business-schema migrations on MySQL and MariaDB: a named lock of the
/// connection's session, keyed by the database (DDL commits by itself there, so no transaction
/// can hold it), waited for up to the given number of seconds.
#[cfg(feature = "mysql")]
const MYSQL_MIGRATION_LOCK: &str =
    "SELECT GET_LOCK(CONCAT('oncely_business_', MD5(DATABASE())), ?)";
/// Releases [`MYSQL_MIGRATION_LOCK`]'s lock.
#[cfg(feature = "mysql")]
const MYSQL_MIGRATION_UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT('oncely_business_', MD5(DATABASE())))";
/// How long a MySQL migration waits for another server's: 60 seconds.
#[cfg(feature = "mysql")]
const MYSQL_MIGRATION_WAIT_SECS: u64 = 60;

impl Db {
    /// Creates the business tables if missing. Safe when several servers start at once: on
    /// PostgreSQL, concurrent `CREATE TABLE IF NOT EXISTS` can still collide, so the statements
    /// run in one transaction under an advisory lock; on MySQL and MariaDB, under a named lock
    /// (`GET_LOCK`) of one connection, waited for up to 60 seconds.
    ///
    /// # Errors
    ///
    /// The database's error, or (MySQL) another server held the lock for longer than the wait.
    pub async fn migrate(&self) -> Result<()> {
        #[cfg(feature = "mysql")]
        if let Db::Mysql(p) = self {
            use sqlx::Connection as _;
            let mut c = p.acquire().await?;
            let got: Option<i64> = sqlx::query_scalar(MYSQL_MIGRATION_LOCK)
                .bind(MYSQL_MIGRATION_WAIT_SECS)
                .fetch_one(&mut *c)
                .await?;
            if got != Some(1) {
                anyhow::bail!(
                    "another server held the business schema's lock for over {MYSQL_MIGRATION_WAIT_SECS} seconds"
                );
            }
            let mut ran = Ok(());
            for stmt in MYSQL_SCHEMA {
                if let Err(e) = sqlx::query(*stmt).execute(&mut *c).await {
                    ran = Err(e);
                    break;
                }
            }
            // A named lock belongs to the session: a pooled connection must not keep it.
            if sqlx::query(MYSQL_MIGRATION_UNLOCK)
                .execute(&mut *c)
                .await
                .is_err()
            {
                let _ = c.detach().close().await;
            }
            return Ok(ran?);
        }
        #[cfg(feature = "postgres")]
        if let Db::Postgres(p) = self {
            let mut tx = p.begin().await?;
            sqlx::query(MIGRATION_LOCK).execute(&mut *tx).await?;
            for stmt in SCHEMA {
                sqlx::query(*stmt).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            return Ok(());
        }
        for stmt in SCHEMA {
            match self {
                Db::Sqlite(p) => {
                    sqlx::query(*stmt).execute(p).await?;
                }
                #[cfg(feature = "postgres")]
                Db::Postgres(_) => unreachable!("migrated above"),
                #[cfg(feature = "mysql")]
                Db::Mysql(_) => unreachable!("migrated above"),
            }
        }
        Ok(())
    }
}
