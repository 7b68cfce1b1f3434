//! [`TransactionalClaimer`]: claims inside the handler's own transaction.

use crate::shared::{Shared, TxSlot};
use crate::store::SqlStore;
use async_trait::async_trait;
use oncely_core::{ClaimOutcome, ClaimRequest, StoreError};
use oncely_tower::{Claimer, ClaimerKind};
use std::fmt;
use std::sync::{Arc, Mutex};

/// The [`Claimer`] of [`layer`](crate::layer): opens the handler's transaction and claims
/// inside it, so the claim commits with the handler's first phase (for a single-phase handler:
/// claim, business writes and stored response in one commit).
///
/// # What a duplicate sees
///
/// - While the first request's transaction is open, its uncommitted claim holds the key: a
///   concurrent duplicate **waits** for it, then replays the committed response, or executes
///   if the first rolled back.
/// - A duplicate that reaches the process running the first request waits in that process,
///   holding no database connection ([`Claimer::local_wait`], up to
///   [`LOCAL_WAIT`](Self::LOCAL_WAIT), 4 seconds, then `409 idempotency_request_in_flight`
///   with `Retry-After`), and claims once the first's claim has committed (a replay: two
///   statements on PostgreSQL and MySQL, one on SQLite). So a burst of retries of one slow
///   request cannot take the pool's connections from other keys' requests.
/// - A duplicate that reaches another process waits in the database. On PostgreSQL it waits in
///   short tries that hold a connection only while they run (`PostgresStore::claim_tx`: each
///   try waits at most 10 milliseconds on the key's unique-index entry, then gives its
///   connection back and pauses, 20 milliseconds doubling up to 200), so a burst of retries
///   across processes cannot use up a pool either; after `PostgresStore::CLAIM_WAIT`
///   (1 second) it gets `409 idempotency_request_in_flight` with `Retry-After`. On MySQL and
///   MariaDB it waits on the key's row, bounded by `innodb_lock_wait_timeout`
///   (`MySqlStore::TX_LOCK_TIMEOUT`, 4 seconds, set by the transaction itself), holding its
///   connection, then gets the `409`. On SQLite it waits for the write lock, bounded by the
///   busy timeout (5 seconds), then gets `503`: every writer, of any key, waits for the one
///   write lock (keep transactions short).
/// - Once a multi-step request committed its first phase, a duplicate gets the layer's usual
///   in-flight answer while it runs.
/// - A replay or a mismatch never enters the handler and never leaves a write behind (on SQLite
///   it is answered from a read that takes no lock).
pub struct TransactionalClaimer<S: SqlStore> {
    store: S,
}

impl<S: SqlStore> TransactionalClaimer<S> {
    /// How long a duplicate of a request this process is running waits in the process before
    /// it is answered in flight ([`Claimer::local_wait`]): 4 seconds. Such a wait holds no
    /// connection, so it may be longer than that of a duplicate that reached another process
    /// (`PostgresStore::CLAIM_WAIT`, 1 second, in tries that each take a connection).
    pub const LOCAL_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

    /// A claimer over `store` (use [`layer`](crate::layer), which installs it).
    pub fn new(store: S) -> Self {
        Self { store }
    }
}

impl<S: SqlStore> fmt::Debug for TransactionalClaimer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalClaimer")
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: SqlStore> Claimer for TransactionalClaimer<S> {
    async fn claim(
        &self,
        mut req: ClaimRequest,
        extensions: &mut http::Extensions,
    ) -> Result<ClaimOutcome, StoreError> {
        // On an atomic store nobody reads the record before the claim's transaction commits,
        // and a single-phase request clears the stored request again at its completion in the
        // same commit: the request is stored with the first checkpoint instead, the first
        // commit after which the completer may need it (see `SqlStore::checkpoint_in`).
        let deferred = if self.store.atomic() {
            req.request.take()
        } else {
            None
        };
        let (outcome, tx) = self.store.claim_tx(&req).await?;
        let (ClaimOutcome::Claimed(claim), Some(tx)) = (&outcome, tx) else {
            // Nothing was written (an answer comes without a transaction).
            return Ok(outcome);
        };
        let shared = Arc::new(Shared {
            store: self.store.clone(),
            id: req.id.clone(),
            token: claim.token,
            lease: req.lease,
            retention: req.retention,
            first: Mutex::new(Some(tx)),
            deferred_request: Mutex::new(deferred),
        });
        extensions.insert(TxSlot(shared));
        Ok(outcome)
    }

    /// The handler's transaction completes the record; the claim rides in it unless the store
    /// is split (its claim committed at once in the key store).
    fn kind(&self) -> ClaimerKind {
        ClaimerKind::Transactional {
            claim_in_transaction: self.store.atomic(),
        }
    }

    /// 4 seconds ([`LOCAL_WAIT`](Self::LOCAL_WAIT)): a duplicate of a request this process is
    /// running waits that long in the process, with no connection, instead of in the
    /// database, where each of its tries would take a pooled connection.
    fn local_wait(&self) -> Option<std::time::Duration> {
        Some(Self::LOCAL_WAIT)
    }
}
