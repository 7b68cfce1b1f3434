//! [`attach_unclaimed`]: the same [`Tx`](crate::Tx) handlers with no idempotency at all, a plain
//! transaction per request, for the baseline a benchmark measures the layer against (and for
//! switching idempotency off without a second copy of the handlers).
//!
//! Nothing is claimed and nothing is stored: a retry executes again. Never use it where
//! requests may be retried.

use crate::error::TxError;
use crate::store::SqlStore;
use crate::tx::{Shared, TxSlot};
use async_trait::async_trait;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Record, RecordKey,
    StoreError, StoredResponse, UnixMillis,
};
use sqlx::{Database, Pool, Transaction};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A "store" that claims everything and keeps nothing (see the [`unclaimed`](crate::unclaimed) module): the store
/// type of the [`Tx`](crate::Tx) that [`attach_unclaimed`] hands out, so a handler generic over
/// its store takes `Tx<UnclaimedStore<DB>>` on such routes.
pub struct UnclaimedStore<DB: Database>(Pool<DB>);

impl<DB: Database> Clone for UnclaimedStore<DB> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<DB: Database> std::fmt::Debug for UnclaimedStore<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnclaimedStore").finish_non_exhaustive()
    }
}

fn granted() -> ClaimOutcome {
    ClaimOutcome::Claimed(Claim::new(FencingToken(1), UnixMillis::MAX, ClaimKind::New))
}

#[async_trait]
impl<DB: Database> KeyStore for UnclaimedStore<DB> {
    async fn claim(&self, _: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Ok(granted())
    }
    async fn renew(&self, _: &RecordKey, _: FencingToken, _: Duration) -> Result<i64, StoreError> {
        Ok(UnixMillis::MAX)
    }
    async fn checkpoint(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: &str,
        _: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    async fn complete(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: StoredResponse,
        _: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    async fn release(&self, _: &RecordKey, _: FencingToken) -> Result<(), StoreError> {
        Ok(())
    }
    async fn get(&self, _: &RecordKey) -> Result<Option<Record>, StoreError> {
        Ok(None)
    }
}

#[async_trait]
impl<DB: Database> SqlStore for UnclaimedStore<DB> {
    type Database = DB;
    async fn claim_tx(
        &self,
        _: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, DB>>), StoreError> {
        Ok((granted(), Some(self.begin().await?)))
    }
    async fn begin_phase(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: Duration,
    ) -> Result<Transaction<'static, DB>, StoreError> {
        self.begin().await
    }
    async fn checkpoint_in(
        &self,
        _: &mut DB::Connection,
        _: &RecordKey,
        _: FencingToken,
        _: &str,
        _: Duration,
        _: Option<&[u8]>,
    ) -> Result<(), TxError> {
        Ok(())
    }
    async fn complete_in(
        &self,
        _: &mut DB::Connection,
        _: &RecordKey,
        _: FencingToken,
        _: &StoredResponse,
        _: Duration,
        _: bool,
    ) -> Result<(), TxError> {
        Ok(())
    }
}

impl<DB: Database> UnclaimedStore<DB> {
    async fn begin(&self) -> Result<Transaction<'static, DB>, StoreError> {
        self.0.begin().await.map_err(StoreError::unavailable)
    }
}

/// Opens a plain transaction on `pool` and puts it into `extensions` as the request's
/// [`Tx`](crate::Tx) (of store type [`UnclaimedStore<DB>`]), so a handler written for
/// the layer runs unchanged with no claim and nothing stored. `id` is what
/// [`Tx::id`](crate::Tx::id) reports.
///
/// # Errors
///
/// [`TxError::Store`] when no transaction could be begun.
pub async fn attach_unclaimed<DB: Database>(
    pool: &Pool<DB>,
    id: RecordKey,
    extensions: &mut http::Extensions,
) -> Result<(), TxError> {
    let store = UnclaimedStore(pool.clone());
    let tx = store.begin().await?;
    let shared = Arc::new(Shared {
        store,
        id,
        token: FencingToken(1),
        lease: Duration::from_secs(30),
        retention: Duration::ZERO,
        first: Mutex::new(Some(tx)),
        deferred_request: Mutex::new(None),
    });
    extensions.insert(TxSlot(shared));
    Ok(())
}
