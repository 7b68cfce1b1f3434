//! [`SqlStore`] for [`SqliteStore`]: the store's own operations on the phase's connection. The
//! check that the transaction is still the phase's rides in the phase's own write (the
//! savepoint `oncely_tx`, released by the same statement), at no extra hop.

use super::{SqlStore, phase_error};
use crate::error::TxError;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, RecordKey, StoreError, StoredResponse,
};
use oncely_sqlite::{SqliteStore, SqliteStoreError};
use sqlx::{Sqlite, SqliteConnection, Transaction};
use std::time::Duration;

/// The phase write's error: the savepoint gone is [`TxError::TransactionEnded`].
fn sqlite_error(e: StoreError) -> TxError {
    match &e {
        StoreError::Unavailable(source)
            if matches!(
                source.downcast_ref::<SqliteStoreError>(),
                Some(SqliteStoreError::TransactionEnded)
            ) =>
        {
            TxError::TransactionEnded
        }
        _ => phase_error(e),
    }
}

#[async_trait]
impl SqlStore for SqliteStore {
    type Database = Sqlite;

    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, Sqlite>>), StoreError> {
        SqliteStore::claim_tx(self, req).await
    }

    async fn begin_phase(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let mut tx = self.begin_tx().await?;
        self.renew_in(&mut tx, id, token, lease).await?;
        Ok(tx)
    }

    async fn checkpoint_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), TxError> {
        SqliteStore::checkpoint_in(self, conn, id, token, recovery_point, lease, request)
            .await
            .map_err(sqlite_error)
    }

    async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        _hot: bool,
    ) -> Result<(), TxError> {
        SqliteStore::complete_in(self, conn, id, token, response, retention)
            .await
            .map_err(sqlite_error)
    }

    async fn rollback_abandoned(&self, tx: Transaction<'static, Sqlite>, _id: &RecordKey) -> bool {
        // The handler's own COMMIT or ROLLBACK left no transaction for sqlx's to end. The
        // connection's count of open transactions then stays at one, and the store closes it
        // at its next acquire (`SqliteStore`'s pool never hands it out again).
        matches!(
            tx.rollback().await,
            Err(sqlx::Error::Database(e)) if e.message().contains("no transaction is active")
        )
    }
}
