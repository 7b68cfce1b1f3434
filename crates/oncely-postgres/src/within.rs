//! The owner's writes on a connection, written once: the fencing write (`renew_in`), the
//! recovery point, the stored response (alone, or with the `COMMIT` in one message) and the
//! release, and the plain read of a record. `oncely-sqlx`'s transactional phases run them on
//! the handler's transaction, so the fencing write, the recovery point and the stored response
//! commit (or roll back) together with the business writes; the
//! [`KeyStore`](oncely_core::KeyStore) operations (`keystore.rs`) run the same ones on a pooled
//! connection outside any transaction block, where each statement is a transaction of its own.
//! The claim, written once the same way, is in `claim.rs`.
//!
//! None of these functions commits (except `complete_and_commit_in`, whose commit is the point),
//! and none retries: inside a transaction a failed statement aborts the whole transaction, so a
//! serialization failure is returned (as [`StoreError::Unavailable`]) for the caller to run the
//! transaction again. The pooled operations retry it themselves.

use crate::error::map;
use crate::row::record_from_row;
use crate::sql;
use crate::store::PostgresStore;
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{FencingToken, Record, RecordKey, StoreError, StoredResponse, UnixMillis};
use oncely_sql::fenced_unless_written;
use sqlx::postgres::{PgConnection, PgExecutor};
use std::time::Duration;

/// Reads one record with a plain MVCC `SELECT` (it never waits for a lock), on the pool or on
/// the caller's connection.
pub(crate) async fn read<'e>(
    executor: impl PgExecutor<'e>,
    id: &RecordKey,
) -> Result<Option<Record>, StoreError> {
    let row = sqlx::query(sql::SELECT_RECORD)
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .fetch_optional(executor)
        .await
        .map_err(map)?;
    row.as_ref().map(record_from_row).transpose()
}

impl PostgresStore {
    /// Begins a transaction for a claim or a phase (`BEGIN`, at the server's default isolation,
    /// `READ COMMITTED` unless configured otherwise), whose lock waits are bounded by
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT), or by the pool's shorter session
    /// `lock_timeout` when the store relies on it
    /// ([`relies_on_session_lock_timeout`](Self::relies_on_session_lock_timeout)).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection could be had or the database failed.
    pub async fn begin_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        if self.pool_lock_timeout_bounded {
            self.pool().begin().await.map_err(map)
        } else {
            self.pool()
                .begin_with("BEGIN; SET LOCAL lock_timeout = '4000ms'")
                .await
                .map_err(map)
        }
    }

    /// The fencing write on `conn`: renews the lease to now plus `lease` (never less than 1
    /// millisecond) if the record is still in flight with `token`, taking the record's row lock
    /// until the caller's transaction ends (a takeover then waits for it). Returns the new lease
    /// expiry (epoch milliseconds).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight
    /// (nothing was written); [`StoreError::Unavailable`] when the database fails.
    pub async fn renew_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let result = sqlx::query(sql::RENEW)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(until)
            .execute(conn)
            .await
            .map_err(map)?;
        fenced_unless_written(result.rows_affected()).map(|()| until)
    }

    /// Records `recovery_point` on `conn` and renews the lease to now plus `lease`, if the
    /// record is still in flight with `token`. `request`, if given, is the encoded
    /// [`StoredRequest`](oncely_core::StoredRequest) that a claim inside the same transaction
    /// left out (nobody could read it before a commit): it is stored unless the record already
    /// has one.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::renew_in`].
    pub async fn checkpoint_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let query = if request.is_some() {
            sql::CHECKPOINT_WITH_REQUEST
        } else {
            sql::CHECKPOINT
        };
        let mut q = sqlx::query(query)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(recovery_point)
            .bind(until);
        if let Some(request) = request {
            q = q.bind(request);
        }
        let result = q.execute(conn).await.map_err(map)?;
        fenced_unless_written(result.rows_affected())
    }

    /// Stores the final response on `conn` (state complete, kept for `retention` from now), if
    /// the record is still in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::renew_in`].
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.clock().now_millis();
        let headers = response.encode_headers();
        let result = sqlx::query(sql::COMPLETE)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(now)
            .bind(i32::from(response.status))
            .bind(&headers[..])
            .bind(&response.body[..])
            .bind(response.body_retained)
            .bind(now.saturating_add(duration_millis(retention)))
            .execute(conn)
            .await
            .map_err(map)?;
        fenced_unless_written(result.rows_affected())
    }

    /// [`complete_in`](Self::complete_in) and the `COMMIT` of the transaction on `conn`, in one
    /// simple-query message and so in one round trip where the two would take two
    /// (docs/DESIGN.md, "The completion goes out with the commit"). The values go in as
    /// literals (integers formatted, text as escape-string constants the planner matches
    /// against the primary key, `bytea` hex-encoded and decoded by the server, so that no
    /// value can end its literal, whatever the session's `standard_conforming_strings`), and
    /// the completion fails when it matches no row
    /// (fenced), so that a failed statement skips the rest of the message and the `COMMIT`
    /// never runs for a phase that lost its claim or whose transaction a failed statement
    /// aborted. With `check_open`, a first statement fails unless the transaction is still the
    /// one the phase began (see `still_open` in `oncely-sqlx`), and nothing is written then.
    ///
    /// On success the message leaves an empty transaction open after the `COMMIT` (a `BEGIN`),
    /// so that the caller's sqlx `Transaction`, which still counts itself open, is dropped as
    /// usual: its queued `ROLLBACK` of the empty transaction goes out with the pool's release
    /// ping, at no round trip of its own.
    ///
    /// # Errors
    ///
    /// [`CompleteCommitError`]: which statement failed, and so whether anything committed.
    pub async fn complete_and_commit_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        check_open: bool,
    ) -> Result<(), CompleteCommitError> {
        use futures::TryStreamExt;
        let now = self.clock().now_millis();
        let headers = response.encode_headers();
        let message = sql::complete_and_commit(
            id.scope.as_str(),
            id.key.as_str(),
            token.0,
            now,
            i32::from(response.status),
            &headers,
            &response.body,
            response.body_retained,
            now.saturating_add(duration_millis(retention)),
            check_open,
        );
        // Statements before the `COMMIT`: the open check (if any) and the completion.
        let before_commit = if check_open { 2 } else { 1 };
        let mut finished = 0usize;
        let mut results = sqlx::raw_sql(sqlx::AssertSqlSafe(message)).execute_many(&mut *conn);
        loop {
            match results.try_next().await {
                Ok(Some(_)) => finished += 1,
                Ok(None) => return Ok(()),
                Err(e) if finished >= before_commit => return Err(CompleteCommitError::Commit(e)),
                Err(e) => {
                    return Err(match failed_on_mark(&e) {
                        Some(sql::ENDED_MARK) => CompleteCommitError::Ended,
                        Some(_) => CompleteCommitError::Fenced,
                        None => CompleteCommitError::Statement(map(e)),
                    });
                }
            }
        }
    }

    /// Releases the claim on `conn` (the key behaves as absent again), if the record is still
    /// in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::renew_in`].
    pub async fn release_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(sql::RELEASE)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(conn)
            .await
            .map_err(map)?;
        fenced_unless_written(result.rows_affected())
    }
}

/// Why [`PostgresStore::complete_and_commit_in`] failed, which says what committed.
#[derive(Debug)]
#[non_exhaustive]
pub enum CompleteCommitError {
    /// The open check found the transaction ended behind the phase's back (only with
    /// `check_open`): nothing was written.
    Ended,
    /// The completion matched no row: the token is stale or the record is no longer in flight
    /// (or, without `check_open`, the transaction had ended behind the phase's back, and the
    /// record with it). Nothing of the transaction commits: it is left aborted, for the
    /// caller's rollback.
    Fenced,
    /// A statement before the `COMMIT` failed (a transaction a failed statement of the
    /// handler aborted: SQLSTATE `25P02`; a lock timeout; a lost connection): nothing
    /// committed, unless the connection was lost after the server received the message.
    Statement(StoreError),
    /// The `COMMIT` itself failed (as a serializable transaction's can): nothing committed,
    /// unless the connection was lost during the commit.
    Commit(sqlx::Error),
}

/// The mark ([`sql::FENCED_MARK`], [`sql::ENDED_MARK`]) whose cast failed in `e`, if `e` is
/// such a failure (SQLSTATE `22P02`, the value quoted in the message).
fn failed_on_mark(e: &sqlx::Error) -> Option<&'static str> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    if db.code().as_deref() != Some("22P02") {
        return None;
    }
    [sql::FENCED_MARK, sql::ENDED_MARK]
        .into_iter()
        .find(|mark| db.message().contains(&format!("\"{mark}\"")))
}
