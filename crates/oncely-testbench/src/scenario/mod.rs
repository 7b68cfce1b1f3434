//! The scenario file, `conformance/retry/scenarios.json`, as Rust types.
//!
//! The normative description of every field is `conformance/retry/README.md`; these types follow
//! it one to one and refuse unknown fields, so the file and its readers move together. The
//! testbench uses the server half (calls, steps); the Rust runner in
//! `crates/oncely-client/tests/conformance.rs` uses all of it.
//!
//! ```
//! let file = oncely_testbench::scenario::ScenarioFile::bundled();
//! assert_eq!(file.format, 1);
//! assert!(file.scenarios.iter().any(|s| s.id() == "defaults"));
//! ```

//!
//! By concept: this file has the file itself and its checks, and [`Scenario`]; `offline.rs` the
//! kinds without a server (`defaults`, `jitter`); `policy.rs` the policy and its merge;
//! `call.rs` kind `http` and its calls; `step.rs` what the testbench does on one attempt;
//! `expect.rs` what must follow a call.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

mod call;
mod expect;
mod offline;
mod policy;
mod step;

pub use call::{Call, CallBody, HttpScenario, KeyMode, KeySpec, Target};
pub use expect::{
    Bound, CallResult, ErrorExpect, ErrorKind, Expect, KeyExpect, Pair, ResponseExpect,
};
pub use offline::{
    DefaultsExpect, DefaultsScenario, FullBudget, JitterExpect, JitterPolicy, JitterRetry,
    JitterScenario,
};
pub use policy::{Budget, BudgetSetting, Policy};
pub use step::{
    DateForm, Fault, HeaderValue, HttpDateTemplate, NamedFault, SlowBody, Step, StepBody, Template,
};

/// The format version this crate reads.
pub const FORMAT: u32 = 1;

/// The scenario file the binary was built with (`conformance/retry/scenarios.json`).
pub const BUNDLED_JSON: &str = include_str!("../../../../conformance/retry/scenarios.json");

/// Why a scenario file was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not JSON, or not of the documented shape (an unknown field included).
    #[error("the scenario file does not parse: {0}")]
    Parse(#[from] serde_json::Error),
    /// A format this crate does not read.
    #[error("the scenario file has format {0}; this testbench reads format {FORMAT}")]
    Format(u32),
    /// The shape parses but a rule of the format is broken.
    #[error("scenario {id:?}: {problem}")]
    Invalid {
        /// The scenario's id.
        id: String,
        /// What is wrong.
        problem: String,
    },
}

/// The whole file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// The JSON Schema the file names (ignored).
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The format version ([`FORMAT`]).
    pub format: u32,
    /// The policy merged under every `http` scenario's own.
    #[serde(default)]
    pub policy: Policy,
    /// The scenarios, in file order.
    pub scenarios: Vec<Scenario>,
}

impl ScenarioFile {
    /// Parses and checks a scenario file.
    ///
    /// # Errors
    ///
    /// [`LoadError`]: bad JSON or shape, another format, or a broken rule (duplicate id, a call
    /// without server steps, expectations of the wrong length, ...).
    pub fn from_json(json: &str) -> Result<Self, LoadError> {
        let file: Self = serde_json::from_str(json)?;
        if file.format != FORMAT {
            return Err(LoadError::Format(file.format));
        }
        file.check()?;
        Ok(file)
    }

    /// The file compiled into this crate ([`BUNDLED_JSON`]).
    ///
    /// # Panics
    ///
    /// If the bundled file is invalid, which this crate's tests rule out.
    pub fn bundled() -> Self {
        Self::from_json(BUNDLED_JSON)
            .expect("the bundled conformance/retry/scenarios.json is valid")
    }

    /// The scenario with this id.
    pub fn get(&self, id: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.id() == id)
    }

    fn check(&self) -> Result<(), LoadError> {
        let mut ids = HashSet::new();
        for s in &self.scenarios {
            let invalid = |problem: String| LoadError::Invalid {
                id: s.id().to_owned(),
                problem,
            };
            let id = s.id();
            if id.is_empty()
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                || id.starts_with('-')
            {
                return Err(invalid("the id must match ^[a-z0-9][a-z0-9-]*$".into()));
            }
            if !ids.insert(id) {
                return Err(invalid("the id is used twice".into()));
            }
            match s {
                Scenario::Defaults(_) => {}
                Scenario::Jitter(j) => {
                    if j.retries.is_empty() || j.draws == 0 {
                        return Err(invalid("a jitter scenario needs draws and retries".into()));
                    }
                }
                Scenario::Http(h) => {
                    if h.calls.is_empty() {
                        return Err(invalid("an http scenario needs calls".into()));
                    }
                    for (i, c) in h.calls.iter().enumerate() {
                        c.check(h.target)
                            .map_err(|p| invalid(format!("call {i}: {p}")))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// One scenario, by kind.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Scenario {
    /// The SDK's default policy; no server.
    Defaults(DefaultsScenario),
    /// Full-jitter draws; no server.
    Jitter(JitterScenario),
    /// Calls against the testbench.
    Http(HttpScenario),
}

impl Scenario {
    /// The scenario's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Defaults(s) => &s.id,
            Self::Jitter(s) => &s.id,
            Self::Http(s) => &s.id,
        }
    }

    /// The rule it checks, one sentence.
    pub fn rule(&self) -> &str {
        match self {
            Self::Defaults(s) => &s.rule,
            Self::Jitter(s) => &s.rule,
            Self::Http(s) => &s.rule,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_file_loads_and_has_every_kind() {
        let f = ScenarioFile::bundled();
        assert!(f.scenarios.len() >= 60, "{}", f.scenarios.len());
        for kind in ["defaults", "jitter", "http"] {
            assert!(
                f.scenarios.iter().any(|s| matches!(
                    (kind, s),
                    ("defaults", Scenario::Defaults(_))
                        | ("jitter", Scenario::Jitter(_))
                        | ("http", Scenario::Http(_))
                )),
                "{kind}"
            );
        }
    }

    fn with_call(call: &str) -> String {
        format!(
            r#"{{"format":1,"scenarios":[{{"id":"s","kind":"http","rule":"r","sources":[],"calls":[{call}]}}]}}"#
        )
    }

    #[test]
    fn unknown_fields_other_formats_and_broken_rules_are_refused() {
        let good = r#"{"method":"GET","path":"/x","key":"auto","server":[{"status":503},{}],"expect":{"attempts":2,"key":"none","waits_ms":[[0,20]],"result":{"status":200}}}"#;
        ScenarioFile::from_json(&with_call(good)).unwrap();
        let unknown = good.replace(r#""key":"auto""#, r#""key":"auto","bogus":1"#);
        assert!(matches!(
            ScenarioFile::from_json(&with_call(&unknown)),
            Err(LoadError::Parse(_))
        ));
        let wrong_waits = good.replace("[[0,20]]", "[[0,20],[0,40]]");
        assert!(matches!(
            ScenarioFile::from_json(&with_call(&wrong_waits)),
            Err(LoadError::Invalid { .. })
        ));
        let no_steps = good.replace(r#""server":[{"status":503},{}],"#, "");
        assert!(matches!(
            ScenarioFile::from_json(&with_call(&no_steps)),
            Err(LoadError::Invalid { .. })
        ));
        let two = with_call(good).replace(r#""format":1"#, r#""format":2"#);
        assert!(matches!(
            ScenarioFile::from_json(&two),
            Err(LoadError::Format(2))
        ));
    }

    #[test]
    fn the_last_step_repeats_and_repeat_expands_calls() {
        let f = ScenarioFile::from_json(&with_call(
            r#"{"method":"GET","path":"/x","key":"auto","repeat":3,"server":[{"status":503},{"status":201}],"expect":{"attempts":2,"key":"none","result":{"status":201}}}"#,
        ))
        .unwrap();
        let Scenario::Http(h) = &f.scenarios[0] else {
            panic!("http")
        };
        let calls = h.expanded_calls();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].step(1).unwrap().1.status, 503);
        assert_eq!(calls[0].step(2).unwrap().1.status, 201);
        assert_eq!(calls[0].step(9).unwrap(), (1, &calls[0].server[1]));
    }
}
