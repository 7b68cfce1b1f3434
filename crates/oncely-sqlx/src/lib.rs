//! # oncely-sqlx
//!
//! Transactional idempotency for axum + sqlx handlers: the claim of the request's
//! `Idempotency-Key`, the handler's business writes and the stored response commit as **one**
//! database transaction, on PostgreSQL, MySQL / MariaDB and SQLite with the same code.
//!
//! ```no_run
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use oncely_sqlx::{Tx, TxError};
//! use oncely_sqlite::SqliteStore;
//!
//! // The claim is already in `tx`; the order row and the response commit with it.
//! async fn create_order(mut tx: Tx<SqliteStore>, Json(order): Json<serde_json::Value>)
//!     -> Result<axum::response::Response, TxError> {
//!     sqlx::query("INSERT INTO orders (body) VALUES ($1)")
//!         .bind(order.to_string())
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit((StatusCode::CREATED, Json(order))).await
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite://app.db").await?;
//! store.migrate().await?;
//! let idempotency = oncely_sqlx::layer(store, oncely_core::Policy::default());
//! let app: Router = Router::new()
//!     // On the route's methods: another method gets its 405, and a path that matches no
//!     // route its 404, without a claim or a transaction (`Router::route_layer` would run the
//!     // 405 through the layer too).
//!     .route("/v1/orders", post(create_order).route_layer(idempotency));
//! // Your authentication layer, outside this one, puts the caller's `oncely_core::Scope`
//! // into the request extensions (see `oncely_tower::ExtensionScope`).
//! # let _ = app; Ok(()) }
//! ```
//!
//! With PostgreSQL, write `Tx<PostgresStore>` and `$1` placeholders; with MySQL or MariaDB,
//! `Tx<MySqlStore>` (`oncely_mysql`) and `?` placeholders; nothing else changes.
//!
//! # Guarantees
//!
//! - **One commit for a single-phase handler.** The claim is an `INSERT` inside the handler's
//!   transaction; [`Tx::commit`] stores the response in the same transaction. A crash before
//!   the commit undoes the claim with the writes (a retry executes afresh); a crash after it
//!   leaves a record that replays (docs/DESIGN.md, "One commit for a single-phase handler").
//! - **What is stored is what is sent.** [`Tx::commit`] takes the handler's actual response
//!   (`impl IntoResponse`), captures it exactly as it goes out, and returns it.
//! - **A concurrent duplicate waits, then replays** (bounded; see [`TransactionalClaimer`]):
//!   for this kind of handler "in flight" is a short wait, not a `409`, unless the bound is
//!   reached. It never runs the handler while the first is undecided.
//! - **Replays never enter the handler** and never open a write transaction on SQLite.
//! - **A failed phase rolls back** ([`TxError`] renders the answer). A single-phase handler's
//!   uncommitted error thus leaves the key free (DESIGN: a `5xx` whose transaction rolled back
//!   is not stored); a response the handler commits with [`Tx::commit`] is stored and replayed
//!   with its writes, except a `5xx`, `408`, `409`, `425` or `429`, which commits nothing (the
//!   step rolls back, so a retry runs it again). A phase that fails after an earlier
//!   one committed a recovery point says so: `503 request_suspended`, retryable, naming the
//!   step where the request stopped; a retry with the same key resumes there.
//! - **No success without a commit.** A handler that answers 2xx or 3xx without completing its
//!   transaction gets `500 handler_did_not_commit` sent instead (its writes were rolled back);
//!   a response body that breaks while [`Tx::commit`] captures it commits nothing.
//!
//! # Multi-step requests
//!
//! A request that calls a system outside the database (a card processor, an e-mail provider)
//! is split into phases at each outside call, with typed steps:
//!
//! ```no_run
//! # use oncely_sqlx::{Tx, TxError};
//! # use oncely_sqlite::SqliteStore;
//! #[derive(serde::Serialize, serde::Deserialize)]
//! enum Step { Recorded { payment: String }, Charged { payment: String, charge: String } }
//!
//! async fn pay(mut tx: Tx<SqliteStore>) -> Result<axum::response::Response, TxError> {
//!     let payment = match tx.resume_from::<Step>()? {
//!         Some(Step::Recorded { payment } | Step::Charged { payment, .. }) => payment,
//!         None => {
//!             let id = "pay_1".to_owned(); // mint it once: the step carries it from here on
//!             sqlx::query("INSERT INTO payments (id) VALUES (?1)").bind(&id).execute(&mut *tx).await?;
//!             id
//!         }
//!     };
//!     // The claim, the payment row and the intent commit together, before the outside call.
//!     let between = tx.checkpoint(&Step::Recorded { payment: payment.clone() }).await?;
//!     let key = oncely_sqlx::derived_key(between.id(), &payment, "charge"); // the processor's key
//!     // The outside call, with no transaction open; refused if this request lost its claim.
//!     let charge = between.call(|| charge_card(&key)).await?;
//!     let tx = between.begin().await?; // the next phase records the call's result
//!     tx.commit((axum::http::StatusCode::CREATED, charge)).await
//! }
//! # async fn charge_card(_key: &str) -> String { "ch_1".into() }
//! ```
//!
//! A crash at any point resumes, on the client's retry or through the completer, at the last
//! committed step; the outside call carries a key derived from ours, so even a repeated call
//! is collapsed by the outside system.
//!
//! # Outside calls and the lease
//!
//! The rule: record the intent, commit, make the outside call with **no transaction open**
//! ([`Between::call`]), record its result in the next phase. Between phases the request holds
//! no connection and no lock, and the layer's heartbeat renews its lease however long the call
//! takes; it also renews while a phase is open (a phase writes the record only in its closing
//! statement on PostgreSQL and MySQL; on SQLite an open phase holds the database's one write lock, which
//! the renewal must wait for, so there a transaction held across an outside call lets the
//! lease look lapsed until it commits, and stops every other writer meanwhile). A phase open
//! for more than half the lease is logged as a warning. `Between::call` first makes sure the
//! request still holds its claim (at once from what the heartbeat last saw, or by renewing
//! it): a request whose heartbeat fell behind and whose key another request took over never
//! makes its next outside call. With a short lease (for quick takeovers after a crash), keep it
//! well above the store's worst answer time to a renewal, and make every outside call with
//! `Between::call`. See [`Between`].

mod checkpoint;
mod claimer;
mod error;
mod phase;
mod shared;
mod split;
mod store;
mod tx;

pub use checkpoint::Between;
pub use claimer::TransactionalClaimer;
pub use error::{DbErrorClass, TxError, classify};
pub use split::{Split, SplitDatabase};
pub use store::SqlStore;
pub use tx::Tx;

use oncely_core::{Policy, RecordKey};
use oncely_tower::IdempotencyLayer;
use std::sync::Arc;

/// The idempotency layer for transactional handlers on `store`: an
/// [`IdempotencyLayer`] with `policy` (see its builder for the scope, key rule and other plug
/// points) whose claims are made inside the handler's transaction by a
/// [`TransactionalClaimer`]. Every handler of a keyed route behind it takes a [`Tx`].
///
/// The store's table must exist (`store.migrate()`), and the business tables live in the same
/// database.
///
/// # Panics
///
/// When `policy` is invalid (see [`Policy::validate`]).
pub fn layer<S: SqlStore>(store: S, policy: Policy) -> IdempotencyLayer {
    let claimer = TransactionalClaimer::new(store.clone());
    IdempotencyLayer::new(Arc::new(store))
        .with_policy(policy)
        .with_claimer(claimer)
}

/// A stable idempotency key for an outside call made by a multi-step request: derived from the
/// request's scope and key, an id the request minted (for example the payment's, carried by
/// its recovery point, so a key reused after the replay window gets new outside keys too) and
/// the step's name. Every retry and resumption of one logical request sends the same key.
///
/// The form is `oncely-<step>-<32 hex digits of SHA-256>`, with `<step>` cut to its first
/// [`MAX_DERIVED_STEP_LEN`] (215) bytes so that the key stays within the 255 characters of
/// the idempotency key contract (`oncely_core::key::MAX_KEY_LEN`, also Stripe's documented
/// limit): 41 to 255 visible ASCII characters for any `step` of visible ASCII. The digest
/// covers the whole name, so two long names that share their first 215 bytes still get two
/// keys; keys of names up to 215 bytes are as they always were.
pub fn derived_key(id: &RecordKey, minted: &str, step: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [id.scope.as_str(), id.key.as_str(), minted, step] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let mut cut = step.len().min(MAX_DERIVED_STEP_LEN);
    while !step.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("oncely-{}-{hex}", &step[..cut])
}

/// The most bytes of a step's name that [`derived_key`] writes into the key: 215, the 255 of
/// `oncely_core::key::MAX_KEY_LEN` less `oncely-`, the `-` and the 32 hex digits.
pub const MAX_DERIVED_STEP_LEN: usize = oncely_core::key::MAX_KEY_LEN - "oncely-".len() - 1 - 32;

/// The repository README's Rust examples, compiled and run as doc tests so that the README
/// cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::{IdempotencyKey, Scope};

    fn id() -> RecordKey {
        RecordKey::new(
            Scope::new("acct_1"),
            IdempotencyKey::new("order-42").unwrap(),
        )
    }

    #[test]
    fn a_derived_key_is_a_valid_key_whatever_the_length_of_the_step() {
        // A short name's key is what it always was.
        assert_eq!(
            derived_key(&id(), "pay_1", "charge"),
            "oncely-charge-e7f0e8882727f7f2ffec5c6f4d9c41a9"
        );
        for len in [1, 214, 215, 216, 300, 5000] {
            let step = "s".repeat(len);
            let key = derived_key(&id(), "pay_1", &step);
            assert!(
                key.len() <= oncely_core::key::MAX_KEY_LEN,
                "{len}: {}",
                key.len()
            );
            assert_eq!(IdempotencyKey::new(&key).unwrap().as_str(), key, "{len}");
            assert_eq!(key.len(), 40 + len.min(MAX_DERIVED_STEP_LEN), "{len}");
        }
        assert_eq!(derived_key(&id(), "pay_1", &"s".repeat(300)).len(), 255);
        // Names that differ only past the cut still get different keys, stable across calls.
        let (a, b) = ("x".repeat(300) + "a", "x".repeat(300) + "b");
        assert_ne!(
            derived_key(&id(), "pay_1", &a),
            derived_key(&id(), "pay_1", &b)
        );
        assert_eq!(
            derived_key(&id(), "pay_1", &a),
            derived_key(&id(), "pay_1", &a)
        );
        // A multi-byte character at the cut is never split.
        let step = "x".repeat(214) + "\u{e9}\u{e9}";
        let key = derived_key(&id(), "pay_1", &step);
        assert!(key.len() <= oncely_core::key::MAX_KEY_LEN);
        assert!(
            key.starts_with(&format!("oncely-{}-", "x".repeat(214))),
            "{key}"
        );
    }
}
