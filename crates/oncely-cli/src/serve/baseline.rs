//! `oncely serve --idempotency off`, the baseline a benchmark measures the layer against: the
//! same [`Tx`](oncely_sqlx::Tx) handlers with no idempotency at all, a plain transaction per
//! request (and idempotency switched off without a second copy of the handlers).
//!
//! Nothing is claimed and nothing is stored: a retry executes again. Never use it where
//! requests may be retried.

use async_trait::async_trait;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, FencingToken, Fingerprint, IdempotencyKey,
    KeyStore, Record, RecordKey, Scope, StoreError, StoredResponse, UnixMillis,
};
use oncely_sqlx::{SqlStore, TransactionalClaimer, TxError};
use oncely_tower::Claimer as _;
use sqlx::{Database, Pool, Transaction};
use std::time::Duration;

/// `serve --idempotency off`: the same handlers on a plain transaction, with no claim.
pub async fn unclaimed<DB: sqlx::Database>(
    State(pool): State<sqlx::Pool<DB>>,
    mut req: Request,
    next: Next,
) -> Response {
    let scope = req
        .extensions()
        .get::<Scope>()
        .cloned()
        .unwrap_or_else(|| Scope::new("anonymous"));
    let key = IdempotencyKey::from_header_values(
        req.headers()
            .get_all("idempotency-key")
            .iter()
            .map(HeaderValue::as_bytes),
    )
    .or_else(|_| IdempotencyKey::new(&uuid::Uuid::new_v4().to_string()))
    .expect("a UUID is a valid key");
    let id = RecordKey::new(scope, key);
    if let Err(e) = attach(&pool, id, req.extensions_mut()).await {
        return TxError::from(e).into_response();
    }
    next.run(req).await
}

/// Opens a plain transaction on `pool` and puts it into `extensions` as the request's
/// [`Tx`](oncely_sqlx::Tx) (of store type [`UnclaimedStore<DB>`]), so a handler written for the
/// layer runs unchanged with no claim and nothing stored. `id` is what
/// [`Tx::id`](oncely_sqlx::Tx::id) reports. It is the transactional claimer's own hand-over
/// ([`TransactionalClaimer`]) over a store whose claim is granted at once: the lease it names
/// (30 seconds) is never renewed or checked, and nothing is retained.
///
/// # Errors
///
/// [`StoreError::Unavailable`] when no transaction could be begun.
async fn attach<DB: Database>(
    pool: &Pool<DB>,
    id: RecordKey,
    extensions: &mut http::Extensions,
) -> Result<(), StoreError> {
    let claim = ClaimRequest::new(
        id,
        Fingerprint::from_parts(0, [0; 32]),
        Duration::from_secs(30),
        Duration::ZERO,
        Duration::ZERO,
    );
    TransactionalClaimer::new(UnclaimedStore(pool.clone()))
        .claim(claim, extensions)
        .await
        .map(drop)
}

/// A "store" that claims everything and keeps nothing: the store type of the
/// [`Tx`](oncely_sqlx::Tx) that [`unclaimed`] hands out, so a handler generic over its store
/// takes `Tx<UnclaimedStore<DB>>` on the baseline's routes.
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
