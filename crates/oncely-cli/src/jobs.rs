//! `oncely reap`, `oncely complete` and the in-process completer of `oncely serve`.

use crate::serve::{StoreUrl, open_store};
use anyhow::Result;
use async_trait::async_trait;
use oncely_core::{Maintenance, Record};
use oncely_jobs::{
    Completer, CompleterCounters, Redrive, RedriveError, RedrivePolicy, complete_abandoned,
    reap_all,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Re-drives a stored request over HTTP to the reference server, as the record's scope (the
/// reference server's stand-in authentication: `Authorization: Bearer <scope>`) and with the
/// record's own `Idempotency-Key`, so the server's layer takes the lapsed claim over and resumes
/// at the recovery point.
pub struct HttpRedrive {
    base: String,
    http: reqwest::Client,
}

impl HttpRedrive {
    /// Re-drives through the server at `base` (`http://host:port`).
    ///
    /// # Errors
    ///
    /// `base` is not an `http://` URL with a host.
    pub fn new(base: &str) -> Result<Self> {
        let url = reqwest::Url::parse(base).map_err(|e| {
            anyhow::anyhow!("--server-url {base:?} is not a URL ({e}); expected http://HOST:PORT")
        })?;
        if url.scheme() != "http" || url.host_str().is_none() {
            anyhow::bail!(
                "--server-url {base:?}: expected http://HOST:PORT (https is not built in)"
            );
        }
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }
}

#[async_trait]
impl Redrive for HttpRedrive {
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError> {
        let req = record.request.as_ref().ok_or(RedriveError::NoRequest)?;
        let method = reqwest::Method::from_bytes(req.method.as_bytes())
            .map_err(|e| RedriveError::Unreachable(Box::new(e)))?;
        let mut out = self
            .http
            .request(method, format!("{}{}", self.base, req.uri))
            .bearer_auth(record.scope.as_str())
            .header("idempotency-key", record.key.as_str())
            .body(req.body.clone());
        for (name, value) in &req.headers {
            if name != "authorization" && name != "idempotency-key" && name != "content-length" {
                out = out.header(name.as_str(), value.as_slice());
            }
        }
        let resp = out
            .send()
            .await
            .map_err(|e| RedriveError::Unreachable(Box::new(e)))?;
        Ok(resp.status().as_u16())
    }
}

/// Starts the completer inside `oncely serve`; it stops (between records) when `shutdown`
/// completes, e.g. when a SIGTERM starts the drain, so it never re-drives through a server that
/// is shutting down. Returns its running totals for `/metrics`, or `None` when it could not
/// start.
pub fn spawn_completer(
    store: Arc<dyn Maintenance>,
    server_url: String,
    grace: Duration,
    every: Duration,
    policy: RedrivePolicy,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Option<Arc<CompleterCounters>> {
    match HttpRedrive::new(&server_url) {
        Ok(redrive) => {
            tracing::info!(
                grace_ms = grace.as_millis() as u64,
                every_ms = every.as_millis() as u64,
                max_attempts = policy.max_attempts,
                backoff_ms = policy.backoff_base.as_millis() as u64,
                backoff_cap_ms = policy.backoff_cap.as_millis() as u64,
                "completer running in this process"
            );
            let completer =
                Completer::new(store, Arc::new(redrive), every, grace, 100).with_policy(policy);
            let counters = completer.counters();
            completer.spawn(shutdown);
            Some(counters)
        }
        Err(e) => {
            tracing::error!(error = %e, "could not start the completer");
            None
        }
    }
}

/// `oncely reap`.
pub async fn reap(store: &StoreUrl, batch: usize) -> Result<bool> {
    let store = open_store(store).await?;
    let started = std::time::Instant::now();
    let report = reap_all(&*store, batch.max(1), oncely_jobs::DEFAULT_REAP_PAUSE).await?;
    println!(
        "reaped {} records past retention ({} of them abandoned in flight) in {:.2} s, batches of {}; {} records are marked for a person (logged)",
        report.deleted,
        report.orphaned,
        started.elapsed().as_secs_f64(),
        batch.max(1),
        report.marked
    );
    Ok(true)
}

/// `oncely complete`.
pub async fn complete(
    store: &StoreUrl,
    server_url: &str,
    grace: Duration,
    limit: usize,
    policy: RedrivePolicy,
) -> Result<bool> {
    let redrive = HttpRedrive::new(server_url)?;
    let store = open_store(store).await?;
    let report = complete_abandoned(&*store, &redrive, grace, limit, &policy).await;
    println!(
        "completer: {} abandoned requests re-driven, {} completed, {} still unfinished, {} marked for a person (gave up after {} attempts, or nothing to re-drive)",
        report.attempted, report.completed, report.failed, report.marked, policy.max_attempts
    );
    Ok(report.failed == 0 && report.marked == 0)
}
