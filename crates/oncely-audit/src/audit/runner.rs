//! One audit, start to finish: the checks in order, then the diagnosis that names one root
//! cause for the failures it explains.

use super::anti_patterns;
use super::checks;
use super::config::AuditConfig;
use super::probe::Prober;
use super::report::{AuditReport, CheckResult, RootCause, Status};

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
/// the [`ConfigError`](super::ConfigError); call [`AuditConfig::validate`] first to report it as a usage error.
///
/// Checks run one after another, never overlapping: replay fidelity first (its first request
/// is the baseline the other checks compare with), then canonical JSON, payload mismatch,
/// cross-endpoint, cross-scope, refreshed credential, session scope, client bypass,
/// concurrency (its bursts one after the other), in-flight, the client-bypass check's second
/// round (the headers the in-flight answers announced, when there are any), malformed keys, missing key,
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
    let p = match Prober::new(cfg, targets) {
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
    let bypass = checks::bypass::ClientBypass::start(&p, base).await;
    let concurrency = checks::concurrency::concurrency(&p, cfg.concurrency, cfg.trials).await;
    let in_flight =
        checks::in_flight::in_flight(&p, base, &concurrency.conflicts, concurrency.all_identical)
            .await;
    // The client-bypass check's second round: the headers the in-flight answers announced.
    let bypass = bypass.finish(&p, &concurrency.conflicts).await;
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
