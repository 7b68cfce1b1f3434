//! The split store's progress ledger (docs/DESIGN.md, "Split stores"): one row per
//! `(scope, key)` in the **business** database, written in the same transaction as each phase's
//! business writes, so that what committed and what the ledger says can never disagree.
//!
//! - The claim writes the row with the claim's fencing token, as the first statement of the
//!   handler's first transaction, and reads back what an earlier owner of the same request
//!   committed: its last recovery point, or its whole response.
//! - Every phase's commit updates the row only where its token is still the row's: once a
//!   request that took the key over has committed a phase, the request it took over commits
//!   nothing (its update finds the newer token; the phase rolls back as fenced), even though
//!   the key store and the business database are two systems. Each phase commits once, on the
//!   state the last commit left.
//! - The last phase writes the response into the row with its writes; the key store learns it
//!   afterwards. A crash, or a key store that fails, between the two leaves the record in
//!   flight in the key store, and the next claim replays the response from the ledger.
//!
//! The SQL is one text for PostgreSQL and SQLite (`$N` parameters, `ON CONFLICT`, `RETURNING`,
//! row values); only the binary column type differs.

use crate::error::TxError;
use oncely_core::{FencingToken, Fingerprint, RecordKey, StoredResponse, UnixMillis};
use std::time::Duration;

/// The ledger's table, in the business database.
pub(super) const TABLE: &str = "oncely_split_progress";

/// What the claim keeps of an existing row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Nothing: a new request on the key after its replay window. Value 0.
    Nothing,
    /// What the same request (same fingerprint) committed, if the row is not past its expiry
    /// and its response not past the replay window: a takeover, or a first claim after the key
    /// store lost or released a record whose phase had committed. A row of another request, or
    /// of an earlier use of the key, is started over. Value 1.
    SameRequest,
}

impl Keep {
    fn value(self) -> i64 {
        match self {
            Self::Nothing => 0,
            Self::SameRequest => 1,
        }
    }
}

/// A claim's write to the ledger.
#[derive(Debug)]
pub struct ClaimRow<'a> {
    /// The record.
    pub id: &'a RecordKey,
    /// The claim's token.
    pub token: FencingToken,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// What to keep of an existing row.
    pub keep: Keep,
    /// Now (epoch milliseconds).
    pub now: UnixMillis,
    /// The replay window (a kept response older than this is not kept).
    pub replay_window: Duration,
    /// When the row may be deleted, at the earliest (epoch milliseconds).
    pub expires_at: UnixMillis,
    /// The claim's retention: each checkpoint keeps the row at least this long after the
    /// lease it renews.
    pub retention: Duration,
}

/// What an earlier owner of the request committed, as the claim read it back.
#[derive(Debug, Default)]
pub struct Found {
    /// Its last recovery point.
    pub recovery_point: Option<String>,
    /// Its response and when it committed (epoch milliseconds).
    pub response: Option<(StoredResponse, UnixMillis)>,
}

/// Milliseconds of `d`, saturating.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn create_table(blob: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (\
         scope TEXT NOT NULL, \
         idempotency_key TEXT NOT NULL, \
         token BIGINT NOT NULL, \
         claims BIGINT NOT NULL, \
         fingerprint_version BIGINT NOT NULL, \
         fingerprint {blob} NOT NULL, \
         recovery_point TEXT, \
         status INTEGER, \
         headers {blob}, \
         body {blob}, \
         body_retained BOOLEAN, \
         completed_at BIGINT, \
         retention_ms BIGINT NOT NULL, \
         expires_at BIGINT NOT NULL, \
         PRIMARY KEY (scope, idempotency_key))"
    )
}

/// Reads no row but names every column: fails on a table of this name with another shape.
fn check_sql() -> String {
    format!(
        "SELECT scope, idempotency_key, token, claims, fingerprint_version, fingerprint, \
         recovery_point, status, headers, body, body_retained, completed_at, retention_ms, \
         expires_at FROM {TABLE} WHERE 1 = 0"
    )
}

const CREATE_INDEX: &str = "CREATE INDEX IF NOT EXISTS oncely_split_progress_expires \
     ON oncely_split_progress (expires_at)";

/// `$1` scope, `$2` key, `$3` token, `$4` fingerprint version, `$5` fingerprint digest, `$6`
/// expires at, `$7` [`Keep`] value, `$8` now, `$9` replay window, `$10` retention (milliseconds).
/// Every `SET`
/// expression reads the row as it was before the statement. A row that holds another request
/// (another fingerprint) within its time and the replay window is left as it is and no row is
/// returned: the claim is a mismatch.
fn claim_sql() -> String {
    let live = "p.expires_at >= $8 AND (p.completed_at IS NULL OR p.completed_at + $9 >= $8)";
    let same = "p.fingerprint_version = $4 AND p.fingerprint = $5";
    let keep = format!("($7 = 1 AND {same} AND {live})");
    let kept = |col: &str| format!("{col} = CASE WHEN {keep} THEN p.{col} END");
    format!(
        "INSERT INTO {TABLE} AS p (scope, idempotency_key, token, claims, fingerprint_version, \
         fingerprint, retention_ms, expires_at) VALUES ($1, $2, $3, 1, $4, $5, $10, $6) \
         ON CONFLICT (scope, idempotency_key) DO UPDATE SET \
         token = $3, claims = p.claims + 1, fingerprint_version = $4, fingerprint = $5, \
         retention_ms = $10, \
         expires_at = CASE WHEN p.expires_at > $6 THEN p.expires_at ELSE $6 END, \
         {}, {}, {}, {}, {}, {} \
         WHERE NOT ($7 = 1 AND {live} AND NOT ({same})) \
         RETURNING recovery_point, status, headers, body, body_retained, completed_at",
        kept("recovery_point"),
        kept("status"),
        kept("headers"),
        kept("body"),
        kept("body_retained"),
        kept("completed_at"),
    )
}

/// `$1` scope, `$2` key, `$3` token, `$4` recovery point, `$5` the end of the renewed lease
/// (epoch milliseconds): the row is kept at least the claim's retention after it.
fn checkpoint_sql() -> String {
    format!(
        "UPDATE {TABLE} SET recovery_point = $4, \
         expires_at = CASE WHEN expires_at > $5 + retention_ms THEN expires_at \
         ELSE $5 + retention_ms END \
         WHERE scope = $1 AND idempotency_key = $2 AND token = $3"
    )
}

/// `$1` scope, `$2` key, `$3` token, `$4` status, `$5` headers, `$6` body, `$7` retained, `$8`
/// completed at, `$9` expires at.
fn complete_sql() -> String {
    format!(
        "UPDATE {TABLE} SET status = $4, headers = $5, body = $6, body_retained = $7, \
         completed_at = $8, expires_at = $9 \
         WHERE scope = $1 AND idempotency_key = $2 AND token = $3"
    )
}

/// `$1` now, `$2` batch.
fn reap_sql() -> String {
    format!(
        "DELETE FROM {TABLE} WHERE (scope, idempotency_key) IN \
         (SELECT scope, idempotency_key FROM {TABLE} WHERE expires_at < $1 LIMIT $2)"
    )
}

/// A row as the claim's `RETURNING` gives it.
type Returned = (
    Option<String>,
    Option<i32>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<bool>,
    Option<i64>,
);

fn corrupt(what: String) -> TxError {
    TxError::Store(oncely_core::StoreError::Corrupt(what))
}

fn found(row: Returned) -> Result<Found, TxError> {
    let (recovery_point, status, headers, body, retained, completed_at) = row;
    let response = match (status, completed_at) {
        (Some(status), Some(at)) => {
            let (headers, trailers) =
                StoredResponse::decode_header_fields(headers.as_deref().unwrap_or(b"[]"))
                    .map_err(|e| corrupt(format!("{TABLE}: headers: {e}")))?;
            let status = u16::try_from(status)
                .map_err(|e| corrupt(format!("{TABLE}: status {status}: {e}")))?;
            let response = StoredResponse::new(status, headers, body.unwrap_or_default())
                .with_trailers(trailers)
                .with_body_retained(retained.unwrap_or(true));
            Some((response, at))
        }
        _ => None,
    };
    Ok(Found {
        recovery_point,
        response,
    })
}

/// The ledger's statements, for each database a [`Split`](super::Split) store can keep its
/// business writes in. Sealed: implemented for `sqlx::Postgres` and `sqlx::Sqlite`.
#[async_trait::async_trait]
pub trait LedgerSql: sqlx::Database {
    /// Creates the table and its index if they do not exist, and checks that the table has
    /// every column (an error names the table when it has another shape).
    async fn create_ledger(pool: &sqlx::Pool<Self>) -> Result<(), sqlx::Error>;
    /// The claim's upsert, the first statement of the first phase's transaction; `None` when
    /// the row holds another request (a mismatch: the row is left as it was).
    async fn ledger_claim(
        conn: &mut Self::Connection,
        row: &ClaimRow<'_>,
    ) -> Result<Option<Found>, TxError>;
    /// A checkpoint's update; `false` when the row holds another token (fenced).
    async fn ledger_checkpoint(
        conn: &mut Self::Connection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        expires_at: UnixMillis,
    ) -> Result<bool, TxError>;
    /// The completion's update; `false` when the row holds another token (fenced).
    async fn ledger_complete(
        conn: &mut Self::Connection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        completed_at: UnixMillis,
        expires_at: UnixMillis,
    ) -> Result<bool, TxError>;
    /// Deletes up to `batch` rows past their expiry; how many.
    async fn ledger_reap(
        pool: &sqlx::Pool<Self>,
        now: UnixMillis,
        batch: usize,
    ) -> Result<u64, sqlx::Error>;
}

macro_rules! ledger_sql {
    ($db:ty, $blob:literal, $feature:literal, $lock:expr) => {
        #[cfg(feature = $feature)]
        #[async_trait::async_trait]
        impl LedgerSql for $db {
            async fn create_ledger(pool: &sqlx::Pool<Self>) -> Result<(), sqlx::Error> {
                let mut tx = pool.begin().await?;
                let lock: Option<&'static str> = $lock;
                if let Some(lock) = lock {
                    sqlx::query(lock).execute(&mut *tx).await?;
                }
                sqlx::query(sqlx::AssertSqlSafe(create_table($blob)))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(sqlx::AssertSqlSafe(check_sql()))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| {
                        sqlx::Error::Protocol(format!(
                            "the table {TABLE} exists with another shape than the split store's \
                             progress ledger ({e}); rename or drop it"
                        ))
                    })?;
                sqlx::query(CREATE_INDEX).execute(&mut *tx).await?;
                tx.commit().await
            }

            async fn ledger_claim(
                conn: &mut Self::Connection,
                row: &ClaimRow<'_>,
            ) -> Result<Option<Found>, TxError> {
                let returned: Option<Returned> = sqlx::query_as(sqlx::AssertSqlSafe(claim_sql()))
                    .bind(row.id.scope.as_str())
                    .bind(row.id.key.as_str())
                    .bind(row.token.0)
                    .bind(i64::from(row.fingerprint.version()))
                    .bind(row.fingerprint.digest().as_slice())
                    .bind(row.expires_at)
                    .bind(row.keep.value())
                    .bind(row.now)
                    .bind(millis(row.replay_window))
                    .bind(millis(row.retention))
                    .fetch_optional(&mut *conn)
                    .await?;
                returned.map(found).transpose()
            }

            async fn ledger_checkpoint(
                conn: &mut Self::Connection,
                id: &RecordKey,
                token: FencingToken,
                recovery_point: &str,
                expires_at: UnixMillis,
            ) -> Result<bool, TxError> {
                let done = sqlx::query(sqlx::AssertSqlSafe(checkpoint_sql()))
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .bind(token.0)
                    .bind(recovery_point)
                    .bind(expires_at)
                    .execute(&mut *conn)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn ledger_complete(
                conn: &mut Self::Connection,
                id: &RecordKey,
                token: FencingToken,
                response: &StoredResponse,
                completed_at: UnixMillis,
                expires_at: UnixMillis,
            ) -> Result<bool, TxError> {
                let done = sqlx::query(sqlx::AssertSqlSafe(complete_sql()))
                    .bind(id.scope.as_str())
                    .bind(id.key.as_str())
                    .bind(token.0)
                    .bind(i32::from(response.status))
                    .bind(response.encode_headers())
                    .bind(response.body.as_slice())
                    .bind(response.body_retained)
                    .bind(completed_at)
                    .bind(expires_at)
                    .execute(&mut *conn)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn ledger_reap(
                pool: &sqlx::Pool<Self>,
                now: UnixMillis,
                batch: usize,
            ) -> Result<u64, sqlx::Error> {
                let done = sqlx::query(sqlx::AssertSqlSafe(reap_sql()))
                    .bind(now)
                    .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                    .execute(pool)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}

// Two PostgreSQL sessions running `CREATE TABLE IF NOT EXISTS` for one name at once can collide
// in the catalog (a unique violation on `pg_type`): servers starting together take turns.
ledger_sql!(
    sqlx::Postgres,
    "BYTEA",
    "postgres",
    Some("SELECT pg_advisory_xact_lock(7461621079)")
);
ledger_sql!(sqlx::Sqlite, "BLOB", "sqlite", None);
