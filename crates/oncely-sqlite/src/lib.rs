//! # oncely-sqlite
//!
//! The SQLite key store for Oncely ([`KeyStore`](oncely_core::KeyStore) and
//! [`Maintenance`](oncely_core::Maintenance)): the embedded default. One file,
//! no server, and the claim arbitrated by the table's `PRIMARY KEY (scope, key)`, never by a
//! read followed by a write.
//!
//! ```no_run
//! use oncely_core::Maintenance;
//! use oncely_sqlite::SqliteStore;
//!
//! # async fn demo() -> Result<(), oncely_core::StoreError> {
//! // Creates the file if missing, opens it in WAL mode and runs the shipped migrations.
//! let store = SqliteStore::connect("sqlite://oncely.db?mode=rwc").await?;
//! // Past retention: delete up to 1,000 records per call, in one bounded statement.
//! let report = store.reap(1_000).await?;
//! # let _ = report;
//! # Ok(())
//! # }
//! ```
//!
//! - [`SqliteStore`]: the store, its connection settings and how each operation is atomic.
//! - Transactional mode (DESIGN.md, "Transactional handlers and recovery points"), where a
//!   handler's business writes, its recovery point and its stored response commit in one SQLite
//!   transaction: the `oncely-sqlx` crate, built on [`SqliteStore::begin_tx`] and the store's
//!   `*_in` operations.
//!
//! The schema ships in the crate's `migrations/` directory (table `oncely_idempotency_keys`);
//! all timestamps are integer epoch milliseconds from the store's
//! [`Clock`](oncely_core::Clock).
//!
//! # The promise
//!
//! Effectively-once, not exactly-once: a request's side effects run once per `(scope, key)`
//! inside the replay window, and retries replay the stored response. Nothing over a network
//! can promise (and Oncely does not promise) exactly-once execution; see [`oncely_core`].

mod error;
mod keystore;
mod maintenance;
mod operator;
#[cfg(test)]
mod plans;
mod row;
mod sql;
mod store;
mod within;

pub use error::SqliteStoreError;
pub use store::{ACQUIRE_TIMEOUT, BUSY_TIMEOUT, MAX_CONNECTIONS, SqliteStore, connect_options};
pub use within::LEASE_SLACK;
