//! [`timed`]: every store call the layer makes, bounded by the store timeout and counted.

use crate::config::Config;
use crate::metrics::Counter;
use oncely_core::StoreError;
use std::future::Future;

/// One store call bounded by the store timeout; failures and timeouts count as store errors
/// (a fenced write does not: it is the store's answer, not its failure).
pub(crate) async fn timed<T>(
    config: &Config,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = std::time::Instant::now();
    let result = match tokio::time::timeout(config.store_timeout, call).await {
        Ok(r) => r,
        Err(elapsed) => Err(StoreError::unavailable(elapsed)),
    };
    crate::metrics::facade::store_call(
        config.metrics.store_label(),
        result.is_ok(),
        started.elapsed(),
    );
    if let Err(e) = &result
        && !matches!(e, StoreError::Fenced)
    {
        config.metrics.inc(Counter::store_errors);
    }
    result
}
