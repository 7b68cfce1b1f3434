//! [`KeyStore`] for [`SqliteStore`]: each operation is the one the transactional phases run
//! (`within.rs`), on a pooled connection.

use crate::error::map_sqlx;
use crate::row::decode_record;
use crate::sql;
use crate::store::SqliteStore;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Record, RecordKey, StoreError,
    StoredResponse, UnixMillis,
};
use std::time::Duration;

/// Every write is the one the transactional phases run (`within.rs`), here on a pooled
/// connection: the claim in a transaction of its own ([`SqliteStore::begin_tx`],
/// [`SqliteStore::claim_in`], `COMMIT`) after a read that takes no lock; each other write one
/// statement outside any transaction block, so a transaction of its own, without the
/// savepoint check of a phase (there is no phase whose transaction could have ended).
#[async_trait]
impl KeyStore for SqliteStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if let Some(answer) = self.answer_from_snapshot(&req).await? {
            return Ok(answer);
        }
        let mut tx = self.begin_tx().await?;
        let outcome = self.claim_in(&mut tx, &req).await?;
        if matches!(outcome, ClaimOutcome::Claimed(_)) {
            tx.commit().await.map_err(map_sqlx)?;
        }
        // Otherwise nothing was written; dropping `tx` rolls the empty transaction back.
        Ok(outcome)
    }

    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        self.renew_in(&mut *self.conn().await?, id, token, lease)
            .await
    }

    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        self.checkpoint_with(false, &mut conn, id, token, recovery_point, lease, None)
            .await
    }

    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        self.complete_with(false, &mut conn, id, token, &response, retention)
            .await
    }

    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.release_in(&mut *self.conn().await?, id, token).await
    }

    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        sqlx::query(sql::SELECT_ONE)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?
            .as_ref()
            .map(decode_record)
            .transpose()
    }
}
