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
pub struct CheckResult {
    /// The check's stable identifier, one of the constants in [`checks`](super::checks)
    /// (e.g. `"concurrency"`).
    pub name: &'static str,
    /// A one-line human title of what was checked.
    pub title: &'static str,
    /// The verdict.
    pub status: Status,
    /// For a [`Status::Fail`], the anti-pattern the evidence points to, one of the constants in
    /// [`anti_patterns`](super::anti_patterns); `None` otherwise.
    pub anti_pattern: Option<&'static str>,
    /// What was sent and seen, in order: lines starting with `> ` are requests (method, path,
    /// key, body; credentials are named, never printed), lines starting with `< ` are responses
    /// (status, the headers that matter, the body truncated to 200 characters); other lines are
    /// count-URL readings and notes.
    pub evidence: Vec<String>,
    /// The verdict explained in a sentence or three, with any caveat (e.g. "409 accepted, but
    /// generic retry loops retry every 409").
    pub detail: String,
}

/// Everything one audit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditReport {
    /// What was audited: `METHOD URL`.
    pub target: String,
    /// How many requests the audit sent (count-URL reads included).
    pub requests_sent: usize,
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

    /// The report as JSON: `{"target", "requests_sent", "passed", "checks": [{"name", "title",
    /// "status" ("pass" | "fail" | "n/a" | "inconclusive"), "anti_pattern" (string or null),
    /// "detail", "evidence": [string]}]}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "target": self.target,
            "requests_sent": self.requests_sent,
            "passed": self.passed(),
            "checks": self.checks.iter().map(|c| json!({
                "name": c.name,
                "title": c.title,
                "status": c.status.as_str(),
                "anti_pattern": c.anti_pattern,
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
            checks: vec![
                CheckResult {
                    name: "a",
                    title: "first",
                    status: Status::Pass,
                    anti_pattern: None,
                    evidence: vec!["> POST /v1/p".into()],
                    detail: "ok".into(),
                },
                CheckResult {
                    name: "b",
                    title: "second",
                    status: Status::Fail,
                    anti_pattern: Some("global key scope"),
                    evidence: vec![],
                    detail: "bad".into(),
                },
            ],
        };
        assert!(!report.passed());
        let text = report.render_text();
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
