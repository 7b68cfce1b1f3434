//! # oncely-tower
//!
//! `Idempotency-Key` support for any tower HTTP service, axum first: one layer that claims the
//! key in a [`KeyStore`](oncely_core::KeyStore), runs the handler once per `(scope, key)`,
//! keeps its lease alive while it runs, stores the response, and replays it verbatim to every
//! retry with `Idempotent-Replayed: true`.
//!
//! ```
//! use axum::{Router, extract::Request, middleware::{self, Next}, response::Response, routing::post};
//! use oncely_core::{MemoryStore, Scope};
//! use oncely_tower::{IdempotencyContext, IdempotencyLayer};
//! use std::sync::Arc;
//! use tower::ServiceExt;
//!
//! // Your authentication decides whose key it is: it puts a `Scope` in the request
//! // extensions (the default `ExtensionScope` reads it from there).
//! async fn authenticate(mut req: Request, next: Next) -> Response {
//!     let account = req.headers().get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned);
//!     if let Some(account) = account {
//!         req.extensions_mut().insert(Scope::new(account));
//!     }
//!     next.run(req).await
//! }
//!
//! async fn create_order(ctx: IdempotencyContext, body: String) -> (axum::http::StatusCode, String) {
//!     // Runs once per (account, key); retries get the stored response.
//!     (axum::http::StatusCode::CREATED, format!("order for {} from {body}", ctx.id().scope))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idempotency = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
//! let metrics = idempotency.metrics();
//! let app = Router::new()
//!     // On the keyed route's methods (inner: runs after authentication). Another method gets
//!     // its 405 and a path that is no route its 404 before any claim: `Router::route_layer`
//!     // would also wrap each route's 405, and `Router::layer` every 404 and 405 too.
//!     .route("/v1/orders", post(create_order).route_layer(idempotency))
//!     .layer(middleware::from_fn(authenticate));
//!
//! let request = || {
//!     axum::http::Request::post("/v1/orders")
//!         .header("x-account", "acct_1")
//!         .header("idempotency-key", "order-confirm-42")
//!         .body(axum::body::Body::from("sku=A"))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), 201);
//! let retry = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(retry.status(), 201);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! assert_eq!(metrics.snapshot().claims, 1);
//! assert_eq!(metrics.snapshot().replays, 1);
//! # }
//! ```
//!
//! # What the layer answers
//!
//! | situation | response |
//! |---|---|
//! | route ignores keys (GET, HEAD, ...), or key optional and absent | passes through untouched |
//! | key required and absent | `400 idempotency_key_missing` |
//! | key empty, over 255 characters, not visible ASCII, header repeated | `400 idempotency_key_invalid` |
//! | no authenticated scope | `401 idempotency_scope_missing` |
//! | request body over `Policy::max_request_bytes` | `413 idempotency_request_too_large` |
//! | JSON body that is not I-JSON (RFC 7493: a repeated member name, a lone surrogate; a number no double carries, such as a 64-bit id, is fingerprinted by its digits instead) | `400 idempotency_body_not_canonicalizable`, before any claim |
//! | store error, or a store call slower than the store timeout (5 s) | `503 idempotency_store_unavailable` + `Retry-After`; the handler never runs |
//! | first request (or after the replay window, or a lapsed lease) | runs the handler with an [`IdempotencyContext`] |
//! | same request while the first runs | `409 idempotency_request_in_flight` + `Retry-After` (or, in wait mode, the replay) |
//! | same request after it completed | the stored response verbatim + `Idempotent-Replayed: true` |
//! | same request, but the response was too large to keep | `409 idempotency_response_not_retained` + `Idempotent-Replayed: true` |
//! | same key, different request | `422 idempotency_key_mismatch` (`400` under `stripe`, `409` under `resend`) |
//!
//! Every error body is RFC 9457 `application/problem+json` with `code` and `retryable`; the
//! statuses follow the policy's [`StatusProfile`](oncely_core::StatusProfile).
//!
//! # Key sources and webhook receivers
//!
//! The key comes from the `Idempotency-Key` header by default; a route can read it from another
//! header (Standard Webhooks' `webhook-id`, GitHub's `X-GitHub-Delivery`) or from a JSON
//! Pointer into the body (Stripe's event `/id`) with [`IdempotencyLayer::with_key_source`] and
//! a [`KeySource`]; the key rules, scope and fingerprint are the same. A Standard Webhooks
//! receiver puts [`StandardWebhooksLayer`] outside the layer: it verifies each delivery's
//! signature and timestamp before any claim and makes the verified sender the scope (see
//! [`standard_webhooks`]).
//!
//! # Handlers
//!
//! A claimed request carries an [`IdempotencyContext`] (an axum extractor; in plain tower, a
//! request extension): its `(scope, key)`, fencing token and claim kind, one phase API
//! ([`IdempotencyContext::checkpoint`] with a typed step, [`IdempotencyContext::resume_from`]
//! after a takeover) and [`IdempotencyContext::ensure_lease`] before every outside call. A
//! handler steers what happens to its response with a [`HandlerOutcome`] in the response
//! extensions: `NotExecuted` (returned, not stored, key released) or `Suspended` (kept in
//! flight at its recovery point for the retry to resume). Transactional handlers use
//! `oncely_sqlx::Tx`, whose claimer reports to the same [`ClaimState`] (see [`claim`] for who
//! ends a claim). See [`context`] and [`oncely_core::response`] for what is stored and
//! how large and streaming bodies are handled.
//!
//! # Guarantee
//!
//! Effectively-once, not "exactly-once": nothing over a network can promise that. Inside one
//! scope and replay window, a request's side effects run once however often it is retried,
//! provided the handler's effects happen inside the handler (see `oncely_core`).

mod body;
pub mod claim;
pub mod claimer;
mod config;
pub mod context;
pub mod dialect;
pub mod drain;
mod future;
mod keeper;
mod key_rule;
pub mod key_source;
mod layer;
mod lease;
mod local_claims;
mod metrics;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod phase;
mod problem;
mod scope;
mod service;
#[cfg(feature = "standard-webhooks")]
pub mod standard_webhooks;
mod store_call;

pub use claim::ClaimState;
pub use claimer::{Claimer, ClaimerKind, StoreClaimer};
#[cfg(feature = "axum")]
pub use context::MissingIdempotencyContext;
pub use context::{HandlerOutcome, IdempotencyContext, StepError};
pub use dialect::{Dialect, ProblemJson};
pub use drain::Drain;
pub use future::ResponseFuture;
pub use key_rule::{DefaultKeyRule, KeyRequirement, KeyRule};
pub use key_source::{IDEMPOTENCY_KEY, InvalidKeySource, KeySource};
pub use layer::{CREDENTIAL_HEADERS, DEFAULT_STORE_TIMEOUT, IdempotencyLayer};
pub use metrics::{Metrics, MetricsSnapshot};
pub use oncely_core::response::{
    Body, BoxError, DENIED_RESPONSE_HEADERS, IDEMPOTENT_REPLAYED, capture_response, stored_response,
};
pub use phase::{PhaseFailed, ResponseCommitted};
pub use problem::problem_response;
pub use scope::{ExtensionScope, ScopeExtractor};
pub use service::Idempotency;
#[cfg(feature = "standard-webhooks")]
pub use standard_webhooks::{
    StandardWebhooks, StandardWebhooksLayer, TIMESTAMP_TOLERANCE_SECS, VerifiedWebhook,
    WEBHOOK_CHALLENGE, WebhookSecretError,
};
