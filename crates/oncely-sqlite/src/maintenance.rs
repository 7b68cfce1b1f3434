//! [`Maintenance`] for [`SqliteStore`]: the reaper's and the completer's operations.

use crate::error::map_sqlx;
use crate::row::decode_record;
use crate::sql;
use crate::store::SqliteStore;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::{
    FencingToken, Maintenance, ReapReport, Record, RecordKey, RedriveNote, Redrives, StoreError,
};
use std::time::Duration;

#[async_trait]
impl Maintenance for SqliteStore {
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        use sqlx::Row;
        let now = self.clock.now_millis();
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let rows = sqlx::query(sql::REAP_BATCH)
            .bind(now)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        let mut report = ReapReport::default();
        for row in rows {
            report.deleted += 1;
            let state: String = row.try_get("state").map_err(map_sqlx)?;
            if state == "in_flight" {
                report.orphaned += 1;
            }
        }
        Ok(report)
    }

    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let now = self.clock.now_millis();
        let cutoff = now.saturating_sub(duration_millis(grace));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        sqlx::query(sql::LIST_ABANDONED)
            .bind(cutoff)
            .bind(limit)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(decode_record)
            .collect()
    }

    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        use sqlx::Row;
        let now = self.clock.now_millis();
        let (statement, first) = match note {
            RedriveNote::Attempt { backoff } => (
                sql::NOTE_ATTEMPT,
                now.saturating_add(duration_millis(backoff)),
            ),
            RedriveNote::Mark => (sql::NOTE_MARK, now),
            _ => return Err(StoreError::Fenced),
        };
        let row = sqlx::query(statement)
            .bind(first)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(now)
            .bind(i64::from(attempts_seen))
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?
            .ok_or(StoreError::Fenced)?;
        let attempts: i64 = row.try_get(0).map_err(map_sqlx)?;
        Ok(Redrives::new(
            u32::try_from(attempts)
                .map_err(|_| StoreError::Corrupt(format!("redrive_attempts {attempts}")))?,
            row.try_get(1).map_err(map_sqlx)?,
            row.try_get(2).map_err(map_sqlx)?,
        ))
    }

    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        sqlx::query(sql::LIST_MARKED)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(decode_record)
            .collect()
    }
}
