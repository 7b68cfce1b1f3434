//! What every phase of a [`Tx`](crate::Tx) does before and after its store write: refuse a
//! transaction that ended behind its back, read the store's errors, warn about a phase held
//! open too long, and a split store's ordered completion.

use crate::error::TxError;
use crate::store::SqlStore;
use crate::tx::Shared;
use oncely_core::StoreError;
use sqlx::Transaction;
use std::time::Instant;

/// The error of a phase's write: [`TxError::TransactionEnded`] (logged) when the store's
/// write found the transaction ended behind the phase's back ([`SqlStore::ended_behind`]);
/// [`TxError::Database`] with the database's error (logged) when an earlier statement of the
/// handler failed and aborted the transaction, its error ignored (PostgreSQL's SQLSTATE
/// `25P02`, "current transaction is aborted"): the handler's failure, not the key store's, so
/// it is answered as a failure in the database (`500 database_error`, not retryable), never as
/// a store outage (`503`, retryable). The error that aborted the transaction is gone by then
/// (only the handler's `?` on its statement keeps it, with its own answer: `503` for a
/// transient one, `422` for a refused value), so the answer cannot say whether a retry would
/// succeed.
pub(crate) fn ended_or<S: SqlStore>(sh: &Shared<S>, e: StoreError) -> TxError {
    if sh.store.ended_behind(&e) {
        log_ended(sh);
        return TxError::TransactionEnded;
    }
    match e {
        StoreError::Unavailable(source) if aborted_by_the_handler(&*source) => {
            match source.downcast::<sqlx::Error>() {
                Ok(db) => {
                    tracing::error!(
                        scope = %sh.id.scope,
                        key = %sh.id.key,
                        token = sh.token.0,
                        "a statement of the handler failed and aborted its idempotent transaction, and the handler went on to Tx::commit or Tx::checkpoint: nothing of this phase is recorded; return the statement's error (with `?`) instead of ignoring it"
                    );
                    TxError::Database(*db)
                }
                Err(source) => StoreError::Unavailable(source).into(),
            }
        }
        other => other.into(),
    }
}

/// Whether a store error is PostgreSQL's "current transaction is aborted, commands ignored
/// until end of transaction block" (SQLSTATE `25P02`): the transaction failed before the
/// store's write was sent.
fn aborted_by_the_handler(source: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02")
    )
}

pub(crate) fn log_ended<S: SqlStore>(sh: &Shared<S>) {
    tracing::error!(
        scope = %sh.id.scope,
        key = %sh.id.key,
        token = sh.token.0,
        "the handler ended its idempotent transaction itself (COMMIT or ROLLBACK through the Tx): nothing of this phase is recorded, and the key is not released (writes may have committed outside the phase)"
    );
}

/// Warns about a phase whose transaction was open for more than half the lease: an outside
/// call made inside it holds its connection and locks meanwhile (on SQLite, the write lock that
/// every other writer and this request's lease renewal wait for). See [`Between`].
pub(crate) fn warn_if_long<S: SqlStore>(sh: &Shared<S>, opened: Instant) {
    let open = opened.elapsed();
    if open > sh.lease / 2 {
        tracing::warn!(
            scope = %sh.id.scope,
            key = %sh.id.key,
            open_ms = open.as_millis() as u64,
            lease_ms = sh.lease.as_millis() as u64,
            "a phase's transaction was open for more than half the lease: hold no transaction across an outside call (make it between phases, with Between::call); on SQLite an open phase holds the write lock, so the lease could not be renewed meanwhile"
        );
    }
}

/// Refuses to record anything on a transaction that ended behind the phase's back (see
/// [`SqlStore::still_open`] and [`TxError::TransactionEnded`]).
pub(crate) async fn ensure_open<S: SqlStore>(
    sh: &Shared<S>,
    tx: &mut Transaction<'static, S::Database>,
    hot: bool,
) -> Result<(), TxError> {
    if !sh.store.checks_still_open(hot) {
        return Ok(());
    }
    // The check is itself a statement: in a transaction a failed statement aborted, it fails
    // as the phase's write would (see `ended_or`).
    match sh.store.still_open(tx, &sh.id, hot).await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(e) => return Err(ended_or(sh, e)),
    }
    log_ended(sh);
    Err(TxError::TransactionEnded)
}

pub(crate) async fn split_finish<S: SqlStore>(
    sh: &Shared<S>,
    mut tx: Transaction<'static, S::Database>,
    intent: Option<&str>,
    stored: &oncely_core::StoredResponse,
    recorded: &mut bool,
) -> Result<(), TxError> {
    if let Some(rp) = intent {
        sh.store
            .checkpoint_in(&mut tx, &sh.id, sh.token, rp, sh.lease, None)
            .await?;
        *recorded = true;
    }
    tx.commit().await?;
    sh.store
        .complete(&sh.id, sh.token, stored.clone(), sh.retention)
        .await?;
    Ok(())
}
