//! sqlx errors as [`StoreError`]s, the bounded retry of what the database asks to be run
//! again, and the answer to an owner write that matched no row.

use oncely_core::StoreError;
use std::time::Duration;

/// Maps a sqlx error: anything about reading a row's values (a column that does not decode, is
/// missing or out of range) is [`StoreError::Corrupt`]; everything else (connection refused or
/// lost, pool timeout, a closed pool, a lock wait timeout, a deadlock or serialization failure
/// past the retries, `SQLITE_BUSY` after the busy timeout, a full disk) is
/// [`StoreError::Unavailable`], which the layer answers with a retryable `503`: it fails
/// closed.
///
/// No claim path sees a unique violation: every store's claim inserts so that losing the race
/// is the "record exists" path (docs/DESIGN.md, "Unique violation surfaced as 500").
pub fn map_sqlx(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(other),
    }
}

/// How many times [`retry_while!`](crate::retry_while) runs an operation again before its
/// error is returned: 8.
pub const MAX_RETRIES: u32 = 8;

/// The pause before retry `attempt` (1-based): 1, 2, 4 ... milliseconds, capped at 50, plus up
/// to as much again of jitter (from the system clock's nanoseconds), so that the transactions
/// of one conflict do not meet again in lockstep. Always at least 1 and under 100
/// milliseconds.
pub fn backoff(attempt: u32) -> Duration {
    let base = (1u64 << attempt.saturating_sub(1).min(6)).min(50);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0);
    Duration::from_micros(base * 1000 + nanos % (base * 1000))
}

/// Runs `$op` (an expression yielding `Result<_, StoreError>`, usually ending in `.await`, that
/// runs one whole transaction or one statement outside any transaction block) again after a
/// [`backoff`] while it fails with an error `$retryable` (a `fn(&StoreError) -> bool`, the
/// store's: a deadlock's victim on MySQL, a serialization failure or deadlock on PostgreSQL)
/// accepts, at most [`MAX_RETRIES`] times; then, or on any other result, that result.
///
/// Only for an operation that the database rolled back whole on that error, so that running it
/// again from its start is what the server asks for: never a statement inside a caller's
/// transaction.
#[macro_export]
macro_rules! retry_while {
    ($retryable:expr, $op:expr) => {{
        let mut attempt: u32 = 0;
        loop {
            match $op {
                Err(e) if ($retryable)(&e) && attempt < $crate::MAX_RETRIES => {
                    attempt += 1;
                    $crate::__private::tracing::debug!(
                        attempt,
                        error = %e,
                        "retrying after a transient conflict"
                    );
                    $crate::__private::tokio::time::sleep($crate::backoff(attempt)).await;
                }
                other => break other,
            }
        }
    }};
}

/// An owner write (`UPDATE ... WHERE scope, key AND token = ? AND state = 'in_flight'`) that
/// changed `rows_affected` rows: none means the token is stale or the record left `in_flight`,
/// [`StoreError::Fenced`] (nothing was written).
///
/// # Errors
///
/// [`StoreError::Fenced`] when `rows_affected` is 0.
pub fn fenced_unless_written(rows_affected: u64) -> Result<(), StoreError> {
    if rows_affected == 0 {
        Err(StoreError::Fenced)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_stays_within_its_bounds() {
        for attempt in 1..20 {
            let b = backoff(attempt);
            assert!(b >= Duration::from_millis(1), "{attempt}: {b:?}");
            assert!(b < Duration::from_millis(100), "{attempt}: {b:?}");
        }
    }

    #[test]
    fn decoding_errors_are_corrupt_and_the_rest_unavailable() {
        let e = map_sqlx(sqlx::Error::ColumnNotFound("state".into()));
        assert!(
            matches!(e, StoreError::Corrupt(ref what) if what.contains("state")),
            "{e:?}"
        );
        let e = map_sqlx(sqlx::Error::PoolTimedOut);
        let StoreError::Unavailable(source) = &e else {
            panic!("expected Unavailable, got {e:?}")
        };
        assert!(matches!(
            source.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::PoolTimedOut)
        ));
    }

    #[test]
    fn a_write_that_matched_no_row_is_fenced() {
        assert!(matches!(fenced_unless_written(0), Err(StoreError::Fenced)));
        assert!(fenced_unless_written(1).is_ok());
    }

    #[tokio::test]
    async fn the_retry_runs_again_while_the_error_is_retryable_and_at_most_max_retries_times() {
        let retryable = |e: &StoreError| matches!(e, StoreError::Fenced);
        let mut runs = 0u32;
        let out: Result<(), StoreError> = retry_while!(retryable, {
            runs += 1;
            Err::<(), _>(StoreError::Fenced)
        });
        assert!(matches!(out, Err(StoreError::Fenced)));
        assert_eq!(runs, MAX_RETRIES + 1);

        let mut runs = 0u32;
        let out: Result<u32, StoreError> = retry_while!(retryable, {
            runs += 1;
            if runs < 3 {
                Err(StoreError::Fenced)
            } else {
                Ok(runs)
            }
        });
        assert_eq!(out.ok(), Some(3));

        let mut runs = 0u32;
        let out: Result<(), StoreError> = retry_while!(retryable, {
            runs += 1;
            Err::<(), _>(StoreError::Corrupt("x".into()))
        });
        assert!(matches!(out, Err(StoreError::Corrupt(_))));
        assert_eq!(runs, 1);
    }
}
