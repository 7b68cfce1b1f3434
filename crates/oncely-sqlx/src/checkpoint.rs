//! A checkpoint and what lies between two phases: [`Tx::checkpoint`] commits a phase with its
//! recovery point and returns a [`Between`], the multi-step request with no transaction open,
//! which makes the outside call ([`Between::call`]) and opens the next phase
//! ([`Between::begin`]).

use crate::error::TxError;
use crate::phase::{reported, warn_if_long};
use crate::shared::Shared;
use crate::store::SqlStore;
use crate::tx::Tx;
use oncely_core::{RecordKey, StoredRequest};
use oncely_tower::ClaimState;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A multi-step request between two phases, after [`Tx::checkpoint`] committed: make the
/// outside call with [`Between::call`], then [`Between::begin`] the next phase.
///
/// # Outside calls, phases and the lease
///
/// The rule: record the intent, commit, call the outside system with **no transaction open**,
/// record its result in the next phase. That is the shape this type gives a handler:
///
/// ```text
/// let between = tx.checkpoint(&Step::Recorded { .. }).await?;   // phase 1 commits the intent
/// let charge = between.call(|| charge_card(key)).await?;        // no transaction open
/// let mut tx = between.begin().await?;                           // phase 2 records the result
/// ```
///
/// Between phases the request holds no database connection and no lock, and the layer's
/// heartbeat renews its lease (every `Policy::heartbeat`, a third of the lease by default),
/// also while a phase is open, so an outside call may take many times the lease. An outside
/// call made inside a phase (a `Tx` held across it) works, but holds a pooled connection and
/// the phase's locks for the call's whole duration: on SQLite that is the database's one write
/// lock, so no other request (and no renewal of this one's lease) can write meanwhile, and
/// readers see this request's lease lapse. A phase held open for more than half the lease is
/// logged as a warning for that reason.
///
/// Before each outside call, [`Between::call`] makes sure the request still holds its claim:
/// a request whose heartbeat fell behind (a blocked runtime thread, a slow or failing store)
/// may have lost its lease to another request, which then resumes the work from the last
/// recovery point and makes the call itself. A request that lost its claim never makes its
/// next outside call ([`TxError::Fenced`], answered `409 idempotency_request_in_flight`).
pub struct Between<S: SqlStore> {
    shared: Arc<Shared<S>>,
    claim: Option<Arc<ClaimState>>,
}

impl<S: SqlStore> fmt::Debug for Between<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Between")
            .field("id", &self.shared.id)
            .field("token", &self.shared.token)
            .finish_non_exhaustive()
    }
}

impl<S: SqlStore> Between<S> {
    pub(crate) fn new(shared: Arc<Shared<S>>, claim: Option<Arc<ClaimState>>) -> Self {
        Self { shared, claim }
    }

    /// `(scope, key)` of the request.
    pub fn id(&self) -> &RecordKey {
        &self.shared.id
    }

    /// Makes one outside call between two phases, with no transaction open: runs `call` once
    /// this request is known to hold its claim (see the [type docs](Between)), and returns
    /// its output. Derive the idempotency key the call carries from ours
    /// ([`derived_key`](crate::derived_key)), so that even a repeated call is collapsed by a
    /// system that honours keys.
    ///
    /// The check answers at once while the layer's heartbeat keeps the lease (no store call);
    /// if the heartbeat fell behind, it renews the lease first (one store call). While `call`
    /// runs, a graceful shutdown of the server ([`oncely_tower::Drain::abandon`]) does not
    /// suspend the request: it keeps the lease renewed and waits for the call to return (at
    /// most [`oncely_tower::Drain::with_outside_call_wait`]), refuses the request's next
    /// outside call, and lets the layer suspend it at the recovery point the next phase
    /// records; past that bound the lease is left to lapse, never cut while the call may still
    /// land.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`] when another request took the key over (its lease lapsed): `call`
    /// is not made, and the request must stop (return the error: it answers
    /// `409 idempotency_request_in_flight`). [`TxError::Store`] when the lease may have lapsed
    /// and the store did not answer a renewal in time: `call` is not made either, and the
    /// request is suspended at its recovery point for a retry to resume; the same once the
    /// server began suspending its running requests for a shutdown.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, TxError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        if let Some(claim) = &self.claim {
            if claim.is_completed() {
                return Err(TxError::AlreadyCompleted);
            }
            return Ok(claim.outside_call(call).await?);
        }
        Ok(call().await)
    }

    /// Begins the next phase: a new transaction, opened by the store's fencing step
    /// ([`SqlStore::begin_phase`]: on SQLite and on split stores a conditional renewal of the
    /// lease; on PostgreSQL and MySQL nothing, so the phase takes no lock on the record), whose
    /// closing write ([`Tx::checkpoint`] or [`Tx::commit`]) carries the fencing token: if
    /// another request took the key over meanwhile, nothing of the phase commits.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`] when this request is known to have lost its claim, or the store's
    /// fencing step found another owner (stop: it owns the work now); [`TxError::Store`] when
    /// the store failed.
    pub async fn begin(&self) -> Result<Tx<S>, TxError> {
        let sh = &self.shared;
        if let Some(claim) = &self.claim {
            if claim.is_completed() {
                return Err(TxError::AlreadyCompleted);
            }
            if claim.is_lost() {
                return Err(TxError::Fenced);
            }
        }
        let tx = sh.store.begin_phase(&sh.id, sh.token, sh.lease).await?;
        Ok(Tx::new(tx, Arc::clone(sh), self.claim.clone(), false))
    }
}

impl<S: SqlStore> Tx<S> {
    /// Commits this phase with `step` as its recovery point (serialized as JSON): a retry that
    /// takes the request over after a crash gets it back from [`Tx::resume_from`] and goes on
    /// from there. Call it before every outside call, and make the call with the returned
    /// [`Between`] ([`Between::call`]), with no transaction open; the call itself then carries
    /// an idempotency key derived from ours (see [`derived_key`](crate::derived_key)).
    ///
    /// # Errors
    ///
    /// As [`Tx::commit`], and [`TxError::RecoveryPoint`](crate::TxError::RecoveryPoint) when
    /// `step` does not serialize.
    pub async fn checkpoint<T: Serialize>(
        mut self,
        step: &T,
    ) -> Result<Between<S>, crate::TxError> {
        let rp = serde_json::to_string(step)?;
        let mut tx = self.take();
        let sh = Arc::clone(&self.shared);
        warn_if_long(&sh, self.opened);
        let request = sh
            .deferred_request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(StoredRequest::encode);
        let written = sh
            .store
            .checkpoint_in(&mut tx, &sh.id, sh.token, &rp, sh.lease, request.as_deref())
            .await;
        match written {
            Ok(()) => sh.store.commit(tx).await,
            Err(e) => Err(e),
        }
        .map_err(|e| reported(&sh, e))?;
        *sh.deferred_request
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        if let Some(claim) = &self.claim {
            claim.phase_committed(Some(rp));
        }
        Ok(Between::new(sh, self.claim.clone()))
    }
}
