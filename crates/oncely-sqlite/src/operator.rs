//! [`Operator`] on SQLite: the listing is one query in primary key order from the cursor;
//! every change is one guarded `UPDATE ... RETURNING` (the record still the version read, and
//! [`check_change`](oncely_core::check_change)'s conditions), a transaction of its own.

use crate::error::map_sqlx;
use crate::row::decode_record;
use crate::sql;
use crate::store::SqliteStore;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::store::operator::{self, Change};
use oncely_core::{
    KeyStore, Operator, OperatorError, Record, RecordFilter, RecordKey, RecordPage, RecordVersion,
    StoredResponse,
};
use sqlx::Sqlite;
use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use std::time::Duration;

impl SqliteStore {
    /// Runs a guarded change (its first four parameters bound: scope, key, token and state
    /// read) and returns the record it wrote, or why it matched no row.
    async fn change(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        change: Change,
        now: i64,
        query: Query<'_, Sqlite, SqliteArguments>,
    ) -> Result<Record, OperatorError> {
        match query.fetch_optional(self.pool()).await.map_err(map_sqlx)? {
            Some(row) => Ok(decode_record(&row)?),
            None => {
                let current = self.get(id).await?;
                Err(operator::missed(current.as_ref(), seen, change, now))
            }
        }
    }
}

/// The guard's parameters: scope, key, the token and the state read.
fn guarded<'q>(
    statement: &'static str,
    id: &'q RecordKey,
    seen: RecordVersion,
) -> Query<'q, Sqlite, SqliteArguments> {
    sqlx::query(statement)
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .bind(seen.token.0)
        .bind(seen.state)
        .bind(seen.next_token().0)
}

#[async_trait]
impl Operator for SqliteStore {
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        let limit = operator::page_size(limit);
        let (after_scope, after_key) = operator::cursor_start(cursor)?;
        let now = self.clock().now_millis();
        let read = sqlx::query(sql::LIST_RECORDS)
            .bind(filter.scope.as_ref().map(|s| s.as_str()))
            .bind(after_scope)
            .bind(after_key)
            .bind(i64::from(filter.in_flight))
            .bind(i64::from(filter.marked))
            .bind(i64::from(filter.abandoned))
            .bind(now)
            .bind(filter.created_at_most(now))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(decode_record)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(operator::page_of(read, limit, filter, now))
    }

    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError> {
        let now = self.clock().now_millis();
        let query = guarded(sql::RELEASE_RECORD, id, seen)
            .bind(i64::from(force))
            .bind(now);
        self.change(id, seen, Change::Release { force }, now, query)
            .await
    }

    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError> {
        let now = self.clock().now_millis();
        let query = guarded(sql::RESOLVE_RECORD, id, seen)
            .bind(i64::from(force))
            .bind(now)
            .bind(i64::from(response.status))
            .bind(response.encode_headers())
            .bind(response.body.clone())
            .bind(i64::from(response.body_retained))
            .bind(now.saturating_add(duration_millis(retention)));
        self.change(id, seen, Change::Resolve { force }, now, query)
            .await
    }

    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError> {
        let now = self.clock().now_millis();
        let query = guarded(sql::RETRY_RECORD, id, seen).bind(i64::from(attempts));
        self.change(id, seen, Change::Retry, now, query).await
    }
}
