//! [`TxError`]: why a transactional handler's phase could not go on, and the answer it renders.

use axum::response::{IntoResponse, Response};
use oncely_core::{Problem, StoreError};

/// Why a transactional phase failed. `#[non_exhaustive]`; render it with
/// [`IntoResponse`] (a handler can return `Result<Response, TxError>` and use `?` on its own
/// sqlx statements).
///
/// | variant | answer | what happened to the request |
/// |---|---|---|
/// | [`TxError::NoTransaction`] | `500 idempotency_layer_missing` | a server misconfiguration: no transactional layer on the route |
/// | [`TxError::AlreadyTaken`], [`TxError::AlreadyCompleted`] | `500 idempotency_handler_misuse` | a handler bug: two `Tx` extractors, or a phase begun after the commit |
/// | [`TxError::TransactionEnded`] | `500 idempotency_handler_misuse` | the handler ended the phase's transaction itself (see the variant) |
/// | [`TxError::ResponseFailed`] | `500 response_failed` | the response body broke while it was captured; nothing committed, a retry runs again |
/// | [`TxError::Fenced`] | `409 idempotency_request_in_flight`, `Retry-After` | this request lost its claim (its lease lapsed, another took over); nothing of this phase committed |
/// | [`TxError::Store`] | `503 idempotency_store_unavailable`, `Retry-After` | the key store failed; nothing of this phase committed |
/// | [`TxError::Database`], transient | `503 database_unavailable`, `Retry-After` | a connection, lock or serialization failure, a deadlock's victim; the phase rolled back, a retry with the same key runs it again |
/// | [`TxError::Database`], refused | `422 database_refused`, not retryable | the database refused a value for good (a constraint, a value of the wrong shape: SQLSTATE classes 22 and 23, SQLite constraint errors); retrying the same request cannot succeed |
/// | [`TxError::Database`], other | `500 database_error`, not retryable | also the answer to a handler that ignored a failed statement on PostgreSQL and went on to `Tx::commit` or `Tx::checkpoint`: the database had aborted the transaction (SQLSTATE `25P02`), so nothing of the phase committed (the original error is lost: return it with `?` to get its own answer) |
/// | [`TxError::RecoveryPoint`] | `500 recovery_point_invalid` | a stored recovery point does not decode as the handler's step type |
///
/// A phase that fails rolls back: for a single-phase handler that undoes the claim too, so the
/// key is free and a retry executes afresh, and the answer is the one in the table.
///
/// # After an earlier phase committed
///
/// When an earlier phase of the request committed a recovery point (in this attempt with
/// [`Tx::checkpoint`](crate::Tx::checkpoint), or in an attempt this one took over), "nothing
/// was committed" would be false: the layer keeps the record in flight at that recovery point
/// and cuts its lease short, so a retry with the same key resumes there. The
/// [`TxError::Database`], [`TxError::Store`] and [`TxError::ResponseFailed`] answers then
/// become `503 request_suspended`, `retryable: true`, `Retry-After: 1`, whose `detail` says
/// what failed and where the request stopped (the step's name: a JSON string step, the tag of
/// an externally tagged enum, or the `step` member of an internally tagged one). The error
/// cannot know this alone (a handler's `?` on its own statement makes it from a bare
/// `sqlx::Error`): its response carries a marker, and the layer asks the request's claim,
/// which knows ([`oncely_tower::PhaseFailed`]).
/// [`TxError::Fenced`] keeps its `409` (another attempt owns the request now).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The request carries no open transaction: the route is not behind
    /// [`layer`](crate::layer), or the request ran without a claim (a route whose key is
    /// optional or ignored).
    #[error("no idempotent transaction on this request (is the route behind oncely_sqlx::layer?)")]
    NoTransaction,
    /// The request's [`Tx`](crate::Tx) was taken already (two `Tx` extractors in one handler).
    #[error("this request's idempotent transaction was already taken by another Tx extractor")]
    AlreadyTaken,
    /// [`Between::begin`](crate::Between::begin) after the request completed.
    #[error("this request already completed; no phase can begin after Tx::commit")]
    AlreadyCompleted,
    /// The phase's transaction had ended before [`Tx::commit`](crate::Tx::commit) or
    /// [`Tx::checkpoint`](crate::Tx::checkpoint): the handler ran `COMMIT` or `ROLLBACK`
    /// through the [`Tx`](crate::Tx) (or the database rolled it back by itself), so the
    /// response or recovery point could no longer commit with the business writes. Nothing is
    /// recorded (no stored response, no recovery point).
    ///
    /// The key is **not released**, and is left as the database holds it: after a `COMMIT`
    /// the handler's writes (and, in the first phase, the claim) may have committed, and a
    /// released key would let a retry execute afresh over them at once. A first phase's
    /// claim thus stays in flight until its lease lapses (or is gone, after a `ROLLBACK`); a
    /// later phase's request is suspended at its last recovery point as after any failed
    /// phase. Then a retry, or the completer, resumes at the last recovery point a phase
    /// committed, which can repeat the broken phase's writes: it is a server bug, logged at
    /// `error`, and the answer is not retryable.
    ///
    /// Detected before recording on SQLite always (a savepoint, no I/O); on PostgreSQL and
    /// MySQL (a savepoint, one round trip) at
    /// [`Tx::checkpoint`](crate::Tx::checkpoint) and at the commit of a later phase, not at the
    /// commit of the phase that carries the claim (it would cost that hot path a round trip;
    /// see [`SqlStore::complete_in`](crate::SqlStore::complete_in)) unless its completion was
    /// fenced (a `ROLLBACK` undid the claim). There a `COMMIT` behind the back leaves the
    /// response stored by itself and answered, as its replays will be.
    #[error(
        "the handler ended its idempotent transaction itself (COMMIT or ROLLBACK through the Tx)"
    )]
    TransactionEnded,
    /// The response body failed while [`Tx::commit`](crate::Tx::commit) captured it; nothing
    /// was committed.
    #[error("the response body failed while it was captured; nothing was committed")]
    ResponseFailed,
    /// Another request owns the key now (this request's lease lapsed and it was taken over):
    /// nothing of this phase committed.
    #[error("fenced: another request took this idempotency key over")]
    Fenced,
    /// The key store failed.
    #[error("key store: {0}")]
    Store(#[source] StoreError),
    /// A database statement or the commit failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A recovery point could not be encoded or decoded as the handler's step type.
    #[error("recovery point: {0}")]
    RecoveryPoint(#[from] serde_json::Error),
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Fenced => Self::Fenced,
            other => Self::Store(other),
        }
    }
}

/// How a database error is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DbErrorClass {
    /// Worth retrying: connection, pool, lock, deadlock or serialization failures.
    Transient,
    /// The database refused a value or a constraint for good: the same request fails again.
    Refused,
    /// Anything else (a bug, a schema problem).
    Other,
}

/// Classifies an sqlx error (PostgreSQL SQLSTATE classes, MySQL and MariaDB error numbers and
/// SQLSTATEs, SQLite result codes).
pub fn classify(e: &sqlx::Error) -> DbErrorClass {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_) => DbErrorClass::Transient,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return classify_mysql(my.number(), my.code().unwrap_or_default());
            }
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // SQLite's codes are numbers; PostgreSQL's SQLSTATEs are five characters (often
            // digits too, so the driver decides).
            #[cfg(feature = "postgres")]
            let sqlite = db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_none();
            #[cfg(not(feature = "postgres"))]
            let sqlite = code.len() != 5;
            if let Some(n) = code.parse::<i32>().ok().filter(|_| sqlite) {
                // SQLite: extended result codes; the primary code is the low byte.
                return match n & 0xff {
                    5 | 6 | 10 | 13 => DbErrorClass::Transient, // BUSY, LOCKED, IOERR, FULL
                    18 | 19 | 20 | 25 => DbErrorClass::Refused, // TOOBIG, CONSTRAINT, MISMATCH, RANGE
                    _ => DbErrorClass::Other,
                };
            }
            match code.get(..2) {
                // Connection exceptions, transaction rollbacks (serialization, deadlock),
                // insufficient resources, operator intervention, lock not available.
                Some("08" | "40" | "53" | "57") => DbErrorClass::Transient,
                _ if code == "55P03" => DbErrorClass::Transient,
                // Data exceptions (a value of the wrong shape: U+0000 in text, out of range)
                // and integrity constraint violations.
                Some("22" | "23") => DbErrorClass::Refused,
                _ => DbErrorClass::Other,
            }
        }
        _ => DbErrorClass::Other,
    }
}

/// MySQL and MariaDB: by the server's error number first (their SQLSTATE is often the
/// catch-all `HY000`), then by the SQLSTATE's class as for PostgreSQL.
#[cfg(feature = "mysql")]
fn classify_mysql(number: u16, sqlstate: &str) -> DbErrorClass {
    match number {
        // Lock wait timeout, deadlock (the transaction was rolled back: run it again), too many
        // connections, server shutting down, query interrupted or over its time limit, a
        // connection killed (MariaDB).
        1205 | 1213 | 1040 | 1053 | 1317 | 3024 | 1927 => return DbErrorClass::Transient,
        // Values the table refuses for good in strict mode: truncated or wrong for the column
        // (1265, 1366), a bad date (1292), a CHECK constraint (MySQL 3819, MariaDB 4025).
        1265 | 1292 | 1366 | 3819 | 4025 => return DbErrorClass::Refused,
        _ => {}
    }
    match sqlstate.get(..2) {
        Some("08" | "40") => DbErrorClass::Transient,
        // Data exceptions (too long 1406, out of range 1264) and integrity constraints
        // (duplicate key 1062, NOT NULL 1048, foreign keys 1451 and 1452).
        Some("22" | "23") => DbErrorClass::Refused,
        _ => DbErrorClass::Other,
    }
}

impl IntoResponse for TxError {
    fn into_response(self) -> Response {
        use oncely_core::{ErrorCode, StatusProfile};
        let failed = match &self {
            TxError::Database(e) => Some(oncely_tower::PhaseFailed(match classify(e) {
                DbErrorClass::Transient => "the database failed transiently",
                DbErrorClass::Refused => "the database refused a value",
                DbErrorClass::Other => "the database failed",
            })),
            TxError::Store(_) => Some(oncely_tower::PhaseFailed(
                "the idempotency key store failed",
            )),
            TxError::ResponseFailed => Some(oncely_tower::PhaseFailed(
                "the response could not be produced",
            )),
            _ => None,
        };
        let (p, retry_after) = match &self {
            TxError::NoTransaction => (
                Problem::from_code(
                    ErrorCode::LayerMissing,
                    "this route needs an idempotent transaction, but the request carries none (server misconfiguration)",
                ),
                None,
            ),
            TxError::TransactionEnded => (oncely_tower::phase::ended_problem(), None),
            TxError::AlreadyTaken | TxError::AlreadyCompleted => (
                Problem::from_code(
                    ErrorCode::HandlerMisuse,
                    "the handler used its idempotent transaction wrongly (a second Tx extractor, or a step begun after the request completed); a server bug",
                ),
                None,
            ),
            TxError::ResponseFailed => (
                Problem::from_code(
                    ErrorCode::ResponseFailed,
                    "the response could not be produced completely; nothing was committed: retry with the same key",
                ),
                Some(1),
            ),
            TxError::Fenced => (
                Problem::new(
                    ErrorCode::RequestInFlight,
                    StatusProfile::Ietf,
                    "another attempt took this idempotency key over; retry with the same key to get its result",
                ),
                Some(1),
            ),
            TxError::Store(_) => (
                Problem::new(
                    ErrorCode::StoreUnavailable,
                    StatusProfile::Ietf,
                    "the idempotency key store failed; nothing of this step committed: retry with the same key",
                ),
                Some(1),
            ),
            TxError::Database(e) => match classify(e) {
                DbErrorClass::Transient => (
                    Problem::from_code(
                        ErrorCode::DatabaseUnavailable,
                        "the database failed transiently; nothing of this step committed: retry with the same key",
                    ),
                    Some(1),
                ),
                DbErrorClass::Refused => (
                    Problem::from_code(
                        ErrorCode::DatabaseRefused,
                        "the database refused a value of this request (a constraint or a value it cannot store); nothing was committed, and the same request cannot succeed",
                    ),
                    None,
                ),
                DbErrorClass::Other => (
                    Problem::from_code(
                        ErrorCode::DatabaseError,
                        "the request failed in the database; nothing was committed",
                    ),
                    None,
                ),
            },
            TxError::RecoveryPoint(_) => (
                Problem::from_code(
                    ErrorCode::RecoveryPointInvalid,
                    "the stored progress of this request cannot be read by this version of the server",
                ),
                None,
            ),
        };
        // The full error (driver messages, addresses) goes to the log, never to the client.
        tracing::warn!(error = %self, code = %p.code, "transactional phase failed");
        let p = match retry_after {
            Some(secs) => p.with_retry_after(secs),
            None => p,
        };
        let mut res = oncely_tower::problem_response(&p)
            .map(axum::body::Body::new)
            .into_response();
        if let Some(failed) = failed {
            res.extensions_mut().insert(failed);
        }
        res
    }
}
