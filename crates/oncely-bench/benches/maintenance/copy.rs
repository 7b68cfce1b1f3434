//! The SQL stores' bulk copy of one template record, and the statements run outside the
//! bench's own database.

use oncely_conformance::plans::OwnDatabase;
use sqlx::Connection as _;

/// Rows copied per `INSERT ... SELECT` into a SQL store.
pub(crate) const COPY_BATCH: usize = 100_000;

/// Runs `statement` on the server of `own` (PostgreSQL or MySQL), outside its database: the
/// bench's own database is created and dropped this way.
pub(crate) async fn admin_sql(own: &OwnDatabase, dialect: Dialect, statement: String) {
    let statement = sqlx::AssertSqlSafe(statement);
    match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(&own.admin)
                .await
                .expect("connect to PostgreSQL");
            sqlx::raw_sql(statement).execute(&mut c).await.expect("DDL");
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(&own.admin)
                .await
                .expect("connect to MySQL");
            sqlx::raw_sql(statement).execute(&mut c).await.expect("DDL");
        }
        Dialect::Sqlite => unreachable!("a SQLite store is a file of its own"),
    }
}

/// The SQL dialects of the bulk copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
    MySql,
}

impl Dialect {
    /// The `n`th parameter (1-based; MySQL's are positional, so every statement binds them in
    /// the order they appear).
    pub(crate) fn param(self, n: usize) -> String {
        match self {
            Self::Postgres => format!("${n}"),
            Self::Sqlite => format!("?{n}"),
            Self::MySql => "?".to_owned(),
        }
    }

    /// The table's columns, in order, from the catalog.
    pub(crate) fn columns_query(self) -> &'static str {
        match self {
            Self::Postgres => {
                "SELECT CAST(column_name AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = 'oncely_idempotency_keys' \
                 ORDER BY ordinal_position"
            }
            Self::Sqlite => "SELECT name FROM pragma_table_info('oncely_idempotency_keys')",
            Self::MySql => {
                "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = 'oncely_idempotency_keys' \
                 ORDER BY ordinal_position"
            }
        }
    }

    /// The statement that copies the template row once per number of a series: the new
    /// keys' prefix (`$1`, followed by the number), the series' first and last number (`$2`,
    /// `$3`), the template's scope and key (`$4`, `$5`), bound in that order (the order they
    /// appear in). Every other column is copied as it is.
    pub(crate) fn copy_statement(self, columns: &[String]) -> String {
        let quote = |c: &str| match self {
            Self::MySql => format!("`{c}`"),
            Self::Postgres | Self::Sqlite => format!("\"{c}\""),
        };
        let [prefix, first, last, scope, key] = [1, 2, 3, 4, 5].map(|n| self.param(n));
        let (new_key, series) = match self {
            Self::Postgres => (
                format!("{prefix} || CAST(g.i AS TEXT)"),
                format!("SELECT generate_series({first}::bigint, {last}::bigint) AS i"),
            ),
            Self::Sqlite => (
                format!("{prefix} || CAST(g.i AS TEXT)"),
                format!(
                    "WITH RECURSIVE s(i) AS (SELECT CAST({first} AS INTEGER) UNION ALL \
                     SELECT i + 1 FROM s WHERE i < {last}) SELECT i FROM s"
                ),
            ),
            // A cross join of digits (MySQL 8 stops a recursive CTE at 1000 rows by default).
            Self::MySql => {
                let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL \
                              SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL \
                              SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                let places = COPY_BATCH.ilog10();
                let sum: Vec<String> = (0..places)
                    .map(|p| format!("{}*d{p}.d", 10usize.pow(p)))
                    .collect();
                let from: Vec<String> = (0..places).map(|p| format!("{digits} AS d{p}")).collect();
                (
                    format!("CONCAT({prefix}, g.i)"),
                    format!(
                        "SELECT * FROM (SELECT {first} + {} AS i FROM {}) AS n WHERE i <= {last}",
                        sum.join(" + "),
                        from.join(", ")
                    ),
                )
            }
        };
        let names: Vec<String> = columns.iter().map(|c| quote(c)).collect();
        let values: Vec<String> = columns
            .iter()
            .map(|c| {
                if c == "key" {
                    new_key.clone()
                } else {
                    format!("t.{}", quote(c))
                }
            })
            .collect();
        format!(
            "INSERT INTO oncely_idempotency_keys ({}) SELECT {} FROM ({series}) AS g, \
             oncely_idempotency_keys AS t WHERE t.scope = {scope} AND t.{} = {key}",
            names.join(", "),
            values.join(", "),
            quote("key"),
        )
    }
}
