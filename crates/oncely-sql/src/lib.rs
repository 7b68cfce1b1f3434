//! # oncely-sql
//!
//! What Oncely's SQL key stores (`oncely-sqlite`, `oncely-postgres`, `oncely-mysql`) share,
//! written once and generic over [`sqlx::Database`]: the stores keep their statements, their
//! dialect's parameters and their error codes; the logic that is the same on every one of them
//! is here.
//!
//! - [`map_sqlx`]: a sqlx error as a [`StoreError`] (a row that does not decode is
//!   [`StoreError::Corrupt`], everything else [`StoreError::Unavailable`]).
//! - [`retry_while!`]: an operation run again after a short jittered [`backoff`] while it
//!   fails in a way the database asks the client to retry (the store says which), at most
//!   [`MAX_RETRIES`] times.
//! - [`record_from_row`] and [`redrives_from_row`]: a stored row decoded into a
//!   [`Record`](oncely_core::Record), every column checked.
//! - [`fenced_unless_written`]: an owner write that matched no row is
//!   [`StoreError::Fenced`].
//! - [`pooled_key_store!`]: the [`KeyStore`](oncely_core::KeyStore) of a store whose every
//!   owner write is its in-transaction operation (`renew_in`, ...) on a pooled connection.
//!
//! The stores depend on this crate; it depends on none of them (nor on `oncely-sqlx`, which
//! depends on the stores).
//!
//! [`StoreError`]: oncely_core::StoreError
//! [`StoreError::Corrupt`]: oncely_core::StoreError::Corrupt
//! [`StoreError::Unavailable`]: oncely_core::StoreError::Unavailable
//! [`StoreError::Fenced`]: oncely_core::StoreError::Fenced

mod error;
mod pooled;
mod row;

pub use error::{MAX_RETRIES, backoff, fenced_unless_written, map_sqlx};
pub use row::{TextColumns, record_from_row, redrives_from_row};

/// What the macros of this crate expand to (not an API).
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    pub use oncely_core;
    pub use sqlx;
    pub use tokio;
    pub use tracing;
}
