//! Decoding a stored row into a [`Record`]: `oncely_sql`'s decoding (every column checked,
//! anything that does not fit the three-state record [`StoreError::Corrupt`]), with the scope
//! and key as PostgreSQL's `TEXT`.

use oncely_core::{Record, StoreError};
use oncely_sql::TextColumns;
use sqlx::postgres::PgRow;

pub(crate) use oncely_sql::redrives_from_row;

/// Decodes a row selected with the `record_columns!()` list.
pub(crate) fn record_from_row(row: &PgRow) -> Result<Record, StoreError> {
    oncely_sql::record_from_row(row, TextColumns::Text)
}
