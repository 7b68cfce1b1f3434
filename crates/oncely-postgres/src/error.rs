//! The crate's error type ([`PostgresStoreError`]), mapping sqlx errors onto [`StoreError`],
//! and the bounded retry of transient conflicts.

use oncely_core::StoreError;

/// Errors particular to the PostgreSQL store, carried inside [`StoreError::Unavailable`]
/// (downcast the source to inspect them), as `oncely_sqlite::SqliteStoreError` is for SQLite.
/// Every one of them fails closed: the layer answers `503` and runs nothing.
///
/// Errors of the database itself (connection refused or lost, pool timeout, lock or statement
/// timeout) stay [`sqlx::Error`]s inside [`StoreError::Unavailable`]; a row that does not
/// decode is [`StoreError::Corrupt`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresStoreError {
    /// The connection URL could not be parsed. The URL itself is not kept: it may carry a
    /// password.
    #[error("invalid PostgreSQL URL: {0}")]
    InvalidUrl(#[source] sqlx::Error),
    /// The crate's migrations could not be applied.
    #[error("the migrations could not be applied: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A claim found the record changing under its conditional write this many times in a row
    /// ([`PostgresStore::MAX_CLAIM_ROUNDS`](crate::PostgresStore::MAX_CLAIM_ROUNDS)).
    #[error("the claim of {scope}/{key} lost {rounds} races in a row")]
    ClaimContention {
        /// The scope of the key.
        scope: String,
        /// The key.
        key: String,
        /// How many read-decide-write rounds it made.
        rounds: u32,
    },
}

impl From<PostgresStoreError> for StoreError {
    /// Every [`PostgresStoreError`] is [`StoreError::Unavailable`].
    fn from(e: PostgresStoreError) -> Self {
        StoreError::unavailable(e)
    }
}

/// `40001 serialization_failure` or `40P01 deadlock_detected`: the database rolled the
/// statement back and asks the client to run it again. Under PostgreSQL's default `READ
/// COMMITTED` the store's single-statement operations do not produce them; under `SERIALIZABLE`
/// or `REPEATABLE READ` (a server's `default_transaction_isolation`, or a Postgres-compatible
/// distributed database whose default is serializable) concurrent claims of one key do.
pub(crate) fn is_transient(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable(source) => matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("40001" | "40P01"))
        ),
        _ => false,
    }
}

/// Maps a sqlx error (`oncely_sql::map_sqlx`): decoding problems are a corrupt record;
/// everything else (connection refused or lost, pool timeout, lock timeout `55P03`, statement
/// timeout, exhausted retries) is [`StoreError::Unavailable`], which the layer answers with a
/// retryable `503`.
pub(crate) use oncely_sql::map_sqlx as map;

/// Runs `$op` (an expression yielding `Result<_, StoreError>`, usually ending in `.await`)
/// again after a short backoff while it fails with a transient conflict ([`is_transient`]), at
/// most 8 times (`oncely_sql::retry_while!`).
macro_rules! retry_transient {
    ($op:expr) => {
        oncely_sql::retry_while!($crate::error::is_transient, $op)
    };
}
pub(crate) use retry_transient;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_invalid_url_is_typed_and_never_shows_the_password() {
        let e = crate::PostgresStore::connect("postgres://app:s3cret@db:notaport/app")
            .await
            .unwrap_err();
        let StoreError::Unavailable(source) = &e else {
            panic!("expected Unavailable, got {e:?}")
        };
        let typed = source.downcast_ref::<PostgresStoreError>();
        assert!(
            matches!(typed, Some(PostgresStoreError::InvalidUrl(_))),
            "{typed:?}"
        );
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn every_store_error_is_unavailable() {
        let e: StoreError = PostgresStoreError::ClaimContention {
            scope: "acct".into(),
            key: "k".into(),
            rounds: 32,
        }
        .into();
        assert_eq!(
            e.to_string(),
            "key store unavailable: the claim of acct/k lost 32 races in a row"
        );
    }
}
