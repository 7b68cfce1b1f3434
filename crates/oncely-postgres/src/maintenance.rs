//! [`Maintenance`] on PostgreSQL: the reaper's batches, the completer's lists and notes. Each is
//! one statement on the pool (a transaction of its own), retried on a transient conflict.

use crate::error::{map, retry_transient};
use crate::row::{record_from_row, redrives_from_row};
use crate::sql;
use crate::store::PostgresStore;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::{
    FencingToken, Maintenance, ReapReport, Record, RecordKey, RedriveNote, Redrives, StoreError,
};
use sqlx::Row;
use std::time::Duration;

#[async_trait]
impl Maintenance for PostgresStore {
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let now = self.clock().now_millis();
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let rows = retry_transient!(
            sqlx::query(sql::REAP)
                .bind(now)
                .bind(limit)
                .fetch_all(self.pool())
                .await
                .map_err(map)
        )?;
        let mut report = ReapReport::default();
        for row in &rows {
            report.deleted += 1;
            let state: &str = row.try_get(2).map_err(map)?;
            if state == "in_flight" {
                report.orphaned += 1;
                let scope: &str = row.try_get(0).map_err(map)?;
                let key: &str = row.try_get(1).map_err(map)?;
                tracing::warn!(
                    scope,
                    key,
                    "reaped an in-flight record: its request was abandoned and never finished"
                );
            }
        }
        Ok(report)
    }

    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let now = self.clock().now_millis();
        let cutoff = now.saturating_sub(duration_millis(grace));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = retry_transient!(
            sqlx::query(sql::LIST_ABANDONED)
                .bind(cutoff)
                .bind(limit)
                .bind(now)
                .fetch_all(self.pool())
                .await
                .map_err(map)
        )?;
        rows.iter().map(record_from_row).collect()
    }

    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        let now = self.clock().now_millis();
        let (statement, value) = match note {
            RedriveNote::Attempt { backoff } => (
                sql::NOTE_ATTEMPT,
                now.saturating_add(duration_millis(backoff)),
            ),
            RedriveNote::Mark => (sql::NOTE_MARK, now),
            _ => return Err(StoreError::Fenced),
        };
        let seen = i32::try_from(attempts_seen).unwrap_or(i32::MAX);
        let row = retry_transient!(
            sqlx::query(statement)
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .bind(token.0)
                .bind(now)
                .bind(seen)
                .bind(value)
                .fetch_optional(self.pool())
                .await
                .map_err(map)
        )?
        .ok_or(StoreError::Fenced)?;
        redrives_from_row(&row, 0, 1, 2)
    }

    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = retry_transient!(
            sqlx::query(sql::LIST_MARKED)
                .bind(limit)
                .fetch_all(self.pool())
                .await
                .map_err(map)
        )?;
        rows.iter().map(record_from_row).collect()
    }
}
