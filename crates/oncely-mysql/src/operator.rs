//! [`Operator`](oncely_core::Operator) on MySQL / MariaDB, written once in
//! [`oncely_core::store::guarded`]: this file gives its statements. The listing is one query in
//! primary key order from the cursor; every change is one guarded `UPDATE` (the record still the
//! version read, and [`check_change`](oncely_core::check_change)'s conditions) and the read of
//! what it wrote, in one transaction (no `RETURNING` on MySQL), begun again when InnoDB chose it
//! as a deadlock's victim.

use crate::error::{map, retry_deadlocks};
use crate::row::record_from_row;
use crate::sql;
use crate::store::MySqlStore;
use async_trait::async_trait;
use oncely_core::store::guarded::{ChangeWrite, GuardedChange, GuardedStore, PageQuery};
use oncely_core::{Record, StoreError, UnixMillis};
use sqlx::MySql;
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;

type MyQuery<'q> = Query<'q, MySql, MySqlArguments>;

/// The guarded `UPDATE` of `c`: the new token and the change's `SET` values, the guard's
/// parameters (scope, key, the token and the state read), then the change's rule.
fn change_query<'q>(c: &'q GuardedChange<'_>) -> MyQuery<'q> {
    let guard = |query: MyQuery<'q>| {
        query
            .bind(c.id.scope.as_str().as_bytes())
            .bind(c.id.key.as_str().as_bytes())
            .bind(c.seen.token.0)
            .bind(c.seen.state)
    };
    let set = |statement: &'static str| sqlx::query(statement).bind(c.next_token().0);
    match c.write {
        ChangeWrite::Release { force } => guard(set(sql::RELEASE_RECORD))
            .bind(i32::from(force))
            .bind(c.now),
        ChangeWrite::Resolve {
            force,
            response,
            headers,
            expires_at,
        } => {
            let values = set(sql::RESOLVE_RECORD)
                .bind(i32::from(response.status))
                .bind(headers)
                .bind(&response.body[..])
                .bind(response.body_retained)
                .bind(c.now)
                .bind(expires_at);
            guard(values).bind(i32::from(force)).bind(c.now)
        }
        ChangeWrite::Retry { attempts } => {
            guard(set(sql::RETRY_RECORD).bind(i32::try_from(attempts).unwrap_or(i32::MAX)))
        }
    }
}

impl MySqlStore {
    /// Runs the guarded change `c` and reads what it wrote, in one transaction; `None` when it
    /// matched no row.
    async fn change_once(&self, c: &GuardedChange<'_>) -> Result<Option<Record>, StoreError> {
        let mut tx = self.begin_tx().await?;
        let written = change_query(c).execute(&mut *tx).await.map_err(map)?;
        if written.rows_affected() == 0 {
            return Ok(None);
        }
        let row = sqlx::query(sql::SELECT_RECORD)
            .bind(c.id.scope.as_str().as_bytes())
            .bind(c.id.key.as_str().as_bytes())
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let rec = record_from_row(&row)?;
        tx.commit().await.map_err(map)?;
        Ok(Some(rec))
    }
}

#[async_trait]
impl GuardedStore for MySqlStore {
    fn now_millis(&self) -> UnixMillis {
        self.clock().now_millis()
    }

    async fn read_page(&self, page: &PageQuery<'_>) -> Result<Vec<Record>, StoreError> {
        let scope = page.scope().map(str::as_bytes);
        let rows = sqlx::query(sql::LIST_RECORDS)
            .bind(scope)
            .bind(scope)
            .bind(page.after_scope.as_bytes())
            .bind(page.after_scope.as_bytes())
            .bind(page.after_key.as_bytes())
            .bind(i32::from(page.filter.in_flight))
            .bind(i32::from(page.filter.marked))
            .bind(i32::from(page.filter.abandoned))
            .bind(page.now)
            .bind(page.created_at_most)
            .bind(page.created_at_most)
            .bind(page.limit)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        rows.iter().map(record_from_row).collect()
    }

    // `MySqlStore::change_once`, retried on a deadlock.
    async fn write_change(&self, c: &GuardedChange<'_>) -> Result<Option<Record>, StoreError> {
        retry_deadlocks!(self.change_once(c).await)
    }
}

oncely_core::guarded_operator!(MySqlStore);
