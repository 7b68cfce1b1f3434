//! What the claimer and a claimed request's phases share ([`Shared`]), and the request
//! extension that carries it from the claimer to the handler's first [`Tx`](crate::Tx)
//! ([`TxSlot`]).

use crate::store::SqlStore;
use oncely_core::{FencingToken, RecordKey, StoredRequest};
use sqlx::Transaction;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the claimer and the request's phases share about one claimed request.
pub(crate) struct Shared<S: SqlStore> {
    pub(crate) store: S,
    pub(crate) id: RecordKey,
    pub(crate) token: FencingToken,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    /// The first phase's transaction (it holds the claim) until the handler takes it.
    pub(crate) first: Mutex<Option<Transaction<'static, S::Database>>>,
    /// The request the claim left out (an atomic store's claimer defers it), until a
    /// checkpoint commits it.
    pub(crate) deferred_request: Mutex<Option<StoredRequest>>,
}

/// The request extension through which the claimer hands the first phase to the handler.
pub(crate) struct TxSlot<S: SqlStore>(pub(crate) Arc<Shared<S>>);

impl<S: SqlStore> Clone for TxSlot<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}
