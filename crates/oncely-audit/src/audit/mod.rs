//! `audit`: probe a live HTTP API for the `Idempotency-Key` contract.
//!
//! ```no_run
//! use oncely_audit::audit::{self, AuditConfig, Url};
//! use http::Method;
//!
//! # async fn example() {
//! let mut cfg = AuditConfig::new(
//!     Url::parse("http://127.0.0.1:8080").unwrap(),
//!     Method::POST,
//!     "/v1/payments",
//!     serde_json::json!({"amount": 100, "currency": "usd"}),
//! );
//! cfg.auth = Some("Bearer sk_test_alice".into());
//! cfg.second_auth = Some("Bearer sk_test_bob".into());
//! cfg.count_url = Some("/v1/payments".into());
//! let report = audit::run(&cfg).await;
//! print!("{}", report.render_text());
//! std::process::exit(if report.passed() { 0 } else { 1 });
//! # }
//! ```
//!
//! # What it does
//!
//! [`run`] sends a bounded series of requests to one endpoint (and, when configured, one other
//! endpoint and a count URL), spread across one or more base URLs (instances of one API), and
//! reports fourteen checks, listed with their decisions in [`checks`]: concurrency (repeated
//! bursts), replay fidelity, payload mismatch, canonical JSON, cross-endpoint, cross-scope,
//! refreshed credential, session scope, client bypass, malformed keys, missing key, in-flight
//! response, method idempotency (`PUT`/`PATCH`/`DELETE` sent twice without a key), expiry.
//! The key goes where the endpoint reads it ([`KeyPlacement`]), and requests can be signed as
//! a Standard Webhooks sender signs them ([`AuditConfig::webhook_secret`]), so a webhook
//! receiver is audited like any API. Each is PASS, FAIL (naming an [anti-pattern](anti_patterns)), N/A (with
//! the reason it cannot say anything), or INCONCLUSIVE, with the exchanges as evidence. When one
//! fault explains several failures (the key is ignored altogether), the report names it once as
//! its [root cause](AuditReport::root_cause) and marks the others as its consequences.
//!
//! # How sure a PASS is
//!
//! The concurrency check fires [`AuditConfig::trials`] bursts (default [`DEFAULT_TRIALS`], 10),
//! each of [`AuditConfig::concurrency`] identical requests with its own key. A race that shows
//! independently in a share `s` of bursts escapes all `n` with probability `(1 - s)^n`: the
//! report states the confidence of a PASS as `1 - 2^-n` for a race present in at least half of
//! the bursts (99.9% with the default), and gives the executions of every burst
//! ([`AuditReport::trials`]).
//!
//! # Bounds
//!
//! - Requests go only to the base URLs' origins; redirects are not followed, no proxy is used,
//!   the HTTP client does not retry.
//! - At most [`AuditConfig::max_requests`] requests (default 500; a run needs
//!   [`AuditConfig::planned_requests`], 246 with the defaults, 291 with a count URL), each
//!   bounded by [`AuditConfig::timeout`] (default 10 s). Response bodies are read up to 1 MiB.
//! - The only long deliberate wait is the expiry check's: the window plus 10% (at least 1 s),
//!   and the window is at most [`MAX_WINDOW`] (600 s). The in-flight check waits half the first
//!   request's latency (between 5 ms and 2 s) before its duplicate, halving it for at most two
//!   more pairs. The client-bypass check waits a `409`'s `Retry-After` (at most 2 s) only when
//!   its control found a fresh key still in flight right after its response, once per probe it
//!   then sends (its allotment of 17 requests allows at most 6 waits, 12 s).
//! - Worst case (a server that never answers): each burst lasts one timeout and every other
//!   request runs one at a time, so an audit lasts at most about
//!   `(planned_requests - trials x concurrency + trials) x timeout`, plus the expiry wait (and
//!   the client-bypass check's, when it waits):
//!   about 15 minutes with a count URL and the defaults (93 x 10 s). A server that answers
//!   takes seconds (the crate's tests audit fixtures in about one second each).
//!
//! # Side effects on the target
//!
//! The audit creates resources like any client: a successful run of a correct server creates
//! about twenty (the baseline, one per burst, the in-flight pairs' winners, the client-bypass
//! check's, the other endpoint's, the second caller's, the expiry re-execution), two more when
//! the server's in-flight answers announce a header the client-bypass check then probes; a
//! server with the mistakes the audit looks for creates more. Audit a test deployment.

// Layering, bottom up (a module imports only from the ones listed before it):
// `anti_patterns`, `report` and `signer` (leaves); `config` (what to audit and its bounds);
// `probe` (the bounded client and the evidence it records); `body` (body variants);
// `checks` (one module per check); `runner` (the audit, in order, and its diagnosis).
pub mod anti_patterns;
mod body;
pub mod checks;
mod config;
mod probe;
mod report;
mod runner;
mod signer;

pub use config::{
    AuditConfig, ConfigError, DEFAULT_CONCURRENCY, DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT,
    DEFAULT_TRIALS, KeyPlacement, MAX_CONCURRENCY, MAX_TRIALS, MAX_WINDOW,
};
pub use report::{AuditReport, CheckResult, RootCause, Status, Trials};
/// The URL type of [`AuditConfig::base_url`] (re-exported from `reqwest`, which re-exports
/// the `url` crate's).
pub use reqwest::Url;
pub use runner::run;
