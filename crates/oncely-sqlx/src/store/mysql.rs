//! [`SqlStore`] for [`MySqlStore`] (MySQL 8, MariaDB 10.6+): the store's own operations on the
//! phase's connection, and the check that the transaction is still the phase's (its savepoint
//! `oncely_tx`, one round trip, skipped on the hot path as on PostgreSQL).

use super::{SqlStore, phase_error};
use crate::error::TxError;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, RecordKey, StoreError, StoredResponse,
};
use oncely_mysql::MySqlStore;
use sqlx::{MySql, MySqlConnection, Transaction};
use std::time::Duration;

#[async_trait]
impl SqlStore for MySqlStore {
    type Database = MySql;

    /// The store's own: `BEGIN` and the insert first, the transaction begun and claimed again
    /// when it was a deadlock's victim (it never answers without the lock).
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, MySql>>), StoreError> {
        MySqlStore::claim_tx(self, req).await
    }

    // No statement after the `BEGIN`, as on PostgreSQL: a renewal at the phase's start would
    // hold the record's row lock until the phase ends, and the heartbeat's renewals would wait
    // for it while the lease lapsed. The phase's closing write is fenced, and the open check
    // needs no write of the record.
    async fn begin_phase(
        &self,
        _id: &RecordKey,
        _token: FencingToken,
        _lease: Duration,
    ) -> Result<Transaction<'static, MySql>, StoreError> {
        self.begin_tx().await
    }

    async fn checkpoint_in(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), TxError> {
        ensure_open(self, conn).await?;
        MySqlStore::checkpoint_in(self, conn, id, token, recovery_point, lease, request)
            .await
            .map_err(phase_error)
    }

    async fn complete_in(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        hot: bool,
    ) -> Result<(), TxError> {
        // On the hot path the check would cost a round trip (sqlx keeps the server's "in
        // transaction" flag to itself), so it is asked only after a fenced completion, where it
        // tells a handler's own `ROLLBACK` (the claim undone) from a takeover.
        if !hot {
            ensure_open(self, conn).await?;
        }
        match MySqlStore::complete_in(self, conn, id, token, response, retention).await {
            Ok(()) => Ok(()),
            Err(StoreError::Fenced) if hot => {
                ensure_open(self, conn).await?;
                Err(TxError::Fenced)
            }
            Err(e) => Err(phase_error(e)),
        }
    }

    /// The errors of the handler's last statement, then the savepoint (up to two round trips,
    /// on this path only): a transaction MySQL rolled back as a deadlock's victim is the
    /// handler's transient failure, not a `COMMIT` or `ROLLBACK` it ran itself.
    async fn rollback_abandoned(
        &self,
        mut tx: Transaction<'static, MySql>,
        _id: &RecordKey,
    ) -> bool {
        let ended = self.ended_by_its_owner(&mut tx).await;
        let _ = tx.rollback().await;
        ended
    }
}

/// Refuses a transaction that ended behind the phase's back ([`TxError::TransactionEnded`]).
async fn ensure_open(store: &MySqlStore, conn: &mut MySqlConnection) -> Result<(), TxError> {
    match store.transaction_is_open(conn).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(TxError::TransactionEnded),
        Err(e) => Err(TxError::Store(e)),
    }
}
