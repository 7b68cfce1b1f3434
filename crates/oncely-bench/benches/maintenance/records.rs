//! The records of a pass: completed ones loaded through the store, abandoned ones, and the
//! re-drive that completes them.

use async_trait::async_trait;
use futures::StreamExt;
use oncely_bench::{claim_request, response};
use oncely_core::{ClaimOutcome, ClaimRequest, Maintenance, Record, RecordKey, StoredRequest};
use oncely_jobs::{Redrive, RedriveError};
use std::sync::Arc;
use std::time::Duration;

/// The abandoned records of every pass.
pub(crate) const ABANDONED: usize = 100;

/// A re-drive as the server's would end: the key taken over (its lease lapsed) and completed.
pub(crate) struct CompleteThroughStore(pub(crate) Arc<dyn Maintenance>);

#[async_trait]
impl Redrive for CompleteThroughStore {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        let id = RecordKey::new(record.scope.clone(), record.key.clone());
        let req = ClaimRequest::new(
            id.clone(),
            record.fingerprint,
            Duration::from_secs(30),
            Duration::from_secs(86_400),
            Duration::from_secs(259_200),
        );
        match self.0.claim(req).await {
            Ok(ClaimOutcome::Claimed(c)) => {
                self.0
                    .complete(&id, c.token, response(256), Duration::from_secs(259_200))
                    .await
                    .map_err(|e| RedriveError::Unreachable(e.into()))?;
                Ok(201)
            }
            Ok(other) => Err(RedriveError::Unreachable(
                format!("not claimed: {other:?}").into(),
            )),
            Err(e) => Err(RedriveError::Unreachable(e.into())),
        }
    }
}

/// Stores `n` more completed records through the store (claim + complete), 256 at a time.
pub(crate) async fn load_through_store(
    store: &dyn Maintenance,
    prefix: &str,
    from: usize,
    n: usize,
) {
    let body = response(256);
    futures::stream::iter(from..from + n)
        .for_each_concurrent(256, |i| {
            let body = body.clone();
            async move {
                let req = claim_request(&format!("{prefix}-{i}"));
                let ClaimOutcome::Claimed(c) = store.claim(req.clone()).await.expect("claim")
                else {
                    panic!("a fresh key is claimed");
                };
                store
                    .complete(&req.id, c.token, body, req.retention)
                    .await
                    .expect("complete");
            }
        })
        .await;
}

/// Claims 100 fresh keys with a 1-millisecond lease and a stored request, and waits until
/// their leases lapsed: the abandoned requests of the next pass.
pub(crate) async fn abandon(store: &dyn Maintenance, prefix: &str, round: usize) {
    for i in 0..ABANDONED {
        let mut req = claim_request(&format!("{prefix}-abandoned-{round}-{i}")).with_request(Some(
            StoredRequest::new("POST", "/v1/orders", vec![], b"{}".to_vec()),
        ));
        req.lease = Duration::from_millis(1);
        assert!(matches!(
            store.claim(req).await.expect("claim"),
            ClaimOutcome::Claimed(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}
