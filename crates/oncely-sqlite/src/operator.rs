//! [`Operator`](oncely_core::Operator) on SQLite, written once in
//! [`oncely_core::store::guarded`]: this file gives its statements. The listing is one query in
//! primary key order from the cursor; every change is one guarded `UPDATE ... RETURNING` (the
//! record still the version read, and [`check_change`](oncely_core::check_change)'s
//! conditions), a transaction of its own.

use crate::error::map_sqlx;
use crate::row::decode_record;
use crate::sql;
use crate::store::SqliteStore;
use async_trait::async_trait;
use oncely_core::store::guarded::{ChangeWrite, GuardedChange, GuardedStore, PageQuery};
use oncely_core::{Record, StoreError, UnixMillis};

#[async_trait]
impl GuardedStore for SqliteStore {
    fn now_millis(&self) -> UnixMillis {
        self.clock().now_millis()
    }

    async fn read_page(&self, page: &PageQuery<'_>) -> Result<Vec<Record>, StoreError> {
        sqlx::query(sql::LIST_RECORDS)
            .bind(page.scope())
            .bind(page.after_scope)
            .bind(page.after_key)
            .bind(i64::from(page.filter.in_flight))
            .bind(i64::from(page.filter.marked))
            .bind(i64::from(page.filter.abandoned))
            .bind(page.now)
            .bind(page.created_at_most)
            .bind(page.limit)
            .fetch_all(self.pool())
            .await
            .map_err(map_sqlx)?
            .iter()
            .map(decode_record)
            .collect()
    }

    async fn write_change(&self, c: &GuardedChange<'_>) -> Result<Option<Record>, StoreError> {
        // The guard's parameters: scope, key, the token and the state read; and the new token.
        let guarded = |statement: &'static str| {
            sqlx::query(statement)
                .bind(c.id.scope.as_str())
                .bind(c.id.key.as_str())
                .bind(c.seen.token.0)
                .bind(c.seen.state)
                .bind(c.next_token().0)
        };
        let query = match c.write {
            ChangeWrite::Release { force } => guarded(sql::RELEASE_RECORD)
                .bind(i64::from(force))
                .bind(c.now),
            ChangeWrite::Resolve {
                force,
                response,
                headers,
                expires_at,
            } => guarded(sql::RESOLVE_RECORD)
                .bind(i64::from(force))
                .bind(c.now)
                .bind(i64::from(response.status))
                .bind(headers)
                .bind(&response.body[..])
                .bind(i64::from(response.body_retained))
                .bind(expires_at),
            ChangeWrite::Retry { attempts } => guarded(sql::RETRY_RECORD).bind(i64::from(attempts)),
        };
        let row = query.fetch_optional(self.pool()).await.map_err(map_sqlx)?;
        row.as_ref().map(decode_record).transpose()
    }
}

oncely_core::guarded_operator!(SqliteStore);
