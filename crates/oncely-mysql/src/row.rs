//! Decoding a stored row into a [`Record`]: every column is checked, and anything that does not
//! fit the three-state record is [`StoreError::Corrupt`], never a panic.

use crate::error::map;
use oncely_core::{
    FencingToken, Fingerprint, IdempotencyKey, Record, RecordState, Redrives, Scope, StoreError,
    StoredRequest, StoredResponse,
};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

/// A binary column that holds UTF-8 text (scope and key are `VARBINARY`, see the migration).
fn text(row: &MySqlRow, column: &str) -> Result<String, StoreError> {
    let bytes: Vec<u8> = row.try_get(column).map_err(map)?;
    String::from_utf8(bytes).map_err(|e| corrupt(column, e))
}

/// Decodes a row selected with the crate's record column list.
pub(crate) fn record_from_row(row: &MySqlRow) -> Result<Record, StoreError> {
    let scope = text(row, "scope")?;
    let key = text(row, "key")?;
    let key = IdempotencyKey::new(&key).map_err(|e| corrupt("key", e))?;
    let version: i32 = row.try_get("fingerprint_version").map_err(map)?;
    let digest: Vec<u8> = row.try_get("fingerprint").map_err(map)?;
    let fingerprint = Fingerprint::from_stored(i64::from(version), &digest)
        .map_err(|e| corrupt("fingerprint", e))?;
    let state_name: String = row.try_get("state").map_err(map)?;
    let state = match state_name.as_str() {
        "in_flight" => RecordState::InFlight {
            lease_expires_at: row
                .try_get::<Option<i64>, _>("lease_expires_at")
                .map_err(map)?
                .ok_or_else(|| corrupt("lease_expires_at", "missing on an in-flight record"))?,
            recovery_point: row.try_get("recovery_point").map_err(map)?,
        },
        "complete" => {
            let status: Option<i32> = row.try_get("response_status").map_err(map)?;
            let status = status.ok_or_else(|| corrupt("response_status", "missing"))?;
            let headers: Option<Vec<u8>> = row.try_get("response_headers").map_err(map)?;
            let headers = headers.ok_or_else(|| corrupt("response_headers", "missing"))?;
            let (headers, trailers) = StoredResponse::decode_header_fields(&headers)
                .map_err(|e| corrupt("response_headers", e))?;
            let body: Option<Vec<u8>> = row.try_get("response_body").map_err(map)?;
            let retained: Option<bool> = row.try_get("response_body_retained").map_err(map)?;
            let completed_at: Option<i64> = row.try_get("completed_at").map_err(map)?;
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
    let request: Option<Vec<u8>> = row.try_get("request").map_err(map)?;
    let request = request
        .map(|b| StoredRequest::decode(&b))
        .transpose()
        .map_err(|e| corrupt("request", e))?;
    let redrives = redrives_from_row(row, "redrive_attempts", "redrive_next_at", "marked_at")?;
    Ok(Record::new(
        Scope::new(scope),
        key,
        fingerprint,
        FencingToken(row.try_get("token").map_err(map)?),
        state,
        row.try_get("created_at").map_err(map)?,
        row.try_get("expires_at").map_err(map)?,
    )
    .with_request(request)
    .with_redrives(redrives))
}

/// Reads the completer's three columns (by name or position).
pub(crate) fn redrives_from_row<I: sqlx::ColumnIndex<MySqlRow>>(
    row: &MySqlRow,
    attempts: I,
    next: I,
    marked: I,
) -> Result<Redrives, StoreError> {
    let n: i32 = row.try_get(attempts).map_err(map)?;
    Ok(Redrives::new(
        u32::try_from(n).map_err(|e| corrupt("redrive_attempts", e))?,
        row.try_get(next).map_err(map)?,
        row.try_get(marked).map_err(map)?,
    ))
}
