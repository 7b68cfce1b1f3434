//! [`Operator`] on MySQL / MariaDB: the listing is one query in primary key order from the
//! cursor; every change is one guarded `UPDATE` (the record still the version read, and
//! [`check_change`](oncely_core::check_change)'s conditions) and the read of what it wrote, in
//! one transaction (no `RETURNING` on MySQL), begun again when InnoDB chose it as a deadlock's
//! victim.

use crate::error::{map, retry_deadlocks};
use crate::row::record_from_row;
use crate::sql;
use crate::store::MySqlStore;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::store::operator::{self, Change};
use oncely_core::{
    KeyStore, Operator, OperatorError, Record, RecordFilter, RecordKey, RecordPage, RecordVersion,
    StoreError, StoredResponse,
};
use sqlx::MySql;
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use std::time::Duration;

type MyQuery<'q> = Query<'q, MySql, MySqlArguments>;

impl MySqlStore {
    /// Runs a guarded change (`query` builds it) and reads what it wrote, in one transaction;
    /// `None` when it matched no row.
    async fn change_once<'q>(
        &self,
        id: &RecordKey,
        query: &(impl Fn() -> MyQuery<'q> + Send + Sync),
    ) -> Result<Option<Record>, StoreError> {
        let mut tx = self.begin_tx().await?;
        let written = query().execute(&mut *tx).await.map_err(map)?;
        if written.rows_affected() == 0 {
            return Ok(None);
        }
        let row = sqlx::query(sql::SELECT_RECORD)
            .bind(id.scope.as_str().as_bytes())
            .bind(id.key.as_str().as_bytes())
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let rec = record_from_row(&row)?;
        tx.commit().await.map_err(map)?;
        Ok(Some(rec))
    }

    /// [`MySqlStore::change_once`], retried on a deadlock; why it matched no row.
    async fn change<'q>(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        change: Change,
        now: i64,
        query: impl Fn() -> MyQuery<'q> + Send + Sync,
    ) -> Result<Record, OperatorError> {
        match retry_deadlocks!(self.change_once(id, &query).await)? {
            Some(rec) => Ok(rec),
            None => {
                let current = self.get(id).await?;
                Err(operator::missed(current.as_ref(), seen, change, now))
            }
        }
    }
}

/// The guard's parameters (after the statement's `SET` values): scope, key, the token and the
/// state read.
fn guard<'q>(query: MyQuery<'q>, id: &'q RecordKey, seen: RecordVersion) -> MyQuery<'q> {
    query
        .bind(id.scope.as_str().as_bytes())
        .bind(id.key.as_str().as_bytes())
        .bind(seen.token.0)
        .bind(seen.state)
}

#[async_trait]
impl Operator for MySqlStore {
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        let limit = operator::page_size(limit);
        let (after_scope, after_key) = operator::cursor_start(cursor)?;
        let now = self.clock().now_millis();
        let scope = filter.scope.as_ref().map(|s| s.as_str().as_bytes());
        let created = filter.created_at_most(now);
        let rows = sqlx::query(sql::LIST_RECORDS)
            .bind(scope)
            .bind(scope)
            .bind(after_scope.as_bytes())
            .bind(after_scope.as_bytes())
            .bind(after_key.as_bytes())
            .bind(i32::from(filter.in_flight))
            .bind(i32::from(filter.marked))
            .bind(i32::from(filter.abandoned))
            .bind(now)
            .bind(created)
            .bind(created)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
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
        let query = || {
            let set = sqlx::query(sql::RELEASE_RECORD).bind(seen.next_token().0);
            guard(set, id, seen).bind(i32::from(force)).bind(now)
        };
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
            let set = sqlx::query(sql::RESOLVE_RECORD)
                .bind(seen.next_token().0)
                .bind(i32::from(response.status))
                .bind(headers.clone())
                .bind(response.body.clone())
                .bind(response.body_retained)
                .bind(now)
                .bind(now.saturating_add(duration_millis(retention)));
            guard(set, id, seen).bind(i32::from(force)).bind(now)
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
        let query = || {
            let set = sqlx::query(sql::RETRY_RECORD)
                .bind(seen.next_token().0)
                .bind(attempts);
            guard(set, id, seen)
        };
        self.change(id, seen, Change::Retry, now, query).await
    }
}
