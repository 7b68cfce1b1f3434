//! [`Claimer`]: how the layer makes a claim, the plug point for transactional stores.
//!
//! By default ([`StoreClaimer`]) a claim is one [`KeyStore::claim`] call that commits at once,
//! and the layer then renews, completes or releases the record through the same store. A
//! transactional claimer (the `oncely-sqlx` crate) instead opens the handler's own database
//! transaction and claims inside it: the claim, the business writes and the stored response
//! then commit together, in one commit for a single-phase handler. It hands the open
//! transaction to the handler through the request extensions and reports, through a
//! [`ClaimProgress`] in the [`IdempotencyContext`](crate::IdempotencyContext), what the layer
//! may still do with the record.

use async_trait::async_trait;
use oncely_core::{ClaimOutcome, ClaimRequest, KeyStore, Problem, StoreError};
use std::fmt;
use std::sync::Arc;

/// Makes the claim of one request (see the [module docs](self)).
#[async_trait]
pub trait Claimer: Send + Sync + 'static {
    /// Claims `req` by the shared rule ([`oncely_core::decide`]). On
    /// [`ClaimOutcome::Claimed`] it may put what the handler needs (an open transaction) into
    /// `extensions`, the claimed request's extensions, and return a [`ClaimProgress`] that the
    /// layer consults while and after the handler runs; `None` means the claim is committed in
    /// the store and the layer owns the record's life (heartbeat, completion, release).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store cannot answer: the layer fails closed with
    /// `503` and the handler never runs.
    async fn claim(
        &self,
        req: ClaimRequest,
        extensions: &mut http::Extensions,
    ) -> Result<(ClaimOutcome, Option<Arc<dyn ClaimProgress>>), StoreError>;

    /// For a claimer whose duplicates would wait inside the store (a transactional claim's
    /// duplicate waits for the first one's uncommitted row, holding a pooled connection): how
    /// long a duplicate of a request this process is claiming or running waits in the process
    /// instead, with no connection, before it claims. One request per key at a time goes to
    /// the store from this process, until the first one's claim commits. A duplicate still
    /// waiting at the bound is answered in flight (`409`, or the layer's in-flight mode).
    /// Default `None`: claims go straight to the store (its answer to a duplicate is
    /// immediate).
    fn local_wait(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The default [`Claimer`]: one [`KeyStore::claim`] call, committed at once.
#[derive(Clone)]
pub struct StoreClaimer(pub Arc<dyn KeyStore>);

impl fmt::Debug for StoreClaimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreClaimer")
    }
}

#[async_trait]
impl Claimer for StoreClaimer {
    async fn claim(
        &self,
        req: ClaimRequest,
        _: &mut http::Extensions,
    ) -> Result<(ClaimOutcome, Option<Arc<dyn ClaimProgress>>), StoreError> {
        Ok((self.0.claim(req).await?, None))
    }
}

/// Where a claim made by a transactional [`Claimer`] stands, as the layer needs to know it.
///
/// The layer reads it (never blocking) in its heartbeat and after the handler returned:
///
/// | state | heartbeat | after the handler returned |
/// |---|---|---|
/// | the handler's transaction completed the record | stops | returns the response, writes nothing |
/// | the claim is not committed (it rode in a transaction that rolled back or is still open) | not started | returns the response, writes nothing: a rollback undid the claim with the writes |
/// | the claim is committed (a phase committed), not completed | renews, also while a phase transaction is open | suspends the request at its recovery point (the next retry resumes there), or releases the key if no phase committed a recovery point |
pub trait ClaimProgress: Send + Sync + 'static {
    /// Whether the claim is committed in the store (false while it rides in a transaction
    /// that has not committed).
    fn committed(&self) -> bool;
    /// Whether a transaction completed the record with its stored response.
    fn completed(&self) -> bool;
    /// The last committed recovery point, if any.
    fn recovery_point(&self) -> Option<String>;
    /// Runs `start` (which starts the layer's lease heartbeat) when the claim first commits,
    /// or at once if it is committed already. Until then there is nothing to renew, so a
    /// single-phase request never starts a heartbeat at all. The default runs it at once.
    fn on_first_commit(&self, start: Box<dyn FnOnce() + Send>) {
        start();
    }
    /// Runs once after the handler returned without completing the record, before the layer
    /// asks [`committed`](Self::committed), [`recovery_point`](Self::recovery_point) or
    /// [`unfinished_answer`](Self::unfinished_answer): the place to finish what the handler
    /// left (`oncely-sqlx` waits there for the rollback of a transaction the handler dropped,
    /// and learns whether the handler had ended it itself). The default does nothing.
    fn settle(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
    /// The answer to send instead of the handler's when the handler returned without
    /// completing the record, asked after the layer ended the claim as the table above says:
    /// `Some((problem, retry_after_secs))` is rendered in the layer's dialect (problem+json,
    /// or a gRPC status), `None` (the default) sends the handler's response. `extensions` are
    /// the handler's response's.
    ///
    /// `oncely-sqlx` uses it so that a phase that failed after an earlier phase committed
    /// answers what is true (the request stopped at its recovery point, and a retry with the
    /// same key resumes there) rather than the "nothing was committed" its error alone says.
    fn unfinished_answer(&self, extensions: &http::Extensions) -> Option<(Problem, Option<u64>)> {
        let _ = extensions;
        None
    }
}

impl fmt::Debug for dyn ClaimProgress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimProgress")
            .field("committed", &self.committed())
            .field("completed", &self.completed())
            .finish()
    }
}
