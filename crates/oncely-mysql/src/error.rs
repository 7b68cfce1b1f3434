//! The crate's error type ([`MySqlStoreError`]), the server's error numbers the store acts on,
//! the mapping of sqlx errors onto [`StoreError`], and the bounded retry of deadlocks.

use oncely_core::StoreError;
use std::time::Duration;

/// Errors particular to the MySQL store, carried inside [`StoreError::Unavailable`] (downcast
/// the source to inspect them), as `oncely_postgres::PostgresStoreError` is for PostgreSQL.
/// Every one of them fails closed: the layer answers `503` and runs nothing.
///
/// Errors of the database itself (connection refused or lost, pool timeout, a lock wait past
/// `innodb_lock_wait_timeout`, deadlocks past the retries) stay [`sqlx::Error`]s inside
/// [`StoreError::Unavailable`]; a row that does not decode is [`StoreError::Corrupt`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MySqlStoreError {
    /// The connection URL could not be parsed. The URL itself is not kept: it may carry a
    /// password.
    #[error("invalid MySQL URL: {0}")]
    InvalidUrl(#[source] sqlx::Error),
    /// The crate's migrations could not be applied.
    #[error("the migrations could not be applied: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// Another process's migration run held the migrations' lock for longer than
    /// [`MySqlStore::MIGRATE_LOCK_WAIT`](crate::MySqlStore::MIGRATE_LOCK_WAIT).
    #[error("another migration run held the lock for longer than the wait")]
    MigrateLock,
    /// A claim found the record changing under its conditional write this many times in a row
    /// ([`MySqlStore::MAX_CLAIM_ROUNDS`](crate::MySqlStore::MAX_CLAIM_ROUNDS)).
    #[error("the claim of {scope}/{key} lost {rounds} races in a row")]
    ClaimContention {
        /// The scope of the key.
        scope: String,
        /// The key.
        key: String,
        /// How many insert-decide-write rounds it made.
        rounds: u32,
    },
    /// The scope is longer than its column (`VARBINARY(1024)`,
    /// [`MySqlStore::MAX_SCOPE_BYTES`](crate::MySqlStore::MAX_SCOPE_BYTES)): refused before any
    /// statement, so that no `sql_mode` can make the database cut it short and let two scopes
    /// share records.
    #[error("the scope is {len} bytes long; the MySQL store keeps scopes of at most 1024 bytes")]
    ScopeTooLong {
        /// The scope's length in bytes (UTF-8).
        len: usize,
    },
}

impl From<MySqlStoreError> for StoreError {
    /// Every [`MySqlStoreError`] is [`StoreError::Unavailable`].
    fn from(e: MySqlStoreError) -> Self {
        StoreError::unavailable(e)
    }
}

/// `ER_LOCK_WAIT_TIMEOUT`: a statement waited longer than `innodb_lock_wait_timeout` for a row
/// lock. InnoDB rolls back that statement only (unless the server runs with
/// `innodb_rollback_on_timeout`, then the whole transaction).
pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as a deadlock's victim and rolled it back
/// whole (SQLSTATE `40001`); the client is to run it again.
pub(crate) const DEADLOCK: u16 = 1213;
/// `ER_SP_DOES_NOT_EXIST`, here "SAVEPOINT oncely_tx does not exist": the transaction that set
/// it has ended.
pub(crate) const NO_SUCH_SAVEPOINT: u16 = 1305;

/// The server's error number of `e` (MySQL and MariaDB share the numbers the store acts on).
pub(crate) fn number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(sqlx::mysql::MySqlDatabaseError::number)
}

/// The server's error number of a [`StoreError::Unavailable`] that wraps a database error.
pub(crate) fn store_number(e: &StoreError) -> Option<u16> {
    match e {
        StoreError::Unavailable(source) => number(source.downcast_ref::<sqlx::Error>()?),
        _ => None,
    }
}

/// How many times an operation whose transaction was a deadlock's victim is run again before
/// the error is returned as [`StoreError::Unavailable`].
pub(crate) const MAX_DEADLOCK_RETRIES: u32 = 8;

/// The pause before retry `attempt` (1-based): 1, 2, 4 ... milliseconds, capped at 50, plus up
/// to as much again of jitter so that the transactions of a deadlock do not meet again in
/// lockstep.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = (1u64 << attempt.saturating_sub(1).min(6)).min(50);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0);
    Duration::from_micros(base * 1000 + nanos % (base * 1000))
}

/// Maps a sqlx error: decoding problems are a corrupt record; everything else (connection
/// refused or lost, pool timeout, a lock wait timeout, a deadlock) is
/// [`StoreError::Unavailable`], which the layer answers with a retryable `503`.
pub(crate) fn map(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(other),
    }
}

/// Runs `$op` (an expression yielding `Result<_, StoreError>`, usually ending in `.await`, that
/// runs one whole transaction or one autocommit statement) again after a short backoff while
/// it fails as a deadlock's victim, at most [`MAX_DEADLOCK_RETRIES`] times. A deadlock rolls the
/// whole transaction back, so running it again from its start is what the server asks for.
macro_rules! retry_deadlocks {
    ($op:expr) => {{
        let mut attempt: u32 = 0;
        loop {
            match $op {
                Err(e)
                    if $crate::error::store_number(&e) == Some($crate::error::DEADLOCK)
                        && attempt < $crate::error::MAX_DEADLOCK_RETRIES =>
                {
                    attempt += 1;
                    tracing::debug!(attempt, error = %e, "retrying a deadlock's victim");
                    tokio::time::sleep($crate::error::backoff(attempt)).await;
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use retry_deadlocks;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_invalid_url_is_typed_and_never_shows_the_password() {
        let e = crate::MySqlStore::connect("mysql://app:s3cret@db:notaport/app")
            .await
            .unwrap_err();
        let StoreError::Unavailable(source) = &e else {
            panic!("expected Unavailable, got {e:?}")
        };
        let typed = source.downcast_ref::<MySqlStoreError>();
        assert!(
            matches!(typed, Some(MySqlStoreError::InvalidUrl(_))),
            "{typed:?}"
        );
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn every_store_error_is_unavailable() {
        let e: StoreError = MySqlStoreError::ScopeTooLong { len: 2000 }.into();
        assert_eq!(
            e.to_string(),
            "key store unavailable: the scope is 2000 bytes long; the MySQL store keeps scopes of at most 1024 bytes"
        );
        assert_eq!(store_number(&e), None);
    }

    #[test]
    fn the_backoff_stays_within_its_bounds() {
        for attempt in 1..20 {
            let b = backoff(attempt);
            assert!(b >= Duration::from_millis(1), "{attempt}: {b:?}");
            assert!(b < Duration::from_millis(100), "{attempt}: {b:?}");
        }
    }
}
