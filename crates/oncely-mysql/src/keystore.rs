//! [`KeyStore`](oncely_core::KeyStore) for [`MySqlStore`]: each operation is the one the
//! transactional phases run (`within.rs`), on a pooled connection, implemented by
//! `oncely_sql::pooled_key_store!` (written once for the SQL stores that share it).

use crate::error::{is_deadlock, map};
use crate::row::record_from_row;
use crate::sql;
use crate::store::MySqlStore;
use oncely_core::{ClaimOutcome, ClaimRequest, Record, RecordKey, StoreError};

impl MySqlStore {
    /// The pooled claim: begin, [`MySqlStore::claim_in`]'s rounds, commit (see
    /// [`MySqlStore::claim_tx`]).
    async fn claim_pooled(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let (outcome, tx) = self.claim_tx(&req).await?;
        if let Some(tx) = tx {
            tx.commit().await.map_err(map)?;
        }
        Ok(outcome)
    }

    async fn fetch(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(sql::SELECT_RECORD)
            .bind(id.scope.as_str().as_bytes())
            .bind(id.key.as_str().as_bytes())
            .fetch_optional(self.pool())
            .await
            .map_err(map)?;
        row.as_ref().map(record_from_row).transpose()
    }
}

// Begin; [`MySqlStore::claim_in`]; commit (see [`MySqlStore::claim_tx`]) for the claim;
// every other write its in-transaction operation (`within.rs`) on a pooled connection, one
// statement in autocommit (renewals on the lease pool), run again after a deadlock.
oncely_sql::pooled_key_store!(
    MySqlStore,
    retry_if: is_deadlock,
    claim: Self::claim_pooled,
    get: Self::fetch,
);
