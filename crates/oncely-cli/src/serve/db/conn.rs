//! [`Db`]: where the business tables live, and a connection of it for a statement written once
//! for the three databases (`dual!`).

use anyhow::Result;

/// Where the business tables live.
#[derive(Clone)]
pub enum Db {
    /// SQLite (the key store's own database, or an embedded one).
    Sqlite(sqlx::SqlitePool),
    /// PostgreSQL (the key store's own database).
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// MySQL or MariaDB (the key store's own database).
    #[cfg(feature = "mysql")]
    Mysql(sqlx::MySqlPool),
}

/// Runs `$body` with `$c` bound to a connection of the target's database and the type `$db` to
/// that database (a `BusinessDb`, whose `BusinessDb::sql` gives the statements' text).
macro_rules! dual {
    ($target:expr, $db:ident, $c:ident => $body:expr) => {
        match $target {
            Target::Sqlite($c) => {
                type $db = sqlx::Sqlite;
                $body
            }
            #[cfg(feature = "postgres")]
            Target::Postgres($c) => {
                type $db = sqlx::Postgres;
                $body
            }
            #[cfg(feature = "mysql")]
            Target::Mysql($c) => {
                type $db = sqlx::MySql;
                $body
            }
        }
    };
}
pub(super) use dual;

pub(super) enum Target<'a> {
    Sqlite(&'a mut sqlx::SqliteConnection),
    #[cfg(feature = "postgres")]
    Postgres(&'a mut sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    Mysql(&'a mut sqlx::MySqlConnection),
}

impl Db {
    pub(super) async fn with_conn<T>(
        &self,
        f: impl for<'c> FnOnce(Target<'c>) -> futures::future::BoxFuture<'c, Result<T>>,
    ) -> Result<T> {
        match self {
            Db::Sqlite(p) => {
                let mut c = p.acquire().await?;
                f(Target::Sqlite(&mut c)).await
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(p) => {
                let mut c = p.acquire().await?;
                f(Target::Postgres(&mut c)).await
            }
            #[cfg(feature = "mysql")]
            Db::Mysql(p) => {
                let mut c = p.acquire().await?;
                f(Target::Mysql(&mut c)).await
            }
        }
    }
}
