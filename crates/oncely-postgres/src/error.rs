//! The crate's error type ([`PostgresStoreError`]), mapping sqlx errors onto [`StoreError`],
//! and the bounded retry of transient conflicts.

use oncely_core::StoreError;
use std::time::Duration;

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

/// How many times a statement that failed with a serialization failure (`40001`) or a deadlock
/// (`40P01`) is retried before the error is returned as [`StoreError::Unavailable`].
pub(crate) const MAX_TRANSIENT_RETRIES: u32 = 8;

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

/// The pause before retry `attempt` (1-based): 1, 2, 4 ... milliseconds, capped at 50, plus up
/// to as much again of jitter so that conflicting clients do not retry in lockstep.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = 1u64 << attempt.saturating_sub(1).min(6);
    let base = base.min(50);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0);
    Duration::from_micros(base * 1000 + nanos % (base * 1000))
}

/// Maps a sqlx error: decoding problems are a corrupt record; everything else (connection
/// refused or lost, pool timeout, lock timeout `55P03`, statement timeout, exhausted retries)
/// is [`StoreError::Unavailable`], which the layer answers with a retryable `503`.
pub(crate) fn map(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(other),
    }
}

/// Runs `$op` (an expression yielding `Result<_, StoreError>`, usually ending in `.await`)
/// again after a short backoff while it fails with a transient conflict, at most
/// [`MAX_TRANSIENT_RETRIES`] times.
macro_rules! retry_transient {
    ($op:expr) => {{
        let mut attempt: u32 = 0;
        loop {
            match $op {
                Err(e)
                    if $crate::error::is_transient(&e)
                        && attempt < $crate::error::MAX_TRANSIENT_RETRIES =>
                {
                    attempt += 1;
                    tracing::debug!(attempt, error = %e, "retrying after a transient conflict");
                    tokio::time::sleep($crate::error::backoff(attempt)).await;
                }
                other => break other,
            }
        }
    }};
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
