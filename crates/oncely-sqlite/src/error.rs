//! How database errors become [`StoreError`]s.

use oncely_core::StoreError;

/// Maps a sqlx error (`oncely_sql::map_sqlx`): anything about reading a row's values is
/// [`StoreError::Corrupt`]; everything else (`SQLITE_BUSY` after the busy timeout, a pool
/// timeout, I/O, a closed pool, a full disk) is [`StoreError::Unavailable`], so the layer fails
/// closed with `503`.
pub(crate) use oncely_sql::map_sqlx;

/// Errors particular to the SQLite store, carried inside [`StoreError::Unavailable`] (downcast
/// the source to inspect them).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteStoreError {
    /// The connection URL could not be parsed.
    #[error("invalid SQLite URL {url:?}: {source}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why sqlx rejected it.
        #[source]
        source: sqlx::Error,
    },
    /// A claim kept finding the row changed under its conditional write.
    #[error("the claim found the record changing under it {0} times in a row")]
    ClaimContention(usize),
    /// A phase write ([`SqliteStore::complete_in`](crate::SqliteStore::complete_in),
    /// [`SqliteStore::checkpoint_in`](crate::SqliteStore::checkpoint_in)) found the
    /// transaction's savepoint gone: the transaction ended behind the phase's back (a `COMMIT`
    /// or `ROLLBACK` through it).
    #[error("the phase's transaction ended behind its back (COMMIT or ROLLBACK through it)")]
    TransactionEnded,
}

impl From<SqliteStoreError> for StoreError {
    /// Every [`SqliteStoreError`] is [`StoreError::Unavailable`].
    fn from(e: SqliteStoreError) -> Self {
        StoreError::unavailable(e)
    }
}
