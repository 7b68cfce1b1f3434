//! [`Operator`](oncely_core::Operator) on PostgreSQL, written once in
//! [`oncely_core::store::guarded`]: this file gives its statements. The listing is one query in
//! primary key order from the cursor; every change is one guarded `UPDATE ... RETURNING` (the
//! record still the version read, and [`check_change`](oncely_core::check_change)'s
//! conditions), a transaction of its own, retried on a transient conflict.

use crate::error::{map, retry_transient};
use crate::row::record_from_row;
use crate::sql;
use crate::store::PostgresStore;
use async_trait::async_trait;
use oncely_core::store::guarded::{ChangeWrite, GuardedChange, GuardedStore, PageQuery};
use oncely_core::{Record, StoreError, UnixMillis};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// The guarded `UPDATE` of `c`: the guard's parameters (scope, key, the token and the state
/// read; and the new token), then the change's own.
fn change_query<'q>(c: &'q GuardedChange<'_>) -> PgQuery<'q> {
    let guarded = |statement: &'static str| {
        sqlx::query(statement)
            .bind(c.id.scope.as_str())
            .bind(c.id.key.as_str())
            .bind(c.seen.token.0)
            .bind(c.seen.state)
            .bind(c.next_token().0)
    };
    match c.write {
        ChangeWrite::Release { force } => guarded(sql::RELEASE_RECORD).bind(force).bind(c.now),
        ChangeWrite::Resolve {
            force,
            response,
            headers,
            expires_at,
        } => guarded(sql::RESOLVE_RECORD)
            .bind(force)
            .bind(c.now)
            .bind(i32::from(response.status))
            .bind(headers)
            .bind(&response.body[..])
            .bind(response.body_retained)
            .bind(expires_at),
        ChangeWrite::Retry { attempts } => {
            guarded(sql::RETRY_RECORD).bind(i32::try_from(attempts).unwrap_or(i32::MAX))
        }
    }
}

#[async_trait]
impl GuardedStore for PostgresStore {
    fn now_millis(&self) -> UnixMillis {
        self.clock().now_millis()
    }

    async fn read_page(&self, page: &PageQuery<'_>) -> Result<Vec<Record>, StoreError> {
        let rows = retry_transient!(
            sqlx::query(sql::LIST_RECORDS)
                .bind(page.scope())
                .bind(page.after_scope)
                .bind(page.after_key)
                .bind(page.filter.in_flight)
                .bind(page.filter.marked)
                .bind(page.filter.abandoned)
                .bind(page.now)
                .bind(page.created_at_most)
                .bind(page.limit)
                .fetch_all(self.pool())
                .await
                .map_err(map)
        )?;
        rows.iter().map(record_from_row).collect()
    }

    async fn write_change(&self, c: &GuardedChange<'_>) -> Result<Option<Record>, StoreError> {
        let row = retry_transient!(
            change_query(c)
                .fetch_optional(self.pool())
                .await
                .map_err(map)
        )?;
        row.as_ref().map(record_from_row).transpose()
    }
}

oncely_core::guarded_operator!(PostgresStore);
