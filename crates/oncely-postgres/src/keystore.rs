//! [`KeyStore`](oncely_core::KeyStore) for [`PostgresStore`]: each operation is the one the
//! transactional phases run (`claim.rs`, `within.rs`), on a pooled connection, implemented by
//! `oncely_sql::pooled_key_store!` (written once for the SQL stores that share it).

use crate::claim::ClaimPath;
use crate::error::{is_transient, retry_transient};
use crate::store::PostgresStore;
use crate::within::read;
use oncely_core::{ClaimOutcome, ClaimRequest, Record, RecordKey, StoreError};

impl PostgresStore {
    /// The pooled claim: the claim's rounds (`claim.rs`) on a pooled connection, outside any
    /// transaction block.
    async fn claim_pooled(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_on(&mut *self.acquire().await?, &req, ClaimPath::Pooled)
            .await
    }

    /// The plain read of a record on the pool, run again after a transient conflict.
    async fn get_pooled(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        retry_transient!(read(self.pool(), id).await)
    }
}

// Every operation is the one the transactional phases run (`claim.rs`, `within.rs`), here on a
// pooled connection, outside any transaction block: each of its statements is then a
// transaction of its own (`BEGIN`, the statement, `COMMIT`, in one round trip), and a
// statement that failed with a transient conflict is run again (see [`PostgresStore`],
// "Isolation, retries and lock waits"). Renewals run on the lease pool.
oncely_sql::pooled_key_store!(
    PostgresStore,
    retry_if: is_transient,
    claim: Self::claim_pooled,
    get: Self::get_pooled,
);
