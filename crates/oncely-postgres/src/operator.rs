//! [`Operator`] on PostgreSQL: the listing is one query in primary key order from the cursor;
//! every change is one guarded `UPDATE ... RETURNING` (the record still the version read, and
//! [`check_change`](oncely_core::check_change)'s conditions), a transaction of its own,
//! retried on a transient conflict.

use crate::error::{map, retry_transient};
use crate::row::record_from_row;
use crate::sql;
use crate::store::PostgresStore;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::store::operator::{self, Change};
use oncely_core::{
    KeyStore, Operator, OperatorError, Record, RecordFilter, RecordKey, RecordPage, RecordVersion,
    StoredResponse,
};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use std::time::Duration;

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

impl PostgresStore {
    /// Runs a guarded change (`query` builds it, its first five parameters bound by
    /// [`guarded`]) and returns the record it wrote, or why it matched no row.
    async fn change<'q>(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        change: Change,
        now: i64,
        query: impl Fn() -> PgQuery<'q> + Send + Sync,
    ) -> Result<Record, OperatorError> {
        let row = retry_transient!(query().fetch_optional(self.pool()).await.map_err(map))?;
        match row {
            Some(row) => Ok(record_from_row(&row)?),
            None => {
                let current = self.get(id).await?;
                Err(operator::missed(current.as_ref(), seen, change, now))
            }
        }
    }
}

/// The guard's parameters: scope, key, the token and the state read; and the new token.
fn guarded<'q>(statement: &'static str, id: &'q RecordKey, seen: RecordVersion) -> PgQuery<'q> {
    sqlx::query(statement)
        .bind(id.scope.as_str())
        .bind(id.key.as_str())
        .bind(seen.token.0)
        .bind(seen.state)
        .bind(seen.next_token().0)
}

#[async_trait]
impl Operator for PostgresStore {
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        let limit = operator::page_size(limit);
        let (after_scope, after_key) = operator::cursor_start(cursor)?;
        let now = self.clock().now_millis();
        let rows = retry_transient!(
            sqlx::query(sql::LIST_RECORDS)
                .bind(filter.scope.as_ref().map(|s| s.as_str()))
                .bind(after_scope.as_str())
                .bind(after_key.as_str())
                .bind(filter.in_flight)
                .bind(filter.marked)
                .bind(filter.abandoned)
                .bind(now)
                .bind(filter.created_at_most(now))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(map)
        )?;
        let read = rows
            .iter()
            .map(record_from_row)
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
        let query = || guarded(sql::RELEASE_RECORD, id, seen).bind(force).bind(now);
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
        let headers = response.encode_headers();
        let query = || {
            guarded(sql::RESOLVE_RECORD, id, seen)
                .bind(force)
                .bind(now)
                .bind(i32::from(response.status))
                .bind(headers.clone())
                .bind(response.body.clone())
                .bind(response.body_retained)
                .bind(now.saturating_add(duration_millis(retention)))
        };
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
        let attempts = i32::try_from(attempts).unwrap_or(i32::MAX);
        let query = || guarded(sql::RETRY_RECORD, id, seen).bind(attempts);
        self.change(id, seen, Change::Retry, now, query).await
    }
}
