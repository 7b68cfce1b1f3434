//! The audit's verdicts and how they are printed.

use serde_json::json;
use std::fmt;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// The behaviour provoked matched the contract.
    Pass,
    /// The behaviour broke the contract; [`CheckResult::anti_pattern`] names what it is evidence of.
    Fail,
    /// The check does not apply to this configuration (e.g. no second credential was given).
    NotApplicable,
    /// The check could not reach a verdict: the baseline request did not succeed, a request
    /// failed at the transport level, a credential was rejected, or the request budget ran out.
    /// [`CheckResult::detail`] says which. Not a pass: [`AuditReport::passed`] is `false`.
    Inconclusive,
}

impl Status {
    /// The label printed in text reports: `PASS`, `FAIL`, `N/A`, `INCONCLUSIVE`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::NotApplicable => "N/A",
            Self::Inconclusive => "INCONCLUSIVE",
        }
    }

    /// The value used in JSON reports: `pass`, `fail`, `n/a`, `inconclusive`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::NotApplicable => "n/a",
            Self::Inconclusive => "inconclusive",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckResult {
    /// The check's stable identifier, one of the constants in [`checks`](super::checks)
    /// (e.g. `"concurrency"`).
    pub name: &'static str,
    /// A one-line human title of what was checked.
    pub title: &'static str,
    /// The verdict.
    pub status: Status,
    /// For a [`Status::Fail`], the anti-pattern the evidence points to, one of the constants in
    /// [`anti_patterns`](super::anti_patterns); `None` otherwise, and `None` for a failure that
    /// is a consequence of the report's [root cause](AuditReport::root_cause).
    pub anti_pattern: Option<&'static str>,
    /// For a [`Status::Fail`] explained by the report's [root cause](AuditReport::root_cause):
    /// that root cause's anti-pattern (e.g. "key ignored" makes a concurrent burst execute
    /// many times too, without a separate check-then-insert race). `None` otherwise.
    pub consequence_of: Option<&'static str>,
    /// What was sent and seen, in order: lines starting with `> ` are requests (method, path,
    /// key, body; credentials are named, never printed), lines starting with `< ` are responses
    /// (status, the headers that matter, the body truncated to 200 characters); other lines are
    /// count-URL readings and notes.
    pub evidence: Vec<String>,
    /// The verdict explained in a sentence or three, with any caveat (e.g. "409 accepted, but
    /// generic retry loops retry every 409").
    pub detail: String,
}

/// One fault that explains several failing checks, reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RootCause {
    /// The anti-pattern (one of [`anti_patterns`](super::anti_patterns)).
    pub anti_pattern: &'static str,
    /// The check whose evidence shows it.
    pub check: &'static str,
    /// The other failing checks it explains, in report order (their
    /// [`CheckResult::consequence_of`] is `anti_pattern`).
    pub consequences: Vec<&'static str>,
}

/// The concurrency check's repeated trials: how many bursts, how big, what each did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Trials {
    /// Bursts fired, one after the other, each with its own fresh key.
    pub trials: usize,
    /// Identical requests per burst (sent at once).
    pub requests_per_trial: usize,
    /// Executions each burst caused, in order (distinct ids, or the count URL's growth when it
    /// says more; `0` for a burst that got no success).
    pub executions: Vec<usize>,
    /// For a PASS: the probability that a race present (independently) in at least half of
    /// the bursts would have been caught, `1 - 2^-trials`. `None` when the check did not pass.
    pub pass_confidence: Option<f64>,
}

/// Everything one audit found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AuditReport {
    /// What was audited: `METHOD URL` (with several base URLs, the first one's, then
    /// `(+N instances)`).
    pub target: String,
    /// How many requests the audit sent (count-URL reads included).
    pub requests_sent: usize,
    /// When one fault explains several failures (today: the key is ignored altogether, shown
    /// by replay-fidelity), it is reported here once; the checks it explains are failures
    /// with [`CheckResult::consequence_of`] set and no anti-pattern of their own.
    pub root_cause: Option<RootCause>,
    /// Things the user should know that are no check's verdict (e.g. "`--second-auth` looks
    /// like the same account as `--auth`").
    pub warnings: Vec<String>,
    /// The concurrency check's trials, when it ran.
    pub trials: Option<Trials>,
    /// The checks, in the order of the contract (concurrency first, expiry last).
    pub checks: Vec<CheckResult>,
}

impl AuditReport {
    /// `true` when every check is [`Status::Pass`] or [`Status::NotApplicable`]. A `Fail` or an
    /// `Inconclusive` check makes it `false` (the CLI exits non-zero).
    pub fn passed(&self) -> bool {
        self.checks
            .iter()
            .all(|c| matches!(c.status, Status::Pass | Status::NotApplicable))
    }

    /// The result of the check named `name` (see [`checks`](super::checks)), if it ran.
    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// A human-readable report: a header line, then per check its verdict, title, anti-pattern,
    /// detail and evidence (indented), then a summary line `summary: N PASS, N FAIL, N N/A,
    /// N INCONCLUSIVE`.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "oncely audit of {} ({} requests sent)\n",
            self.target, self.requests_sent
        );
        if let Some(rc) = &self.root_cause {
            out.push_str(&format!(
                "\nroot cause: {} (shown by {})\n",
                rc.anti_pattern, rc.check
            ));
            if !rc.consequences.is_empty() {
                out.push_str(&format!(
                    "      its consequences, not separate faults: {}\n",
                    rc.consequences.join(", ")
                ));
            }
        }
        for w in &self.warnings {
            out.push_str(&format!("\nwarning: {w}\n"));
        }
        for c in &self.checks {
            out.push('\n');
            out.push_str(&format!(
                "{:<5} {}: {}\n",
                c.status.label(),
                c.name,
                c.title
            ));
            if let Some(a) = c.anti_pattern {
                out.push_str(&format!("      anti-pattern: {a}\n"));
            }
            if let Some(a) = c.consequence_of {
                out.push_str(&format!("      consequence of the root cause: {a}\n"));
            }
            for line in c.detail.lines() {
                out.push_str(&format!("      {line}\n"));
            }
            for e in &c.evidence {
                out.push_str(&format!("        {e}\n"));
            }
        }
        let n = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        out.push_str(&format!(
            "\nsummary: {} PASS, {} FAIL, {} N/A, {} INCONCLUSIVE\n",
            n(Status::Pass),
            n(Status::Fail),
            n(Status::NotApplicable),
            n(Status::Inconclusive)
        ));
        out
    }

    /// The report as JSON: `{"target", "requests_sent", "passed", "root_cause" (null or
    /// {"anti_pattern", "check", "consequences": [name]}), "warnings": [string], "trials" (null
    /// or {"trials", "requests_per_trial", "executions": [n], "pass_confidence" (number in 0..1
    /// or null)}), "checks": [{"name", "title", "status" ("pass" | "fail" | "n/a" |
    /// "inconclusive"), "anti_pattern" (string or null), "consequence_of" (string or null),
    /// "detail", "evidence": [string]}]}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "target": self.target,
            "requests_sent": self.requests_sent,
            "passed": self.passed(),
            "root_cause": self.root_cause.as_ref().map(|rc| json!({
                "anti_pattern": rc.anti_pattern,
                "check": rc.check,
                "consequences": rc.consequences,
            })),
            "warnings": self.warnings,
            "trials": self.trials.as_ref().map(|t| json!({
                "trials": t.trials,
                "requests_per_trial": t.requests_per_trial,
                "executions": t.executions,
                "pass_confidence": t.pass_confidence,
            })),
            "checks": self.checks.iter().map(|c| json!({
                "name": c.name,
                "title": c.title,
                "status": c.status.as_str(),
                "anti_pattern": c.anti_pattern,
                "consequence_of": c.consequence_of,
                "detail": c.detail,
                "evidence": c.evidence,
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_judges() {
        let report = AuditReport {
            target: "POST http://127.0.0.1:1/v1/p".into(),
            requests_sent: 3,
            root_cause: None,
            warnings: vec!["look".into()],
            trials: None,
            checks: vec![
                CheckResult {
                    name: "a",
                    title: "first",
                    status: Status::Pass,
                    anti_pattern: None,
                    consequence_of: None,
                    evidence: vec!["> POST /v1/p".into()],
                    detail: "ok".into(),
                },
                CheckResult {
                    name: "b",
                    title: "second",
                    status: Status::Fail,
                    anti_pattern: Some("global key scope"),
                    consequence_of: None,
                    evidence: vec![],
                    detail: "bad".into(),
                },
            ],
        };
        assert!(!report.passed());
        let text = report.render_text();
        assert!(text.contains("\nwarning: look\n"), "{text}");
        assert!(
            text.contains("PASS  a: first\n      ok\n        > POST /v1/p\n"),
            "{text}"
        );
        assert!(
            text.contains("FAIL  b: second\n      anti-pattern: global key scope\n"),
            "{text}"
        );
        assert!(
            text.ends_with("summary: 1 PASS, 1 FAIL, 0 N/A, 0 INCONCLUSIVE\n"),
            "{text}"
        );
        let j = report.to_json();
        assert_eq!(j["passed"], false);
        assert_eq!(j["checks"][1]["status"], "fail");
        assert_eq!(j["checks"][1]["anti_pattern"], "global key scope");
        assert_eq!(j["checks"][0]["anti_pattern"], serde_json::Value::Null);
    }
}
