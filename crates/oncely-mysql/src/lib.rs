//! # oncely-mysql
//!
//! The MySQL and MariaDB [`KeyStore`](oncely_core::KeyStore) for Oncely (and its
//! [`Maintenance`](oncely_core::Maintenance)): many stateless server instances share one
//! database, on MySQL 8.0 or MariaDB 10.6 and later, InnoDB tables.
//!
//! - [`MySqlStore`]: claims arbitrated by the primary key (`INSERT ... ON DUPLICATE KEY
//!   UPDATE`) and conditional `UPDATE`s carrying the fencing token; see its docs for the claim
//!   algorithm, isolation, locks, deadlocks, lock waits and the clock rule.
//! - Transactional mode: a handler's business writes, its recovery point and (in the last
//!   phase) its stored response commit in one transaction. That is the `oncely-sqlx` crate
//!   (feature `mysql`), built on [`MySqlStore::begin_tx`], [`MySqlStore::claim_tx`] and the
//!   store's `*_in` operations, which are also what the pool-level operations run.
//! - Migrations ship with the crate ([`MySqlStore::migrate`]): the table
//!   `oncely_idempotency_keys`, an index on `expires_at` for the reaper and one on
//!   `(marked_at, lease_expires_at)` for the completer. All timestamps are `BIGINT` epoch
//!   milliseconds; scope and key are `VARBINARY` (compared byte for byte); fingerprints,
//!   headers, bodies and stored requests are binary (`VARBINARY`, `LONGBLOB`); the recovery
//!   point is `utf8mb4` text.
//!
//! ```no_run
//! # async fn example() -> Result<(), oncely_core::StoreError> {
//! use oncely_core::{ClaimOutcome, KeyStore};
//! use oncely_mysql::MySqlStore;
//!
//! let store = MySqlStore::connect("mysql://app@db.internal:3306/app").await?;
//! store.migrate().await?;
//! # let req: oncely_core::ClaimRequest = unimplemented!();
//! match store.claim(req).await? {
//!     ClaimOutcome::Claimed(claim) => { /* run the handler, in phases */ }
//!     ClaimOutcome::Replay { response, .. } => { /* replay it */ }
//!     ClaimOutcome::InFlight { .. } | ClaimOutcome::Mismatch => { /* 409 / 422 */ }
//!     ClaimOutcome::NeedsAttention { .. } => { /* 409: the completer gave up on it */ }
//!     _ => { /* an outcome this code does not know: fail closed, never run the handler */ }
//! }
//! # Ok(()) }
//! ```
//!
//! # What differs from the PostgreSQL store, and why
//!
//! - **No `RETURNING`.** MariaDB has `INSERT ... RETURNING` (10.5) and `DELETE ... RETURNING`
//!   (10.0); MySQL has neither, so the store uses neither: the claim's insert tells an insert
//!   from a duplicate by its last insert id, a completer's note reads its result back in its
//!   transaction, and the reaper locks its batch with `SELECT ... FOR UPDATE SKIP LOCKED`, then
//!   deletes exactly those rows.
//! - **`ON DUPLICATE KEY UPDATE`, not `INSERT IGNORE`.** `IGNORE` turns errors into warnings
//!   (a value cut to its column among them), and a plain insert that hits the key takes a
//!   shared lock that a later exclusive one would have to upgrade, the classic deadlock of
//!   concurrent inserts of one key. `ON DUPLICATE KEY UPDATE` takes the exclusive record lock
//!   at once and changes nothing.
//! - **Row counts are rows matched.** sqlx connects with `CLIENT_FOUND_ROWS`; an owner write
//!   that sets a column to its current value still counts its row.
//! - **A deadlock ends the transaction** (error 1213): InnoDB rolls the victim back whole, and
//!   the connection goes on in autocommit, where PostgreSQL keeps an aborted transaction that
//!   refuses every statement until `ROLLBACK`. The store runs its own transactions again; inside
//!   a handler's transaction the error is the handler's, a transient one (`503
//!   database_unavailable` from `oncely-sqlx`).
//! - **A failed statement does not abort the transaction** (PostgreSQL's `25P02` has no
//!   equivalent): a handler that ignores a failed statement and commits commits the rest, as on
//!   SQLite.
//! - **Lock waits** are bounded by `innodb_lock_wait_timeout`, in whole seconds, set per claim
//!   and phase transaction (4 seconds, [`MySqlStore::TX_LOCK_TIMEOUT`]); MySQL has no `SET
//!   LOCAL`, so the setting then stays for the session.
//! - **No partial indexes**: the completer's index covers every row, and only in-flight rows
//!   have a lease, so its range reads only them.
//! - **Text collations fold or pad** (`_ci`, `_ai`, `PAD SPACE`), so scope and key are binary;
//!   a scope is at most 1024 bytes ([`MySqlStore::MAX_SCOPE_BYTES`]), checked before any
//!   statement, so that no `sql_mode` can cut one short.
//!
//! # MySQL and MariaDB
//!
//! The statements are the common subset of MySQL 8.0 and MariaDB 10.6: `SKIP LOCKED` (MySQL
//! 8.0.1, MariaDB 10.6) is the floor, `CHECK` constraints are enforced from MySQL 8.0.16 and
//! MariaDB 10.2, and no statement uses `RETURNING`, `@@in_transaction` or the `VALUES()`
//! function of `ON DUPLICATE KEY UPDATE` (deprecated in MySQL 8.0.20). One statement differs on
//! purpose: the insert of a try of [`MySqlStore::claim_tx`] carries MariaDB's `SET STATEMENT
//! innodb_lock_wait_timeout = 0 FOR` in a MariaDB-only executable comment (`/*M!100600 */`), so
//! that a duplicate does not wait on its connection for a key another transaction holds; MySQL
//! reads it as a comment and waits up to 4 seconds there, as it has no per-statement bound for
//! InnoDB. The tests ran against **MariaDB 10.11** only; MySQL 8 has not been run. Where the
//! two are known to differ without touching these statements: MySQL 8.0's default collation is
//! `utf8mb4_0900_ai_ci`, MariaDB's `utf8mb4_general_ci` (neither is used here); MySQL names the
//! isolation variable `transaction_isolation`, MariaDB before 11.1 `tx_isolation`.
//!
//! # The promise
//!
//! Effectively-once, not exactly-once: a request's side effects run once per `(scope, key)`
//! inside the replay window, and retries replay the stored response (see docs/DESIGN.md, "The
//! promise: effectively-once").

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

pub use error::MySqlStoreError;
pub use store::MySqlStore;
