//! [`KeyStore`] for [`PostgresStore`]: each operation is the one the transactional phases run
//! (`claim.rs`, `within.rs`), on a pooled connection.

use crate::claim::ClaimPath;
use crate::error::{map, retry_transient};
use crate::store::PostgresStore;
use crate::within::read;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Record, RecordKey, StoreError,
    StoredResponse, UnixMillis,
};
use std::time::Duration;

/// Every operation is the one the transactional phases run (`claim.rs`, `within.rs`), here on a
/// pooled connection, outside any transaction block: each of its statements is then a
/// transaction of its own (`BEGIN`, the statement, `COMMIT`, in one round trip), and a
/// statement that failed with a transient conflict is run again (see [`PostgresStore`],
/// "Isolation, retries and lock waits").
#[async_trait]
impl KeyStore for PostgresStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_on(&mut *self.acquire().await?, &req, ClaimPath::Pooled)
            .await
    }

    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        if self.pool().is_closed() {
            // The store was closed: renewals end with it.
            return Err(map(sqlx::Error::PoolClosed));
        }
        // The lease pool: a renewal never waits for a connection of the main pool.
        let mut conn = self.lease_pool().acquire().await.map_err(map)?;
        retry_transient!(self.renew_in(&mut conn, id, token, lease).await)
    }

    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.acquire().await?;
        retry_transient!(
            self.checkpoint_in(&mut conn, id, token, recovery_point, lease, None)
                .await
        )
    }

    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.acquire().await?;
        retry_transient!(
            self.complete_in(&mut conn, id, token, &response, retention)
                .await
        )
    }

    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let mut conn = self.acquire().await?;
        retry_transient!(self.release_in(&mut conn, id, token).await)
    }

    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        retry_transient!(read(self.pool(), id).await)
    }
}
