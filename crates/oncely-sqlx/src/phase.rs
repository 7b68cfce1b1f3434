//! What every phase of a [`Tx`](crate::Tx) does around its store write: log a transaction that
//! ended behind its back or that the handler's failed statement aborted, warn about a phase held
//! open too long, and a split store's ordered completion.

use crate::error::TxError;
use crate::shared::Shared;
use crate::store::SqlStore;
use sqlx::Transaction;
use std::time::Instant;

/// Logs what a phase's write or commit found wrong with the handler's use of its transaction
/// (see [`SqlStore::checkpoint_in`]), and returns the error.
pub(crate) fn reported<S: SqlStore>(sh: &Shared<S>, e: TxError) -> TxError {
    match &e {
        TxError::TransactionEnded => log_ended(sh),
        TxError::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02") => {
            tracing::error!(
                scope = %sh.id.scope,
                key = %sh.id.key,
                token = sh.token.0,
                "a statement of the handler failed and aborted its idempotent transaction, and the handler went on to Tx::commit or Tx::checkpoint: nothing of this phase is recorded; return the statement's error (with `?`) instead of ignoring it"
            );
        }
        _ => {}
    }
    e
}

fn log_ended<S: SqlStore>(sh: &Shared<S>) {
    tracing::error!(
        scope = %sh.id.scope,
        key = %sh.id.key,
        token = sh.token.0,
        "the handler ended its idempotent transaction itself (COMMIT or ROLLBACK through the Tx): nothing of this phase is recorded, and the key is not released (writes may have committed outside the phase)"
    );
}

/// Warns about a phase whose transaction was open for more than half the lease: an outside
/// call made inside it holds its connection and locks meanwhile (on SQLite, the write lock that
/// every other writer and this request's lease renewal wait for). See [`Between`](crate::Between).
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

/// A split store's completion (docs/DESIGN.md, "Split stores"): the response into the
/// progress ledger in the business transaction (fenced by the token), the business commit, then
/// the response into the key store. Once the business commit is done the response is the
/// request's, whatever the key store answers: a key store that fails (or a crash) there leaves
/// its record in flight, and the next claim of the key replays the response from the ledger.
pub(crate) async fn split_finish<S: SqlStore>(
    sh: &Shared<S>,
    mut tx: Transaction<'static, S::Database>,
    stored: &oncely_core::StoredResponse,
) -> Result<(), TxError> {
    sh.store
        .complete_in(&mut tx, &sh.id, sh.token, stored, sh.retention, false)
        .await
        .map_err(|e| reported(sh, e))?;
    sh.store.commit(tx).await.map_err(|e| reported(sh, e))?;
    match sh
        .store
        .complete(&sh.id, sh.token, stored.clone(), sh.retention)
        .await
    {
        Ok(()) => {}
        Err(oncely_core::StoreError::Fenced) => {
            // A claim took the key over after this commit and found the response in the
            // ledger: it replays it and stores it itself.
            tracing::debug!(scope = %sh.id.scope, key = %sh.id.key, token = sh.token.0, "split store: the key store's completion was fenced; the ledger's response stands");
        }
        Err(e) => {
            tracing::warn!(scope = %sh.id.scope, key = %sh.id.key, token = sh.token.0, error = %e, "split store: the response committed with the business writes (progress ledger) but the key store did not take it; the key answers in flight until its lease lapses, then the next claim replays the response from the ledger");
        }
    }
    Ok(())
}
