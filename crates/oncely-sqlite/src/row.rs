//! Decoding a stored row into a [`Record`]: every column is checked, and anything that does not
//! fit the three-state record is [`StoreError::Corrupt`], never a panic.

use oncely_core::{
    FencingToken, Fingerprint, IdempotencyKey, Record, RecordState, Redrives, Scope, StoreError,
    StoredRequest, StoredResponse,
};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

/// Decodes a row selected with the crate's record column list.
pub(crate) fn decode_record(row: &SqliteRow) -> Result<Record, StoreError> {
    let scope: String = col(row, "scope")?;
    let key: String = col(row, "key")?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("({scope:?}, {key:?}): {what}"));

    let key_parsed =
        IdempotencyKey::new(&key).map_err(|e| corrupt(&format!("invalid key: {e}")))?;
    let fingerprint = Fingerprint::from_stored(
        col(row, "fingerprint_version")?,
        &col::<Vec<u8>>(row, "fingerprint")?,
    )
    .map_err(|e| corrupt(&e.to_string()))?;
    let token = FencingToken(col(row, "token")?);
    let state_name: String = col(row, "state")?;

    let state = match state_name.as_str() {
        "in_flight" => RecordState::InFlight {
            lease_expires_at: col::<Option<i64>>(row, "lease_expires_at")?
                .ok_or_else(|| corrupt("in flight without a lease"))?,
            recovery_point: col(row, "recovery_point")?,
        },
        "complete" => {
            let status: i64 = col::<Option<i64>>(row, "response_status")?
                .ok_or_else(|| corrupt("complete without a status"))?;
            let status = u16::try_from(status)
                .ok()
                .filter(|s| (100..=999).contains(s))
                .ok_or_else(|| corrupt(&format!("invalid status {status}")))?;
            let headers = col::<Option<Vec<u8>>>(row, "response_headers")?
                .ok_or_else(|| corrupt("complete without headers"))?;
            let (headers, trailers) = StoredResponse::decode_header_fields(&headers)
                .map_err(|e| corrupt(&format!("headers: {e}")))?;
            let body_retained = match col::<Option<i64>>(row, "response_body_retained")? {
                Some(0) => false,
                Some(1) => true,
                other => return Err(corrupt(&format!("body_retained {other:?}"))),
            };
            RecordState::Complete {
                response: StoredResponse::new(
                    status,
                    headers,
                    // A zero-length body may come back as NULL: both are the empty body.
                    col::<Option<Vec<u8>>>(row, "response_body")?.unwrap_or_default(),
                )
                .with_body_retained(body_retained)
                .with_trailers(trailers),
                completed_at: col::<Option<i64>>(row, "completed_at")?
                    .ok_or_else(|| corrupt("complete without completed_at"))?,
            }
        }
        "released" => RecordState::Released,
        other => return Err(corrupt(&format!("unknown state {other:?}"))),
    };

    let request = match col::<Option<Vec<u8>>>(row, "request")? {
        None => None,
        Some(bytes) => {
            Some(StoredRequest::decode(&bytes).map_err(|e| corrupt(&format!("request: {e}")))?)
        }
    };

    let redrives = Redrives::new(
        u32::try_from(col::<i64>(row, "redrive_attempts")?)
            .map_err(|_| corrupt("redrive_attempts out of range"))?,
        col(row, "redrive_next_at")?,
        col(row, "marked_at")?,
    );

    Ok(Record::new(
        Scope::new(scope.clone()),
        key_parsed,
        fingerprint,
        token,
        state,
        col(row, "created_at")?,
        col(row, "expires_at")?,
    )
    .with_request(request)
    .with_redrives(redrives))
}

/// One column, with a type mismatch (or NULL where a value is required) as `Corrupt`.
fn col<'r, T>(row: &'r SqliteRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(name)
        .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
}
