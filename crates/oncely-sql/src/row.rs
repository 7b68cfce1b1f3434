//! Decoding a stored row into a [`Record`], on any database whose columns hold the record as
//! PostgreSQL's and MySQL's migrations keep it: every column is checked, and anything that does
//! not fit the three-state record is [`StoreError::Corrupt`], never a panic.

use crate::map_sqlx;
use oncely_core::{
    FencingToken, Fingerprint, IdempotencyKey, Record, RecordState, Redrives, Scope, StoreError,
    StoredRequest, StoredResponse,
};
use sqlx::{ColumnIndex, Database, Decode, Row, Type};

/// How a store keeps the record's text columns (`scope`, `key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TextColumns {
    /// As the database's text (PostgreSQL's `TEXT`).
    Text,
    /// As bytes that hold UTF-8 text (MySQL's `VARBINARY`, compared byte for byte): bytes that
    /// are not UTF-8 are [`StoreError::Corrupt`].
    Utf8Bytes,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

/// Decodes a row selected with a store's record column list: `scope`, `key` (as `text`
/// says), `fingerprint_version` (32-bit integer), `fingerprint` (bytes), `token` (64-bit),
/// `state` (`in_flight`, `complete` or `released`), `lease_expires_at` (epoch milliseconds,
/// required in flight), `recovery_point`, the response's `response_status` (32-bit),
/// `response_headers` (bytes), `response_body` (bytes) and `response_body_retained` (boolean)
/// with `completed_at` (all required when complete), `request` (bytes, or NULL),
/// `created_at`, `expires_at`, and the completer's columns ([`redrives_from_row`]).
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the column that is missing, does not decode or holds a value
/// the record cannot have (a key that is not a valid key, an unknown state, a status out of
/// range).
pub fn record_from_row<R>(row: &R, text_columns: TextColumns) -> Result<Record, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database>,
    String: Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database>,
    Vec<u8>: Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database>,
    i32: Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database>,
    i64: Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database>,
    bool: Type<R::Database>,
{
    let text = |column: &str| -> Result<String, StoreError> {
        match text_columns {
            TextColumns::Text => row.try_get(column).map_err(map_sqlx),
            TextColumns::Utf8Bytes => {
                let bytes: Vec<u8> = row.try_get(column).map_err(map_sqlx)?;
                String::from_utf8(bytes).map_err(|e| corrupt(column, e))
            }
        }
    };
    let scope = text("scope")?;
    let key = text("key")?;
    let key = IdempotencyKey::new(&key).map_err(|e| corrupt("key", e))?;
    let version: i32 = row.try_get("fingerprint_version").map_err(map_sqlx)?;
    let digest: Vec<u8> = row.try_get("fingerprint").map_err(map_sqlx)?;
    let fingerprint = Fingerprint::from_stored(i64::from(version), &digest)
        .map_err(|e| corrupt("fingerprint", e))?;
    let state_name: String = row.try_get("state").map_err(map_sqlx)?;
    let state = match state_name.as_str() {
        "in_flight" => RecordState::InFlight {
            lease_expires_at: row
                .try_get::<Option<i64>, _>("lease_expires_at")
                .map_err(map_sqlx)?
                .ok_or_else(|| corrupt("lease_expires_at", "missing on an in-flight record"))?,
            recovery_point: row.try_get("recovery_point").map_err(map_sqlx)?,
        },
        "complete" => {
            let status: Option<i32> = row.try_get("response_status").map_err(map_sqlx)?;
            let status = status.ok_or_else(|| corrupt("response_status", "missing"))?;
            let headers: Option<Vec<u8>> = row.try_get("response_headers").map_err(map_sqlx)?;
            let headers = headers.ok_or_else(|| corrupt("response_headers", "missing"))?;
            let (headers, trailers) = StoredResponse::decode_header_fields(&headers)
                .map_err(|e| corrupt("response_headers", e))?;
            let body: Option<Vec<u8>> = row.try_get("response_body").map_err(map_sqlx)?;
            let retained: Option<bool> = row.try_get("response_body_retained").map_err(map_sqlx)?;
            let completed_at: Option<i64> = row.try_get("completed_at").map_err(map_sqlx)?;
            RecordState::Complete {
                response: StoredResponse::new(
                    u16::try_from(status).map_err(|e| corrupt("response_status", e))?,
                    headers,
                    body.ok_or_else(|| corrupt("response_body", "missing"))?,
                )
                .with_body_retained(
                    retained.ok_or_else(|| corrupt("response_body_retained", "missing"))?,
                )
                .with_trailers(trailers),
                completed_at: completed_at.ok_or_else(|| corrupt("completed_at", "missing"))?,
            }
        }
        "released" => RecordState::Released,
        other => return Err(corrupt("state", other)),
    };
    let request: Option<Vec<u8>> = row.try_get("request").map_err(map_sqlx)?;
    let request = request
        .map(|b| StoredRequest::decode(&b))
        .transpose()
        .map_err(|e| corrupt("request", e))?;
    let redrives = redrives_from_row(row, "redrive_attempts", "redrive_next_at", "marked_at")?;
    Ok(Record::new(
        Scope::new(scope),
        key,
        fingerprint,
        FencingToken(row.try_get("token").map_err(map_sqlx)?),
        state,
        row.try_get("created_at").map_err(map_sqlx)?,
        row.try_get("expires_at").map_err(map_sqlx)?,
    )
    .with_request(request)
    .with_redrives(redrives))
}

/// Reads the completer's three columns, by name or by position: the re-drive attempts (a
/// 32-bit integer, never negative), the next attempt's time and the time the record was marked
/// for a person (epoch milliseconds, or NULL).
///
/// # Errors
///
/// [`StoreError::Corrupt`] when a column is missing, does not decode, or the attempts are
/// negative.
pub fn redrives_from_row<R, I>(
    row: &R,
    attempts: I,
    next: I,
    marked: I,
) -> Result<Redrives, StoreError>
where
    R: Row,
    I: ColumnIndex<R>,
    R::Database: Database,
    for<'r> i32: Decode<'r, R::Database>,
    i32: Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database>,
    i64: Type<R::Database>,
{
    let n: i32 = row.try_get(attempts).map_err(map_sqlx)?;
    Ok(Redrives::new(
        u32::try_from(n).map_err(|e| corrupt("redrive_attempts", e))?,
        row.try_get(next).map_err(map_sqlx)?,
        row.try_get(marked).map_err(map_sqlx)?,
    ))
}
