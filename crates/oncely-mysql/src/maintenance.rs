//! [`Maintenance`] on MySQL and MariaDB: the reaper's batches, the completer's lists and notes.
//! A reaper batch and a completer note are each one transaction, run again after a deadlock;
//! the lists are one statement on the pool.

use crate::error::{map, retry_deadlocks};
use crate::row::{record_from_row, redrives_from_row};
use crate::sql;
use crate::store::MySqlStore;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::{
    FencingToken, Maintenance, ReapReport, Record, RecordKey, RedriveNote, Redrives, StoreError,
    UnixMillis,
};
use sqlx::{MySql, Row};
use std::time::Duration;

impl MySqlStore {
    /// One reaper batch in one transaction: lock the oldest rows past retention (skipping rows
    /// others hold), delete exactly them, commit.
    async fn reap_once(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let now = self.clock().now_millis();
        let limit = i64::try_from(batch.min(Self::MAX_REAP_BATCH)).unwrap_or(i64::MAX);
        let mut tx = self.begin_tx().await?;
        let rows = sqlx::query(sql::REAP_SELECT)
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        let mut report = ReapReport::default();
        if rows.is_empty() {
            // Nothing locked but the scan's range: the rollback goes out with the pool's
            // release of the connection.
            return Ok(report);
        }
        let mut delete = sqlx::QueryBuilder::<MySql>::new(sql::REAP_DELETE_HEAD);
        let mut list = delete.separated(", ");
        for row in &rows {
            let scope: Vec<u8> = row.try_get(0).map_err(map)?;
            let key: Vec<u8> = row.try_get(1).map_err(map)?;
            let state: String = row.try_get(2).map_err(map)?;
            if state == "in_flight" {
                report.orphaned += 1;
                tracing::warn!(
                    scope = %String::from_utf8_lossy(&scope),
                    key = %String::from_utf8_lossy(&key),
                    "reaped an in-flight record: its request was abandoned and never finished"
                );
            }
            list.push("(")
                .push_bind_unseparated(scope)
                .push_unseparated(", ")
                .push_bind_unseparated(key)
                .push_unseparated(")");
        }
        delete.push(")");
        let deleted = delete.build().execute(&mut *tx).await.map_err(map)?;
        tx.commit().await.map_err(map)?;
        report.deleted = deleted.rows_affected();
        Ok(report)
    }

    /// One completer note in one transaction: the guarded `UPDATE`, then its result read back
    /// under the row lock the update took.
    async fn note_once(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        statement: &'static str,
        now: UnixMillis,
        value: UnixMillis,
    ) -> Result<Redrives, StoreError> {
        let seen = i32::try_from(attempts_seen).unwrap_or(i32::MAX);
        let mut tx = self.begin_tx().await?;
        let noted = sqlx::query(statement)
            .bind(value)
            .bind(id.scope.as_str().as_bytes())
            .bind(id.key.as_str().as_bytes())
            .bind(token.0)
            .bind(now)
            .bind(seen)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        if noted.rows_affected() == 0 {
            return Err(StoreError::Fenced);
        }
        let row = sqlx::query(sql::SELECT_REDRIVES)
            .bind(id.scope.as_str().as_bytes())
            .bind(id.key.as_str().as_bytes())
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let redrives = redrives_from_row(&row, 0, 1, 2)?;
        tx.commit().await.map_err(map)?;
        Ok(redrives)
    }
}

#[async_trait]
impl Maintenance for MySqlStore {
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        retry_deadlocks!(self.reap_once(batch).await)
    }

    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let now = self.clock().now_millis();
        let cutoff = now.saturating_sub(duration_millis(grace));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(sql::LIST_ABANDONED)
            .bind(cutoff)
            .bind(now)
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
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
        retry_deadlocks!(
            self.note_once(id, token, attempts_seen, statement, now, value)
                .await
        )
    }

    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(sql::LIST_MARKED)
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        rows.iter().map(record_from_row).collect()
    }
}
