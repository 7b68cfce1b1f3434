//! The tables between runs: [`Bench::settle`] before each timed variant, the resident rows of
//! [`Bench::populate`], autovacuum off for a timed run ([`Bench::autovacuum`]),
//! [`Bench::cleanup`] at the end, and the read that [`Bench::verify`] checks.

use super::endpoint::now_ms;
use super::{Bench, Pool, RESIDENT, RESIDENT_SCOPE, RETENTION_MS, SCOPE};
use sqlx::MySqlPool;

impl Bench {
    /// Puts the tables back into one state before a variant is timed, so that no variant
    /// inherits another's dead rows or pays for its clean-up: deletes what earlier runs left
    /// (the orders in scope [`SCOPE`] and their records), then on PostgreSQL runs `VACUUM` on
    /// `oncely_idempotency_keys` and `bench_orders`, on SQLite a `TRUNCATE` checkpoint of the
    /// WAL; on MySQL nothing more (InnoDB's purge threads remove the deleted rows in the
    /// background, and there is no statement that waits for them). The timed bench also turns autovacuum off on the two tables for its run
    /// ([`Bench::autovacuum`]): an autovacuum that started in the middle of one variant's run
    /// slowed that variant down.
    ///
    /// Measured at 0ab903e: without it, 2.4 million dead rows had piled up over a session's
    /// runs (about 250,000 a run), and the PostgreSQL layer's throughput moved by 10% between
    /// two runs of the same binary while the floor's did not.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn settle(&self) -> Result<(), String> {
        self.delete_rows(SCOPE).await?;
        let result = match &self.pool {
            Pool::Pg(pool) => sqlx::query("VACUUM oncely_idempotency_keys, bench_orders")
                .execute(pool)
                .await
                .map(drop),
            Pool::My(_) => Ok(()),
            Pool::Lite(pool) => sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(pool)
                .await
                .map(drop),
        };
        result.map_err(|e| e.to_string())
    }

    /// Gives PostgreSQL's and MySQL's two tables the resident rows a real key table has
    /// (records kept for the retention): [`RESIDENT`] complete records in scope
    /// [`RESIDENT_SCOPE`] and an order each, unless they are there, then `ANALYZE`s both, so
    /// that the planner plans for a table of that size whatever the timed runs have just
    /// deleted (and InnoDB's B-trees have a real table's depth); nothing on SQLite.
    /// [`Bench::cleanup`] deletes them. (Without them, [`Bench::settle`]'s `VACUUM` of a table
    /// of only the bench's rows recorded it as empty, and the statements that read by key were
    /// planned as sequential scans: replays ran at a third of their speed.)
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn populate(&self) -> Result<(), String> {
        if let Pool::My(pool) = &self.pool {
            return populate_mysql(pool).await.map_err(|e| e.to_string());
        }
        let Pool::Pg(pool) = &self.pool else {
            return Ok(());
        };
        let now = now_ms();
        let statements = [
            sqlx::query(
                "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, \
                 fingerprint, token, state, completed_at, response_status, response_headers, \
                 response_body, response_body_retained, created_at, expires_at) \
                 SELECT $1, 'resident-' || i, 1, sha256(i::text::bytea), 1, 'complete', $3, 201, \
                 '\\x'::bytea, '\\x7b7d'::bytea, TRUE, $3, $4 FROM generate_series(1, $2) AS i \
                 ON CONFLICT (scope, key) DO NOTHING",
            ),
            sqlx::query(
                "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
                 SELECT 'ord_resident_' || i, $1, 'resident-' || i, '[]', $3 \
                 FROM generate_series(1, $2) AS i ON CONFLICT (id) DO NOTHING",
            ),
        ];
        for q in statements {
            q.bind(RESIDENT_SCOPE)
                .bind(i64::from(RESIDENT))
                .bind(now)
                .bind(now + RETENTION_MS)
                .execute(pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        sqlx::query("ANALYZE oncely_idempotency_keys, bench_orders")
            .execute(pool)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Turns PostgreSQL's autovacuum on (`RESET`, the database's default) or off for the two
    /// tables the bench writes (`ALTER TABLE ... SET (autovacuum_enabled ...)`, which takes a
    /// `SHARE UPDATE EXCLUSIVE` lock: it waits for a running `VACUUM`, `ANALYZE` or schema
    /// change on them, not for inserts or updates); nothing on SQLite. The timed bench calls it
    /// on a database of its own only (`ONCELY_BENCH_POSTGRES_URL`); a run that panics leaves
    /// autovacuum off on the two tables until the next run ends. See [`Bench::settle`].
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn autovacuum(&self, on: bool) -> Result<(), String> {
        let Pool::Pg(pool) = &self.pool else {
            return Ok(());
        };
        let ddl: [&'static str; 2] = if on {
            [
                "ALTER TABLE oncely_idempotency_keys RESET (autovacuum_enabled)",
                "ALTER TABLE bench_orders RESET (autovacuum_enabled)",
            ]
        } else {
            [
                "ALTER TABLE oncely_idempotency_keys SET (autovacuum_enabled = false)",
                "ALTER TABLE bench_orders SET (autovacuum_enabled = false)",
            ]
        };
        for statement in ddl {
            sqlx::query(statement)
                .execute(pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Deletes what the runs left behind, and [`Bench::populate`]'s resident rows.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn cleanup(&self) -> Result<(), String> {
        self.delete_rows(SCOPE).await?;
        self.delete_rows(RESIDENT_SCOPE).await
    }

    /// Deletes the orders in `scope` of `bench_orders` (this module's own table) and their
    /// key records, so that repeated runs do not grow the database ([`Bench::settle`]'s first
    /// step).
    async fn delete_rows(&self, scope: &str) -> Result<(), String> {
        let result = match &self.pool {
            Pool::Pg(pool) => sqlx::query(
                "DELETE FROM oncely_idempotency_keys k USING bench_orders o \
                     WHERE k.scope = $1 AND o.scope = $1 AND k.key = o.idempotency_key",
            )
            .bind(scope)
            .execute(pool)
            .await
            .and(
                sqlx::query("DELETE FROM bench_orders WHERE scope = $1")
                    .bind(scope)
                    .execute(pool)
                    .await,
            )
            .map(drop),
            Pool::My(pool) => sqlx::query(
                "DELETE k FROM oncely_idempotency_keys k JOIN bench_orders o \
                     ON k.scope = o.scope AND k.`key` = o.idempotency_key WHERE o.scope = ?",
            )
            .bind(scope.as_bytes())
            .execute(pool)
            .await
            .and(
                sqlx::query("DELETE FROM bench_orders WHERE scope = ?")
                    .bind(scope.as_bytes())
                    .execute(pool)
                    .await,
            )
            .map(drop),
            Pool::Lite(pool) => sqlx::query(
                "DELETE FROM oncely_idempotency_keys WHERE scope = ?1 AND key IN \
                     (SELECT idempotency_key FROM bench_orders WHERE scope = ?1)",
            )
            .bind(scope)
            .execute(pool)
            .await
            .and(
                sqlx::query("DELETE FROM bench_orders WHERE scope = ?1")
                    .bind(scope)
                    .execute(pool)
                    .await,
            )
            .map(drop),
        };
        result.map_err(|e| e.to_string())
    }

    /// The order ids with idempotency key `key`, and the record's state, status and body.
    pub(super) async fn read(
        &self,
        key: &str,
    ) -> Result<(Vec<String>, Option<Record>), sqlx::Error> {
        match &self.pool {
            Pool::Pg(pool) => {
                let orders: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM bench_orders WHERE idempotency_key = $1")
                        .bind(key)
                        .fetch_all(pool)
                        .await?;
                let record: Option<(String, Option<i32>, Option<Vec<u8>>)> = sqlx::query_as(
                    "SELECT state, response_status, response_body FROM oncely_idempotency_keys \
                     WHERE scope = $1 AND key = $2",
                )
                .bind(SCOPE)
                .bind(key)
                .fetch_optional(pool)
                .await?;
                Ok((
                    orders.into_iter().map(|(id,)| id).collect(),
                    record.map(|(s, st, b)| (s, st.map(i64::from), b.unwrap_or_default())),
                ))
            }
            Pool::My(pool) => {
                let orders: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM bench_orders WHERE idempotency_key = ?")
                        .bind(key.as_bytes())
                        .fetch_all(pool)
                        .await?;
                let record: Option<(String, Option<i32>, Option<Vec<u8>>)> = sqlx::query_as(
                    "SELECT state, response_status, response_body FROM oncely_idempotency_keys \
                     WHERE scope = ? AND `key` = ?",
                )
                .bind(SCOPE.as_bytes())
                .bind(key.as_bytes())
                .fetch_optional(pool)
                .await?;
                Ok((
                    orders.into_iter().map(|(id,)| id).collect(),
                    record.map(|(s, st, b)| (s, st.map(i64::from), b.unwrap_or_default())),
                ))
            }
            Pool::Lite(pool) => {
                let orders: Vec<(String,)> =
                    sqlx::query_as("SELECT id FROM bench_orders WHERE idempotency_key = ?1")
                        .bind(key)
                        .fetch_all(pool)
                        .await?;
                let record: Option<(String, Option<i64>, Option<Vec<u8>>)> = sqlx::query_as(
                    "SELECT state, response_status, response_body FROM oncely_idempotency_keys \
                     WHERE scope = ?1 AND key = ?2",
                )
                .bind(SCOPE)
                .bind(key)
                .fetch_optional(pool)
                .await?;
                Ok((
                    orders.into_iter().map(|(id,)| id).collect(),
                    record.map(|(s, st, b)| (s, st, b.unwrap_or_default())),
                ))
            }
        }
    }
}

pub(super) type Record = (String, Option<i64>, Vec<u8>);

/// [`Bench::populate`] on MySQL: the numbers 1 to [`RESIDENT`] from a cross join of five digit
/// tables (portable to MySQL 8 and MariaDB: a recursive CTE would stop at MySQL's
/// `cte_max_recursion_depth`, 1000 by default); an existing row is kept (`ON DUPLICATE KEY
/// UPDATE` of a column to itself).
async fn populate_mysql(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    const NUMBERS: &str = "SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS i \
        FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS a \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS b \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS c \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS e \
        CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
              UNION ALL SELECT 8 UNION ALL SELECT 9) AS f";
    let now = now_ms();
    let keys = format!(
        "INSERT INTO oncely_idempotency_keys (scope, `key`, fingerprint_version, fingerprint, \
         token, state, completed_at, response_status, response_headers, response_body, \
         response_body_retained, created_at, expires_at) \
         SELECT ?, CONCAT('resident-', n.i), 1, UNHEX(SHA2(n.i, 256)), 1, 'complete', ?, 201, \
         '', '{{}}', TRUE, ?, ? FROM ({NUMBERS}) AS n WHERE n.i <= ? \
         ON DUPLICATE KEY UPDATE token = token"
    );
    sqlx::query(sqlx::AssertSqlSafe(keys))
        .bind(RESIDENT_SCOPE.as_bytes())
        .bind(now)
        .bind(now)
        .bind(now + RETENTION_MS)
        .bind(RESIDENT)
        .execute(pool)
        .await?;
    let orders = format!(
        "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
         SELECT CONCAT('ord_resident_', n.i), ?, CONCAT('resident-', n.i), '[]', ? \
         FROM ({NUMBERS}) AS n WHERE n.i <= ? ON DUPLICATE KEY UPDATE id = id"
    );
    sqlx::query(sqlx::AssertSqlSafe(orders))
        .bind(RESIDENT_SCOPE.as_bytes())
        .bind(now)
        .bind(RESIDENT)
        .execute(pool)
        .await?;
    sqlx::raw_sql("ANALYZE TABLE oncely_idempotency_keys, bench_orders")
        .execute(pool)
        .await?;
    Ok(())
}
