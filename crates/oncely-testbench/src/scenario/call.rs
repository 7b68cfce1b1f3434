//! Kind `http`: the scenario, its calls, and how each call's key and body are given.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CallResult, Expect, Fault, KeyExpect, Policy, ScenarioFile, Step};

/// Where an `http` scenario's calls go.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The testbench.
    #[default]
    Testbench,
    /// A loopback port where nothing listens.
    Refused,
}

/// Kind `http`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpScenario {
    /// Its id.
    pub id: String,
    /// The rule.
    pub rule: String,
    /// Where the rule comes from.
    pub sources: Vec<String>,
    /// Policy overrides (over the file's).
    #[serde(default)]
    pub policy: Policy,
    /// Where the calls go.
    #[serde(default)]
    pub target: Target,
    /// Whether keys minted for different calls must differ.
    #[serde(default)]
    pub distinct_keys: bool,
    /// The calls, before `repeat` expansion.
    pub calls: Vec<Call>,
}

impl HttpScenario {
    /// The calls after `repeat` expansion, in call-index order.
    pub fn expanded_calls(&self) -> Vec<&Call> {
        self.calls
            .iter()
            .flat_map(|c| std::iter::repeat_n(c, c.repeat as usize))
            .collect()
    }

    /// The effective policy: this scenario's over the file's (the SDK's defaults fill the rest).
    pub fn effective_policy(&self, file: &ScenarioFile) -> Policy {
        self.policy.over(&file.policy)
    }
}

/// How a call's key is chosen.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum KeySpec {
    /// `"auto"` or `"none"`.
    Mode(KeyMode),
    /// `{"value": "..."}`: the caller's own key, possibly invalid.
    Given {
        /// The key.
        value: String,
    },
}

/// `"auto"`: the SDK decides; `"none"`: minting turned off for the call.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeyMode {
    /// The SDK mints for POST and PATCH.
    Auto,
    /// No key.
    None,
}

/// A request body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CallBody {
    /// The exact text sent.
    pub text: String,
    /// Its media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

fn one() -> u32 {
    1
}

/// One logical call.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    /// The method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The key.
    pub key: KeySpec,
    /// The body, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<CallBody>,
    /// Extra request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Per-call deadline, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Per-call attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// 1 or 2 retry layers.
    #[serde(default = "one")]
    pub layers: u32,
    /// Repetitions of this call.
    #[serde(default = "one")]
    pub repeat: u32,
    /// One step per attempt; the last one repeats.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server: Vec<Step>,
    /// What must follow.
    pub expect: Expect,
}

impl Call {
    /// The step attempt `attempt` (1-based) gets, and its index.
    pub fn step(&self, attempt: u32) -> Option<(usize, &Step)> {
        let last = self.server.len().checked_sub(1)?;
        let i = (attempt.max(1) as usize - 1).min(last);
        Some((i, &self.server[i]))
    }

    pub(super) fn check(&self, target: Target) -> Result<(), String> {
        if !self.path.starts_with('/') {
            return Err("the path must start with /".into());
        }
        if self.repeat == 0 || !(1..=2).contains(&self.layers) {
            return Err("repeat must be >= 1 and layers 1 or 2".into());
        }
        match target {
            Target::Testbench if self.server.is_empty() => {
                return Err("a call to the testbench needs server steps".into());
            }
            Target::Refused if !self.server.is_empty() => {
                return Err("a call to the refused port has no server steps".into());
            }
            _ => {}
        }
        let e = &self.expect;
        let gaps = e.attempts.saturating_sub(1) as usize;
        if e.waits_ms.as_ref().is_some_and(|w| w.len() != gaps) {
            return Err(format!("waits_ms must have {gaps} pairs (attempts - 1)"));
        }
        if e.attempt_ms
            .as_ref()
            .is_some_and(|w| w.len() != e.attempts as usize)
        {
            return Err(format!("attempt_ms must have {} pairs", e.attempts));
        }
        let given = matches!(self.key, KeySpec::Given { .. });
        let says_given = e.key == KeyExpect::Given
            || matches!(&e.result, CallResult::Error(r) if r.key == KeyExpect::Given);
        if says_given && !given {
            return Err("an expectation says \"given\" but the call gives no key".into());
        }
        for s in &self.server {
            if let (
                Some(Fault::CutOff {
                    cut_off_after_bytes,
                }),
                Some(body),
            ) = (&s.fault, &s.body)
                && *cut_off_after_bytes >= body.bytes().len()
            {
                return Err("cut_off_after_bytes must be shorter than the body".into());
            }
        }
        Ok(())
    }
}
