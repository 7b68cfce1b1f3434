//! `oncely serve`: a reference payments API built with the library the way a user would build
//! it: an authentication middleware that puts the caller's account into the request as the
//! [`Scope`](oncely_core::Scope), the [`IdempotencyLayer`](oncely_tower::IdempotencyLayer) over
//! the write routes, and handlers that commit their atomic phases through the key store.
//!
//! # Where is what
//!
//! | module | what it holds |
//! |---|---|
//! | [`store`] | `--store` -> the key store, the phase mechanism and the business database ([`store::standby`]: starting while the store is down) |
//! | [`db`] | the business tables (payments, orders): schema, reads, the writes inside a phase |
//! | [`app`] | the shared state: store, database, outside calls, crash points, counters |
//! | [`router`] | every route, the layer over the writes, the middleware order |
//! | [`baseline`] | `--idempotency off`: the same handlers on a plain transaction, no claim (the benchmark baseline) |
//! | [`grpc`] | the Payments API over gRPC on the same port (`CreatePayment` with the REST flow's business function, `GetPayment`) |
//! | [`auth`] | `Authorization: Bearer <account>` -> the scope |
//! | [`routes`] | one file per resource: [`routes::payments`] (the payment flow, top to bottom), [`routes::orders`], [`routes::reads`], [`routes::keys`], [`routes::webhooks`] (the webhook receiver) |
//! | [`problems`] | the problem+json answers, `404`/`405` for what is not a route |
//! | [`metrics`], [`health`], [`openapi`] | `/metrics`, `/healthz` and `/readyz`, `/openapi.json` |
//! | [`should_retry`] | `x-should-retry` on every problem |
//! | [`trace`] | request ids (`x-request-id`) and the trace layer (tower-http) |
//! | [`server`] | the HTTP loop: limits, graceful shutdown |

pub mod app;
pub mod auth;
pub mod baseline;
pub mod db;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod problems;
pub mod router;
pub mod routes;
pub mod server;
pub mod should_retry;
pub mod store;
pub mod trace;

pub use app::App;
pub use store::{Existing, StoreUrl, open_existing, open_store};

use anyhow::{Context as _, Result};
use axum::Router;
use oncely_core::Policy;
use std::time::Duration;

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The key store.
    pub store: StoreUrl,
    /// The processor's base URL.
    pub processor_url: String,
    /// The timeout of every outside call (`--processor-timeout-ms`, default 10 seconds).
    pub processor_timeout: Duration,
    /// Abort the process right after this recovery point commits (testing only).
    pub crash_after: Option<String>,
    /// The idempotency policy.
    pub policy: Policy,
    /// The embedded business database for memory/Redis stores.
    pub business_path: Option<String>,
    /// PostgreSQL: the claim sent with the `BEGIN` and the completion with the `COMMIT`
    /// (`--pg-fewest-round-trips`).
    pub pg_fewest_round_trips: bool,
    /// Run the completer in-process with this grace (milliseconds after a lease lapses).
    pub completer_grace: Option<Duration>,
    /// Serve the same endpoints without the idempotency layer (the benchmark baseline).
    pub idempotency_off: bool,
    /// The Standard Webhooks secret the processor signs its events with (`whsec_<base64>`).
    pub webhook_secret: String,
}

/// Opens the store and builds the app.
///
/// # Errors
///
/// An invalid policy or webhook secret, or a store that cannot be opened (see
/// [`store::open`]).
pub async fn build(cfg: &ServeConfig) -> Result<(App, Router)> {
    cfg.policy
        .validate()
        .context("invalid idempotency policy")?;
    let opened = store::open(
        &cfg.store,
        cfg.business_path.as_deref(),
        cfg.pg_fewest_round_trips,
    )
    .await?;
    let layer = router::layer_for(&opened.backend, cfg.policy.clone());
    layer.metrics().set_store_label(cfg.store.kind());
    metrics::install();
    let app = App::new(
        &opened,
        &cfg.processor_url,
        cfg.processor_timeout,
        cfg.crash_after.clone(),
        cfg.policy.clone(),
        (!cfg.idempotency_off).then(|| {
            layer
                .drain()
                .with_outside_call_wait(app::outside_call_wait(cfg.processor_timeout))
        }),
    )?;
    let verify = oncely_tower::StandardWebhooksLayer::new()
        .with_sender(
            oncely_core::Scope::new(routes::webhooks::SENDER),
            &cfg.webhook_secret,
        )
        .context("--webhook-secret")?
        // The webhook timestamp's tolerance on the key store's clock, like its leases.
        .with_clock(opened.backend.clock());
    let router = router::router(
        app.clone(),
        &opened.backend,
        (!cfg.idempotency_off).then_some(layer),
        verify,
    );
    Ok((app, router))
}
