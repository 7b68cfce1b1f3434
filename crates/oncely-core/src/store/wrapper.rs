//! [`StoreWrapper`]: a store that changes a few operations of another one writes only those.

use super::operator::{Operator, OperatorError, RecordFilter, RecordPage, RecordVersion};
use super::{
    ClaimOutcome, ClaimRequest, KeyStore, Maintenance, ReapReport, RedriveNote, StoreError,
};
use crate::key::RecordKey;
use crate::record::{FencingToken, Record, Redrives, StoredResponse, UnixMillis};
use async_trait::async_trait;
use std::time::Duration;

/// A store over another store (its [`inner`](StoreWrapper::inner)) that changes some of its
/// operations: a fault injector, a store that is not reachable yet, a timer, a router. Every
/// operation has a default that forwards to the inner store, so an implementation writes only
/// what it changes; every `StoreWrapper` is a [`KeyStore`], and a [`Maintenance`] store too when
/// its inner store is one.
///
/// [`inner`](StoreWrapper::inner) may fail: the error is what every forwarded operation
/// answers (a store not connected yet answers [`StoreError::Unavailable`]), so a wrapper that
/// only gates its inner store writes nothing but `inner`.
///
/// ```
/// use async_trait::async_trait;
/// use oncely_core::{FencingToken, KeyStore, MemoryStore, RecordKey, StoreError, UnixMillis};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
///
/// /// Counts lease renewals; everything else is the memory store's.
/// struct CountRenewals {
///     inner: MemoryStore,
///     renewals: AtomicU64,
/// }
///
/// #[async_trait]
/// impl oncely_core::StoreWrapper for CountRenewals {
///     type Inner = MemoryStore;
///     fn inner(&self) -> Result<&MemoryStore, StoreError> {
///         Ok(&self.inner)
///     }
///     async fn renew(
///         &self,
///         id: &RecordKey,
///         token: FencingToken,
///         lease: Duration,
///     ) -> Result<UnixMillis, StoreError> {
///         self.renewals.fetch_add(1, Ordering::Relaxed);
///         self.inner.renew(id, token, lease).await
///     }
/// }
///
/// // A `KeyStore` (and a `Maintenance` store, since the memory store is one):
/// let store: std::sync::Arc<dyn oncely_core::Maintenance> = std::sync::Arc::new(CountRenewals {
///     inner: MemoryStore::new(),
///     renewals: AtomicU64::new(0),
/// });
/// let layer_side: std::sync::Arc<dyn KeyStore> = store;
/// # let _ = layer_side;
/// ```
///
/// Implement it by its path (`impl oncely_core::StoreWrapper for ...`), as above, rather than
/// importing it: its operations have the names of [`KeyStore`]'s, so with both traits in scope
/// a call such as `wrapper.get(..)` on a wrapper value is ambiguous.
#[async_trait]
pub trait StoreWrapper: Send + Sync + 'static {
    /// The wrapped store.
    type Inner: KeyStore + ?Sized;

    /// The wrapped store, or the error every forwarded operation answers when there is none to
    /// call.
    ///
    /// # Errors
    ///
    /// Whatever the wrapper decides; usually [`StoreError::Unavailable`].
    fn inner(&self) -> Result<&Self::Inner, StoreError>;

    /// [`KeyStore::claim`]; forwards by default.
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner()?.claim(req).await
    }

    /// [`KeyStore::renew`]; forwards by default.
    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        self.inner()?.renew(id, token, lease).await
    }

    /// [`KeyStore::checkpoint`]; forwards by default.
    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner()?
            .checkpoint(id, token, recovery_point, lease)
            .await
    }

    /// [`KeyStore::complete`]; forwards by default.
    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.inner()?.complete(id, token, response, retention).await
    }

    /// [`KeyStore::release`]; forwards by default.
    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.inner()?.release(id, token).await
    }

    /// [`KeyStore::get`]; forwards by default.
    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.inner()?.get(id).await
    }

    /// [`Maintenance::reap`]; forwards by default.
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError>
    where
        Self::Inner: Maintenance,
    {
        self.inner()?.reap(batch).await
    }

    /// [`Maintenance::list_abandoned`]; forwards by default.
    async fn list_abandoned(&self, grace: Duration, limit: usize) -> Result<Vec<Record>, StoreError>
    where
        Self::Inner: Maintenance,
    {
        self.inner()?.list_abandoned(grace, limit).await
    }

    /// [`Maintenance::note_redrive`]; forwards by default.
    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError>
    where
        Self::Inner: Maintenance,
    {
        self.inner()?
            .note_redrive(id, token, attempts_seen, note)
            .await
    }

    /// [`Maintenance::list_marked`]; forwards by default.
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError>
    where
        Self::Inner: Maintenance,
    {
        self.inner()?.list_marked(limit).await
    }

    /// [`Operator::list_records`]; forwards by default.
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError>
    where
        Self::Inner: Operator,
    {
        self.inner()?.list_records(filter, limit, cursor).await
    }

    /// [`Operator::release_record`]; forwards by default.
    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError>
    where
        Self::Inner: Operator,
    {
        self.inner()?.release_record(id, seen, force).await
    }

    /// [`Operator::resolve_record`]; forwards by default.
    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError>
    where
        Self::Inner: Operator,
    {
        self.inner()?
            .resolve_record(id, seen, response, retention, force)
            .await
    }

    /// [`Operator::retry_record`]; forwards by default.
    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError>
    where
        Self::Inner: Operator,
    {
        self.inner()?.retry_record(id, seen, attempts).await
    }
}

#[async_trait]
impl<W: StoreWrapper> KeyStore for W {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        StoreWrapper::claim(self, req).await
    }
    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        StoreWrapper::renew(self, id, token, lease).await
    }
    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        StoreWrapper::checkpoint(self, id, token, recovery_point, lease).await
    }
    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        StoreWrapper::complete(self, id, token, response, retention).await
    }
    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        StoreWrapper::release(self, id, token).await
    }
    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        StoreWrapper::get(self, id).await
    }
}

#[async_trait]
impl<W: StoreWrapper> Maintenance for W
where
    W::Inner: Maintenance,
{
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        StoreWrapper::reap(self, batch).await
    }
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        StoreWrapper::list_abandoned(self, grace, limit).await
    }
    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        StoreWrapper::note_redrive(self, id, token, attempts_seen, note).await
    }
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        StoreWrapper::list_marked(self, limit).await
    }
}

#[async_trait]
impl<W: StoreWrapper> Operator for W
where
    W::Inner: Operator,
{
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        StoreWrapper::list_records(self, filter, limit, cursor).await
    }
    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError> {
        StoreWrapper::release_record(self, id, seen, force).await
    }
    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError> {
        StoreWrapper::resolve_record(self, id, seen, response, retention, force).await
    }
    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError> {
        StoreWrapper::retry_record(self, id, seen, attempts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::key::{IdempotencyKey, Scope};
    use crate::store::memory::MemoryStore;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A memory store behind a switch: it writes nothing but `inner`.
    struct Gate {
        inner: MemoryStore,
        open: AtomicBool,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("closed")]
    struct Closed;

    impl StoreWrapper for Gate {
        type Inner = MemoryStore;
        fn inner(&self) -> Result<&MemoryStore, StoreError> {
            if self.open.load(Ordering::SeqCst) {
                Ok(&self.inner)
            } else {
                Err(StoreError::unavailable(Closed))
            }
        }
    }

    fn req(id: &RecordKey) -> ClaimRequest {
        let hour = Duration::from_secs(3600);
        ClaimRequest::new(
            id.clone(),
            Fingerprint::from_parts(1, [7; 32]),
            hour,
            hour,
            hour,
        )
    }

    #[tokio::test]
    async fn every_operation_forwards_or_answers_the_error_of_inner() {
        let gate = Arc::new(Gate {
            inner: MemoryStore::new(),
            open: AtomicBool::new(false),
        });
        let store: Arc<dyn Maintenance> = gate.clone();
        let id = RecordKey::new(Scope::new("s"), IdempotencyKey::new("k").unwrap());
        let t = FencingToken(1);
        let d = Duration::from_secs(1);
        let resp = || StoredResponse::new(200, vec![], vec![]);
        let closed = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Unavailable(_)));
        assert!(closed(store.claim(req(&id)).await.map(drop)));
        assert!(closed(store.renew(&id, t, d).await.map(drop)));
        assert!(closed(store.checkpoint(&id, t, "p", d).await));
        assert!(closed(store.complete(&id, t, resp(), d).await));
        assert!(closed(store.release(&id, t).await));
        assert!(closed(store.get(&id).await.map(drop)));
        assert!(closed(store.reap(10).await.map(drop)));
        assert!(closed(store.list_abandoned(d, 10).await.map(drop)));
        let note = RedriveNote::Mark;
        assert!(closed(store.note_redrive(&id, t, 0, note).await.map(drop)));
        assert!(closed(store.list_marked(10).await.map(drop)));
        // The operator's operations too (the memory store is an `Operator`).
        let ops: Arc<dyn Operator> = gate.clone();
        let v = RecordVersion::new(t, "in_flight");
        let refused = |r: Result<(), OperatorError>| {
            matches!(r, Err(OperatorError::Store(StoreError::Unavailable(_))))
        };
        let all = RecordFilter::default();
        assert!(refused(ops.list_records(&all, 10, None).await.map(drop)));
        assert!(refused(ops.release_record(&id, v, true).await.map(drop)));
        let resolve = ops.resolve_record(&id, v, resp(), d, true).await;
        assert!(refused(resolve.map(drop)));
        assert!(refused(ops.retry_record(&id, v, 0).await.map(drop)));
        assert_eq!(
            gate.inner.get(&id).await.unwrap(),
            None,
            "nothing reached it"
        );

        gate.open.store(true, Ordering::SeqCst);
        // Through the request-path view of the same store (upcast from `dyn Maintenance`).
        let layer_side: Arc<dyn KeyStore> = store.clone();
        let ClaimOutcome::Claimed(c) = layer_side.claim(req(&id)).await.unwrap() else {
            panic!("claimed")
        };
        layer_side.checkpoint(&id, c.token, "p", d).await.unwrap();
        let rec = gate
            .inner
            .get(&id)
            .await
            .unwrap()
            .expect("the inner store has it");
        assert_eq!(rec.recovery_point(), Some("p"));
        assert_eq!(rec.token, c.token);
        assert_eq!(store.list_marked(10).await.unwrap(), vec![]);
        let page = ops.list_records(&all, 10, None).await.unwrap();
        assert_eq!(page.records, vec![rec.clone()]);
        let released = ops
            .release_record(&id, RecordVersion::of(&rec), true)
            .await
            .unwrap();
        assert_eq!(gate.inner.get(&id).await.unwrap(), Some(released));
    }
}
