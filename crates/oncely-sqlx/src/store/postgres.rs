//! [`SqlStore`] for [`PostgresStore`]: the store's own operations on the phase's connection,
//! and the check that the transaction is still the phase's.

use super::{SqlStore, phase_error};
use crate::error::TxError;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, RecordKey, StoreError, StoredResponse,
};
use oncely_postgres::{CompleteCommitError, PostgresStore};
use sqlx::{PgConnection, Postgres, Transaction};
use std::time::Duration;

#[async_trait]
impl SqlStore for PostgresStore {
    type Database = Postgres;

    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, Postgres>>), StoreError> {
        PostgresStore::claim_tx(self, req).await
    }

    // No statement after `BEGIN`: a renewal at the phase's start would hold the record's row
    // lock until the phase ends, and the heartbeat's renewals would wait for it while the lease
    // lapsed. The phase's closing write is fenced, and the open check needs no write of the
    // record.
    async fn begin_phase(
        &self,
        _id: &RecordKey,
        _token: FencingToken,
        _lease: Duration,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        self.begin_tx().await
    }

    async fn checkpoint_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), TxError> {
        ensure_open(conn).await?;
        PostgresStore::checkpoint_in(self, conn, id, token, recovery_point, lease, request)
            .await
            .map_err(phase_error)
    }

    async fn complete_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        hot: bool,
    ) -> Result<(), TxError> {
        // On the hot path no statement can carry the check (sqlx keeps the server's transaction
        // status private), so it is asked only after a fenced completion, where it tells a
        // handler's own `ROLLBACK` (the claim undone) from a takeover.
        if !hot {
            ensure_open(conn).await?;
        }
        match PostgresStore::complete_in(self, conn, id, token, response, retention).await {
            Ok(()) => Ok(()),
            Err(StoreError::Fenced) if hot => {
                ensure_open(conn).await?;
                Err(TxError::Fenced)
            }
            Err(e) => Err(phase_error(e)),
        }
    }

    // With `with_completion_sent_with_commit`, one message, one round trip: the completion,
    // then `COMMIT` (docs/DESIGN.md, "The completion goes out with the commit"). A later phase
    // checks that its transaction is still its own in the same message; the hot path checks
    // only after a fenced completion, as `complete_in` does. Otherwise (the default) the
    // prepared completion, then the `COMMIT`.
    async fn complete_and_commit(
        &self,
        mut tx: Transaction<'static, Postgres>,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        hot: bool,
    ) -> Result<(), TxError> {
        if !self.completion_sent_with_commit() {
            SqlStore::complete_in(self, &mut tx, id, token, response, retention, hot).await?;
            return SqlStore::commit(self, tx).await;
        }
        let done = self
            .complete_and_commit_in(&mut tx, id, token, response, retention, !hot)
            .await;
        match done {
            // The empty transaction the message left open rolls back with the pool's release
            // ping (sqlx's queued `ROLLBACK`).
            Ok(()) => Ok(()),
            Err(CompleteCommitError::Ended) => Err(TxError::TransactionEnded),
            Err(CompleteCommitError::Fenced) if hot => {
                // The failed completion left the phase's own transaction aborted, which refuses
                // any statement; a transaction the handler ended behind the phase's back left
                // none, and the probe runs (and fails nothing) on its own.
                match sqlx::raw_sql("SELECT 1").execute(&mut *tx).await {
                    Ok(_) => Err(TxError::TransactionEnded),
                    Err(_) => Err(TxError::Fenced),
                }
            }
            Err(CompleteCommitError::Fenced) => Err(TxError::Fenced),
            Err(CompleteCommitError::Statement(e)) => Err(phase_error(e)),
            Err(CompleteCommitError::Commit(e)) => Err(TxError::from(e)),
            Err(other) => Err(TxError::from(StoreError::unavailable(
                std::io::Error::other(format!("{other:?}")),
            ))),
        }
    }

    async fn rollback_abandoned(
        &self,
        mut tx: Transaction<'static, Postgres>,
        _id: &RecordKey,
    ) -> bool {
        // An aborted transaction (a statement failed) refuses the check: it is the phase's
        // own, and rolls back.
        let open = still_open(&mut tx).await;
        // Queued: it goes out with the pool's release ping, no round trip of its own.
        drop(tx);
        matches!(open, Ok(false))
    }
}

/// Refuses a transaction that ended behind the phase's back ([`TxError::TransactionEnded`]) or
/// that a failed statement aborted ([`TxError::Database`], see [`phase_error`]).
pub(crate) async fn ensure_open(conn: &mut PgConnection) -> Result<(), TxError> {
    match still_open(conn).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(TxError::TransactionEnded),
        Err(e) => Err(phase_error(e)),
    }
}

/// Whether the statement runs inside the transaction the phase began. In a transaction block,
/// `transaction_timestamp()` is the time of its first statement (the `BEGIN`, sent and answered
/// before anything else of the phase), and `statement_timestamp()` the time this statement
/// arrived, at least one round trip later; after a `COMMIT` or `ROLLBACK` behind the phase's
/// back the check runs as a transaction of its own, where the two are the same value
/// (PostgreSQL's documentation, "Current Date/Time"), when the check is sent as a simple query.
/// Compared with `<>`, not `<`, so that a system clock stepped back between the two cannot make
/// an open transaction look ended. In a transaction that a failed statement aborted, the check
/// itself fails with `25P02`, which the phase reads as the handler's failure. It reads no table,
/// so it holds no lock and needs no write of the record earlier in the phase.
async fn still_open(conn: &mut PgConnection) -> Result<bool, StoreError> {
    // A simple query (one `Query` message): in the extended protocol the statement's timestamp
    // is taken again at its `Execute` message, after the implicit transaction began at its
    // `Bind`, so the two would differ even outside a transaction block.
    let row = sqlx::raw_sql("SELECT transaction_timestamp() <> statement_timestamp()")
        .fetch_one(conn)
        .await
        .map_err(StoreError::unavailable)?;
    sqlx::Row::try_get::<bool, _>(&row, 0).map_err(StoreError::unavailable)
}
