//! [`LeaseWatch`]: what a claimed request knows of its own lease, shared by the layer's
//! heartbeat and the handler.
//!
//! # The rule it serves
//!
//! A live request keeps its lease whatever it is doing: the heartbeat renews it every
//! `Policy::heartbeat` from the moment the claim is committed until the request ends, also while
//! one of its phases has a transaction open. But a heartbeat can still fall behind: the runtime
//! thread it needs is blocked by synchronous work, the store answers renewals slowly or not at
//! all, the pool has no connection to give it. Then the lease may lapse, and another request may
//! take the key over and resume the work. A request in that state must not make its next outside
//! call (a charge, an e-mail): the other request will make it. So before every outside call the
//! handler asks [`LeaseWatch::ensure_held`], which answers at once from what the heartbeat last
//! learned when the lease is known to be held for a while yet, and otherwise renews the lease
//! itself (one store call) before saying yes. A renewal that is fenced means another request owns
//! the key: the watch remembers it, and every later question is answered
//! [`StoreError::Fenced`] without asking the store.
//!
//! `oncely_sqlx::Between::call` asks it for every outside call made between two phases; a
//! non-transactional handler asks through
//! [`IdempotencyContext::ensure_lease`](crate::IdempotencyContext::ensure_lease).

use oncely_core::{Clock, FencingToken, KeyStore, RecordKey, StoreError, UnixMillis};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// One claimed request's lease, as the layer's heartbeat last saw it (see the
/// [module docs](self)). Cloning is cheap and shares the state.
#[derive(Clone)]
pub struct LeaseWatch(Arc<Inner>);

struct Inner {
    store: Arc<dyn KeyStore>,
    clock: Arc<dyn Clock>,
    id: RecordKey,
    token: FencingToken,
    lease: Duration,
    /// How much of the lease must be left for [`LeaseWatch::ensure_held`] to answer without
    /// asking the store: the heartbeat's interval.
    margin: Duration,
    store_timeout: Duration,
    /// The end of the last lease the store is known to have granted (epoch milliseconds): a
    /// lower bound of the lease's real end, never more.
    held_until: AtomicI64,
    /// Whether the store answered a renewal of this claim with [`StoreError::Fenced`].
    lost: AtomicBool,
    /// Whether the claim is committed in the store (for a claim that rides in the handler's
    /// first transaction, not before that transaction commits: until then no other request
    /// can see the key, and the store could not renew it).
    committed: AtomicBool,
}

impl fmt::Debug for LeaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseWatch")
            .field("id", &self.0.id)
            .field("token", &self.0.token)
            .field("held_until", &self.held_until())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

/// What the layer hands [`LeaseWatch::new`]: the claim and the settings it is renewed with.
pub(crate) struct LeaseTerms {
    pub(crate) store: Arc<dyn KeyStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) id: RecordKey,
    pub(crate) token: FencingToken,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) store_timeout: Duration,
    /// The lease end the claim was granted with (epoch milliseconds).
    pub(crate) lease_expires_at: UnixMillis,
    /// Whether the claim is committed already (a store claim), or rides in the handler's
    /// transaction until it commits.
    pub(crate) committed: bool,
}

impl LeaseWatch {
    pub(crate) fn new(terms: LeaseTerms) -> Self {
        Self(Arc::new(Inner {
            store: terms.store,
            clock: terms.clock,
            id: terms.id,
            token: terms.token,
            lease: terms.lease,
            margin: terms.heartbeat,
            store_timeout: terms.store_timeout,
            held_until: AtomicI64::new(terms.lease_expires_at),
            lost: AtomicBool::new(false),
            committed: AtomicBool::new(terms.committed),
        }))
    }

    /// `(scope, key)` of the claim.
    pub fn id(&self) -> &RecordKey {
        &self.0.id
    }

    /// The claim's fencing token.
    pub fn token(&self) -> FencingToken {
        self.0.token
    }

    /// Whether this request is known to have lost its claim: a renewal was fenced (another
    /// request took the key over after the lease lapsed). A request that has lost its claim
    /// must stop: it makes no further outside call, and its later writes are rejected.
    pub fn is_lost(&self) -> bool {
        self.0.lost.load(Ordering::Acquire)
    }

    /// The end of the last lease the store is known to have granted this claim, in epoch
    /// milliseconds of the store's clock: never later than the lease's real end (a phase's
    /// own commit may have extended it further).
    pub fn held_until(&self) -> UnixMillis {
        self.0.held_until.load(Ordering::Acquire)
    }

    /// Makes sure the claim is still this request's before an outside call: answers at once
    /// when the lease is known to be held for at least one more heartbeat interval (the usual
    /// case: the heartbeat keeps it so), else renews it now (one store call, bounded by the
    /// layer's store timeout). Call it with no transaction of the request open: on SQLite a
    /// renewal needs the database's write lock, which an open phase holds.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when another request owns the key now (this request must stop
    /// and make no outside call); [`StoreError::Unavailable`] when the lease may have lapsed
    /// and the store could not renew it in time (stop too: the request is suspended and a
    /// retry resumes it).
    pub async fn ensure_held(&self) -> Result<(), StoreError> {
        if self.is_lost() {
            return Err(StoreError::Fenced);
        }
        if !self.0.committed.load(Ordering::Acquire) {
            // The claim rides in this request's own open transaction: nobody else can take
            // it before that transaction commits.
            return Ok(());
        }
        let margin = oncely_core::clock::duration_millis(self.0.margin);
        if self.0.clock.now_millis().saturating_add(margin) < self.held_until() {
            return Ok(());
        }
        match self.renew().await {
            Ok(_) => Ok(()),
            Err(StoreError::Fenced) => {
                self.lose();
                Err(StoreError::Fenced)
            }
            Err(e) => Err(e),
        }
    }

    /// Renews the lease now, for [`LeaseWatch::ensure_held`].
    async fn renew(&self) -> Result<UnixMillis, StoreError> {
        let i = &self.0;
        let renewal = i.store.renew(&i.id, i.token, i.lease);
        match tokio::time::timeout(i.store_timeout, renewal).await {
            Ok(Ok(until)) => {
                self.renewed(until);
                Ok(until)
            }
            Ok(Err(e)) => Err(e),
            Err(elapsed) => Err(StoreError::unavailable(elapsed)),
        }
    }

    /// The store granted a lease until `until` (epoch milliseconds).
    pub(crate) fn renewed(&self, until: UnixMillis) {
        self.0.held_until.fetch_max(until, Ordering::AcqRel);
    }

    /// The claim is lost to another request.
    pub(crate) fn lose(&self) {
        self.0.lost.store(true, Ordering::Release);
    }

    /// The claim is committed in the store (the first commit of a claim that rode in the
    /// handler's transaction).
    pub(crate) fn commit(&self) {
        self.0.committed.store(true, Ordering::Release);
    }
}
