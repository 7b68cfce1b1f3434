//! The reference API's business data (payments, orders, applied webhook events): the schema, the reads, and the writes
//! a handler makes inside its [`oncely_sqlx::Tx`] ([`BusinessDb`], one SQL text for the three
//! databases, rewritten for MySQL's placeholders and upsert).
//!
//! With an SQL key store (SQLite, PostgreSQL, MySQL / MariaDB) the business tables live in the
//! same database, so
//! a phase's business writes, its recovery point and (in the last phase) the stored response
//! commit together. With the memory or Redis key store they live in an embedded SQLite
//! database ([`oncely_sqlx::Split`]); every write is idempotent (inserts keyed by the ids the
//! recovery points carry, `ON CONFLICT DO NOTHING`), so a crash between the two stores' commits
//! only repeats a write that changes nothing.
//!
//! | file | what it holds |
//! |---|---|
//! | [`conn`] | [`Db`] (where the business tables live) and a connection of it |
//! | [`schema`] | the tables, and [`Db::migrate`] |
//! | [`sql`] | every statement, once, and its MySQL form ([`Q`](sql::Q)) |
//! | [`rows`] | the rows as the API shows them, and what a write is given |
//! | [`reads`] | the reads outside a transaction (lists, by id, the metrics' count) |
//! | [`writes`] | [`BusinessDb`]: the writes on the connection of the handler's transaction |

mod conn;
mod reads;
mod rows;
mod schema;
mod sql;
mod writes;

pub use conn::Db;
pub use rows::{NewPayment, Order, Page, Payment, WebhookEvent};
pub use writes::BusinessDb;
