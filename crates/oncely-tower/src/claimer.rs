//! [`Claimer`]: how the layer makes a claim, the plug point for transactional stores. See
//! [`claim`](crate::claim) for who ends a claim.

use async_trait::async_trait;
use oncely_core::{ClaimOutcome, ClaimRequest, KeyStore, StoreError};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Makes the claim of one request: one [`KeyStore::claim`] call by default
/// ([`StoreClaimer`]), or a claim inside the handler's own transaction (`oncely-sqlx`).
#[async_trait]
pub trait Claimer: Send + Sync + 'static {
    /// Claims `req` by the shared rule ([`oncely_core::decide`]). On
    /// [`ClaimOutcome::Claimed`] it may put what the handler needs (an open transaction) into
    /// `extensions`, the claimed request's extensions.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store cannot answer: the layer fails closed with
    /// `503` and the handler never runs.
    async fn claim(
        &self,
        req: ClaimRequest,
        extensions: &mut http::Extensions,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Who completes the record: the layer (the default), or the handler's transaction.
    fn kind(&self) -> ClaimerKind {
        ClaimerKind::Store
    }

    /// For a claimer whose duplicates would wait inside the store (a transactional claim's
    /// duplicate waits for the first one's uncommitted row, holding a pooled connection): how
    /// long a duplicate of a request this process is claiming or running waits in the process
    /// instead, with no connection, before it claims. One request per key at a time goes to
    /// the store from this process, until the first one's claim commits. A duplicate still
    /// waiting at the bound is answered in flight (`409`, or the layer's in-flight mode).
    /// Default `None`: claims go straight to the store (its answer to a duplicate is
    /// immediate).
    fn local_wait(&self) -> Option<Duration> {
        None
    }
}

/// Who completes a claimed request's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimerKind {
    /// The claim is committed in the store at once; the layer renews it, and after the handler
    /// stores its response or releases the key ([`StoreClaimer`]).
    Store,
    /// The handler's transaction completes the record (`oncely_sqlx::Tx::commit`). After a
    /// handler that did not, the layer suspends the request at its last committed recovery
    /// point, or releases the key if no phase committed one, or leaves it alone if nothing
    /// committed at all.
    Transactional {
        /// Whether the claim rides in the handler's first transaction (commits with its first
        /// phase: SQLite, PostgreSQL), rather than being committed at once in a key store of
        /// its own (`oncely_sqlx::Split`).
        claim_in_transaction: bool,
    },
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
    ) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(req).await
    }
}
