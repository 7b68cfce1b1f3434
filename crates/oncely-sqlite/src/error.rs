//! How database errors become [`StoreError`]s.

use oncely_core::StoreError;

/// Maps a sqlx error: anything about reading a row's values is [`StoreError::Corrupt`];
/// everything else (`SQLITE_BUSY` after the busy timeout, a pool timeout, I/O, a closed pool, a
/// full disk) is [`StoreError::Unavailable`], so the layer fails closed with `503`.
///
/// No claim path can see a unique violation: the claim's insert uses `ON CONFLICT DO NOTHING`,
/// so losing the race is the "record exists" path (case S11).
pub(crate) fn map_sqlx(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(other),
    }
}
