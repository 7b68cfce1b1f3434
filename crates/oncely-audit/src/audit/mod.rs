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
//! - The only deliberate wait is the expiry check's: the window plus 10% (at least 1 s), and the
//!   window is at most [`MAX_WINDOW`] (600 s). The in-flight check waits half the first
//!   request's latency (between 5 ms and 2 s) before its duplicate, halving it for at most two
//!   more pairs.
//! - Worst case (a server that never answers): each burst lasts one timeout and every other
//!   request runs one at a time, so an audit lasts at most about
//!   `(planned_requests - trials x concurrency + trials) x timeout`, plus the expiry wait:
//!   about 15 minutes with a count URL and the defaults (93 x 10 s). A server that answers
//!   takes seconds (the crate's tests audit fixtures in about one second each).
//!
//! # Side effects on the target
//!
//! The audit creates resources like any client: a successful run of a correct server creates
//! about twenty (the baseline, one per burst, the in-flight pairs' winners, the client-bypass
//! check's, the other endpoint's, the second caller's, the expiry re-execution); a server with
//! the mistakes the audit looks for creates more. Audit a test deployment.

mod body;
pub mod checks;
mod config;
mod probe;
mod report;

pub use config::{
    AuditConfig, ConfigError, DEFAULT_CONCURRENCY, DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT,
    DEFAULT_TRIALS, KeyPlacement, MAX_CONCURRENCY, MAX_TRIALS, MAX_WINDOW,
};
pub use report::{AuditReport, CheckResult, RootCause, Status, Trials};
/// The URL type of [`AuditConfig::base_url`] (re-exported from `reqwest`, which re-exports
/// the `url` crate's).
pub use reqwest::Url;

/// The anti-patterns a FAIL can name ([`CheckResult::anti_pattern`]): stable strings, safe to
/// match on.
pub mod anti_patterns {
    /// Duplicates sent together executed more than once: the server looks the key up, then
    /// inserts it, and both requests passed the look-up (server case S5). The claim must be one
    /// atomic operation arbitrated by the store's primary key.
    pub const CHECK_THEN_INSERT_RACE: &str = "check-then-insert race";
    /// A duplicate sent while the first request was still running executed again (or got an
    /// empty or partial "replay"): the key is recorded only when the request completes, so there
    /// is no in-flight state (server cases S5, S6).
    pub const BINARY_KEY_STATE: &str = "binary key state (no in-flight state)";
    /// A `409` for an in-flight duplicate without a valid `Retry-After` or without a
    /// machine-readable code: clients cannot tell it from a mismatch or know when to retry
    /// (server case S1).
    pub const UNHELPFUL_IN_FLIGHT: &str = "in-flight conflict without Retry-After or code";
    /// A different body under a used key got the stored response (server case S3).
    pub const SILENT_MISMATCH_REPLAY: &str = "silent replay of a different payload";
    /// A different body under a used key was executed as a new request.
    pub const MISMATCH_EXECUTED: &str = "different payload executed under a reused key";
    /// The same JSON with keys reordered or other whitespace was rejected as a mismatch: the
    /// fingerprint hashes bytes, not the canonical JSON (server case S4).
    pub const FALSE_MISMATCH: &str = "byte-level fingerprint (false mismatch)";
    /// The same JSON with keys reordered or other whitespace executed again: the body bytes are
    /// part of the key (server case S4).
    pub const BYTE_LEVEL_KEYING: &str = "byte-level fingerprint (executed again)";
    /// A retry after completion executed again: the key is ignored.
    pub const KEY_IGNORED: &str = "key ignored (request executed again)";
    /// A replay's status or body differs from the original response.
    pub const REPLAY_DIFFERS: &str = "replay differs from original";
    /// A replay lacks (or changes) headers the original carried (`Location`, `Content-Type`,
    /// custom `x-` headers).
    pub const REPLAY_DROPS_HEADERS: &str = "replay drops headers";
    /// The same key on another endpoint replayed the first endpoint's response: the key is not
    /// bound to the request it was first used for.
    pub const CROSS_ENDPOINT_REPLAY: &str = "key not bound to the endpoint (cross-endpoint replay)";
    /// Another caller's request with the same key got the first caller's response, or a
    /// conflict that reveals the key was used (server case S9): keys are looked up without the
    /// caller's scope.
    pub const GLOBAL_KEY_SCOPE: &str = "global key scope";
    /// A malformed key (empty, over 255 characters, non-ASCII, repeated header) was accepted
    /// and executed.
    pub const NO_KEY_VALIDATION: &str = "no key validation";
    /// A `POST`/`PATCH` without a key was executed: keyless retries of it are unprotected.
    pub const KEY_OPTIONAL: &str = "key optional on a state-changing endpoint";
    /// A duplicate or a key error was answered with a 5xx (e.g. a unique violation surfaced as
    /// `500`, server case S11).
    pub const DUPLICATE_AS_SERVER_ERROR: &str = "duplicate surfaced as a server error";
    /// An idempotency error was answered with an unexpected status (e.g. `422` for an in-flight
    /// duplicate, `428` for a missing key).
    pub const WRONG_ERROR_STATUS: &str = "wrong error status";
    /// The key still replayed after the replay window had passed.
    pub const NEVER_EXPIRES: &str = "replay window not enforced (key never expires)";
    /// The key, reused after the replay window, was rejected instead of executing as new.
    pub const EXPIRED_KEY_ERROR: &str = "expired key rejected instead of executed";
    /// The key, reused after the replay window, got a success naming a new resource (a new
    /// `id`), but the count URL did not grow: the response describes a resource that was never
    /// stored. Typically the business row is keyed by the idempotency key alone, so the new
    /// execution's insert hits the old row's unique constraint and silently does nothing
    /// (`ON CONFLICT DO NOTHING`) while the handler answers as if it had created it.
    pub const PHANTOM_EXECUTION: &str = "success for a resource that was not stored";
    /// A retry under another token of the same account (a refreshed credential) executed
    /// again or was refused: the `Authorization` header, or a hash of it, is part of the key or
    /// its fingerprint, so a token refresh between two attempts charges twice.
    pub const CREDENTIAL_IN_KEY: &str =
        "credential hashed into the key (a refreshed token executes again)";
    /// Another caller presenting the first caller's session cookie got the first caller's
    /// stored response: the records live in (or are looked up by) the session, not the
    /// authenticated caller.
    pub const SESSION_SCOPED_RECORDS: &str =
        "idempotency records scoped by the session cookie, not the caller";
    /// A request header the client controls (a replay marker such as `Idempotent-Replayed` or
    /// `X-Idempotency-Replay`, or `Cache-Control: no-cache`) changed the outcome: a replay was
    /// skipped, or the key was wedged in flight for ever.
    pub const CLIENT_CONTROLLED_BYPASS: &str =
        "client-controlled bypass (a request header changes deduplication)";
    /// A `PUT` or `DELETE` sent twice without a key changed the state twice (a `PUT` that
    /// appends, a `DELETE` that decrements): the method is idempotent by RFC 9110 section
    /// 9.2.2, so clients and proxies retry it without a key, and every retry is a duplicate.
    pub const METHOD_NOT_IDEMPOTENT: &str = "the method promises idempotency; this endpoint is not";
}

/// The failures a key that is ignored altogether also causes: reported as its consequences,
/// not as separate anti-patterns.
const KEY_IGNORED_CONSEQUENCES: [&str; 8] = [
    anti_patterns::CHECK_THEN_INSERT_RACE,
    anti_patterns::BINARY_KEY_STATE,
    anti_patterns::MISMATCH_EXECUTED,
    anti_patterns::BYTE_LEVEL_KEYING,
    anti_patterns::NO_KEY_VALIDATION,
    anti_patterns::KEY_OPTIONAL,
    anti_patterns::CREDENTIAL_IN_KEY,
    anti_patterns::REPLAY_DIFFERS,
];

/// One cause, one finding: when replay-fidelity shows the key ignored altogether, that is the
/// root cause, and the failures it explains lose their own anti-pattern.
fn diagnose(checks: &mut [CheckResult]) -> Option<RootCause> {
    let root = checks
        .iter()
        .find(|c| c.name == checks::REPLAY_FIDELITY)
        .filter(|c| c.anti_pattern == Some(anti_patterns::KEY_IGNORED))?
        .name;
    let mut consequences = Vec::new();
    for c in checks.iter_mut() {
        if c.name != root
            && c.status == Status::Fail
            && c.anti_pattern
                .is_some_and(|a| KEY_IGNORED_CONSEQUENCES.contains(&a))
        {
            c.detail = format!(
                "a consequence of the root cause ({}, shown by {root}), not a separate fault: {}",
                anti_patterns::KEY_IGNORED,
                c.detail
            );
            c.anti_pattern = None;
            c.consequence_of = Some(anti_patterns::KEY_IGNORED);
            consequences.push(c.name);
        }
    }
    Some(RootCause {
        anti_pattern: anti_patterns::KEY_IGNORED,
        check: root,
        consequences,
    })
}

/// Runs every check against the configured endpoint and returns the report. Never panics on
/// the server's behaviour; never sends more than [`AuditConfig::max_requests`] requests.
///
/// An invalid configuration (see [`AuditConfig::validate`]) sends nothing and returns a report
/// with the single check [`checks::CONFIGURATION`] as [`Status::Inconclusive`], whose detail is
/// the [`ConfigError`]; call [`AuditConfig::validate`] first to report it as a usage error.
///
/// Checks run one after another, never overlapping: replay fidelity first (its first request
/// is the baseline the other checks compare with), then canonical JSON, payload mismatch,
/// cross-endpoint, cross-scope, refreshed credential, session scope, client bypass,
/// concurrency (its bursts one after the other), in-flight, malformed keys, missing key,
/// method idempotency, expiry. The report lists them in the contract's order ([`checks::ALL`]), after its
/// [root cause](AuditReport::root_cause) and warnings.
pub async fn run(cfg: &AuditConfig) -> AuditReport {
    let mut target = format!(
        "{} {}",
        cfg.method,
        cfg.base_url.as_str().trim_end_matches('/').to_owned() + &cfg.path
    );
    if !cfg.more_base_urls.is_empty() {
        target.push_str(&format!(" (+{} instances)", cfg.more_base_urls.len()));
    }
    let setup_failure = |detail: String| AuditReport {
        target: target.clone(),
        requests_sent: 0,
        root_cause: None,
        warnings: Vec::new(),
        trials: None,
        checks: vec![CheckResult {
            name: checks::CONFIGURATION,
            title: "the audit configuration is usable",
            status: Status::Inconclusive,
            anti_pattern: None,
            consequence_of: None,
            evidence: Vec::new(),
            detail,
        }],
    };
    let targets = match cfg.targets() {
        Ok(t) => t,
        Err(e) => return setup_failure(format!("nothing was sent: {e}")),
    };
    let p = match probe::Prober::new(cfg, targets) {
        Ok(p) => p,
        Err(e) => return setup_failure(format!("nothing was sent: the HTTP client: {e}")),
    };

    let mut warnings = Vec::new();
    let (replay, baseline) = checks::replay::replay_fidelity(&p).await;
    let base = baseline.as_ref();
    let canonical = checks::variants::canonical_json(&p, base).await;
    let mismatch = checks::variants::payload_mismatch(&p, base).await;
    let endpoint = checks::variants::cross_endpoint(&p, base).await;
    let scope = checks::variants::cross_scope(&p, base, &mut warnings).await;
    let refreshed = checks::credentials::refreshed_credential(&p, base).await;
    let session = checks::credentials::session_scope(
        &p,
        base,
        scope.anti_pattern == Some(anti_patterns::GLOBAL_KEY_SCOPE),
    )
    .await;
    let bypass = checks::bypass::client_bypass(&p, base).await;
    let concurrency = checks::concurrency::concurrency(&p, cfg.concurrency, cfg.trials).await;
    let in_flight =
        checks::in_flight::in_flight(&p, base, &concurrency.conflicts, concurrency.all_identical)
            .await;
    let malformed = checks::keys::malformed_keys(&p).await;
    let missing = checks::keys::missing_key(&p).await;
    let method = checks::method::method_idempotency(&p).await;
    let expiry = checks::expiry::expiry(&p, base, cfg.window).await;

    let mut results = vec![
        concurrency.result,
        replay,
        mismatch,
        canonical,
        endpoint,
        scope,
        refreshed,
        session,
        bypass,
        malformed,
        missing,
        in_flight,
        method,
        expiry,
    ];
    let root_cause = diagnose(&mut results);
    AuditReport {
        target,
        requests_sent: p.sent(),
        root_cause,
        warnings,
        trials: Some(concurrency.trials),
        checks: results,
    }
}
