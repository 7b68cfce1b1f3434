//! # oncely-audit
//!
//! Two tools that work on anybody's API, whatever language it is written in:
//!
//! - [`audit`] probes a live HTTP endpoint (one instance or several) for the `Idempotency-Key`
//!   contract (repeated bursts of concurrent duplicates, replay fidelity, payload mismatch,
//!   canonical JSON, endpoint, caller, refreshed-token and session scoping, client-controlled
//!   bypass headers, malformed and missing keys, the in-flight response, expiry) and reports
//!   every check as PASS, FAIL, N/A or INCONCLUSIVE, with the requests and responses it saw
//!   and, for each FAIL, the anti-pattern it is evidence of (or the root cause it follows
//!   from).
//! - [`lint`] reads an OpenAPI document and lists every state-changing operation that neither
//!   accepts an `Idempotency-Key` header nor is marked unsafe to retry.
//!
//! The `oncely` command line (`oncely audit`, `oncely lint`) is a thin layer over these two
//! modules.
//!
//! # What the audit can and cannot show
//!
//! A black-box probe sees responses, not the server's code: a PASS means "the behaviour we
//! provoked matched the contract", not a proof that no race exists. A FAIL, on the other hand,
//! comes with the exchange that demonstrates it. The promise being checked is
//! *effectively-once* (at-least-once delivery plus duplicate collapse inside a key scope and a
//! replay window); nothing over a network can promise exactly-once execution, and the audit does
//! not test for it.

pub mod audit;
pub mod lint;
