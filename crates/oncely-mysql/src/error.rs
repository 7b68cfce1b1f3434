//! The crate's error type ([`MySqlStoreError`]), the server's error numbers the store acts on,
//! the mapping of sqlx errors onto [`StoreError`], and the bounded retry of deadlocks.

use oncely_core::StoreError;

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

/// Whether `e` is a deadlock's victim (error 1213): InnoDB rolled the whole transaction back
/// and asks the client to run it again.
pub(crate) fn is_deadlock(e: &StoreError) -> bool {
    store_number(e) == Some(DEADLOCK)
}

/// Maps a sqlx error (`oncely_sql::map_sqlx`): decoding problems are a corrupt record;
/// everything else (connection refused or lost, pool timeout, a lock wait timeout, a deadlock)
/// is [`StoreError::Unavailable`], which the layer answers with a retryable `503`.
pub(crate) use oncely_sql::map_sqlx as map;

/// Runs `$op` (an expression yielding `Result<_, StoreError>`, usually ending in `.await`, that
/// runs one whole transaction or one autocommit statement) again after a short backoff while
/// it fails as a deadlock's victim ([`is_deadlock`]), at most 8 times
/// (`oncely_sql::retry_while!`). A deadlock rolls the whole transaction back, so running it
/// again from its start is what the server asks for.
macro_rules! retry_deadlocks {
    ($op:expr) => {
        oncely_sql::retry_while!($crate::error::is_deadlock, $op)
    };
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
}
