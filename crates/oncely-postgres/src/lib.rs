//! # oncely-postgres
//!
//! The PostgreSQL [`KeyStore`](oncely_core::KeyStore) for Oncely: many stateless server
//! instances share one database (or a Postgres-compatible distributed SQL database; the
//! `(scope, key)` primary key is a natural distribution key, since every statement touches one
//! `(scope, key)`).
//!
//! - [`PostgresStore`]: claims arbitrated by the primary key (`INSERT ... ON CONFLICT`) and
//!   conditional `UPDATE`s carrying the fencing token; see its docs for the claim algorithm,
//!   isolation, lock waits and the clock rule.
//! - Transactional mode: a handler's business writes, its recovery point and (in the last
//!   phase) its stored response commit in one transaction. That is the `oncely-sqlx` crate,
//!   built on [`PostgresStore::claim_tx`], [`PostgresStore::begin_tx`] and the store's `*_in`
//!   operations, which are also what its [`KeyStore`](oncely_core::KeyStore) operations run
//!   on a pooled connection (one implementation of each).
//! - Migrations ship with the crate ([`PostgresStore::migrate`]): the table
//!   `oncely_idempotency_keys`, an index on `expires_at` for the reaper and a partial index on
//!   in-flight leases for the completer. All timestamps are `BIGINT` epoch milliseconds.
//!
//! ```no_run
//! # async fn example() -> Result<(), oncely_core::StoreError> {
//! use oncely_core::{ClaimOutcome, KeyStore};
//! use oncely_postgres::PostgresStore;
//!
//! let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
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

mod claim;
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

pub use error::PostgresStoreError;
pub use store::PostgresStore;
pub use within::CompleteCommitError;
