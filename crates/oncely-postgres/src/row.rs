//! Decoding a stored row into a [`Record`]: every column is checked, and anything that does not
//! fit the three-state record is [`StoreError::Corrupt`], never a panic.

use crate::error::map;
use oncely_core::{
    FencingToken, Fingerprint, IdempotencyKey, Record, RecordState, Redrives, Scope, StoreError,
    StoredRequest, StoredResponse,
};
use sqlx::Row;
use sqlx::postgres::PgRow;

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

/// Decodes a row selected with the `record_columns!()` list.
pub(crate) fn record_from_row(row: &PgRow) -> Result<Record, StoreError> {
    let scope: String = row.try_get("scope").map_err(map)?;
    let key: String = row.try_get("key").map_err(map)?;
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
            let status: i32 = row.try_get("response_status").map_err(map)?;
            let headers: Vec<u8> = row.try_get("response_headers").map_err(map)?;
            let (headers, trailers) = StoredResponse::decode_header_fields(&headers)
                .map_err(|e| corrupt("response_headers", e))?;
            RecordState::Complete {
                response: StoredResponse::new(
                    u16::try_from(status).map_err(|e| corrupt("response_status", e))?,
                    headers,
                    row.try_get("response_body").map_err(map)?,
                )
                .with_body_retained(row.try_get("response_body_retained").map_err(map)?)
                .with_trailers(trailers),
                completed_at: row.try_get("completed_at").map_err(map)?,
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
pub(crate) fn redrives_from_row<I: sqlx::ColumnIndex<PgRow>>(
    row: &PgRow,
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
