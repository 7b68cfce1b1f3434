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

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The format version this crate reads.
pub const FORMAT: u32 = 1;

/// The scenario file the binary was built with (`conformance/retry/scenarios.json`).
pub const BUNDLED_JSON: &str = include_str!("../../../conformance/retry/scenarios.json");

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

/// Kind `defaults`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsScenario {
    /// Its id.
    pub id: String,
    /// The rule.
    pub rule: String,
    /// Where the rule comes from.
    pub sources: Vec<String>,
    /// The SDK's defaults.
    pub expect: DefaultsExpect,
}

/// The default policy every SDK must have.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DefaultsExpect {
    /// Attempts per logical call.
    pub max_attempts: u32,
    /// Overall deadline, in milliseconds.
    pub deadline_ms: u64,
    /// Per-attempt timeout, in milliseconds.
    pub attempt_timeout_ms: u64,
    /// The jitter formula (`"full"`).
    pub jitter: String,
    /// Backoff base, in milliseconds.
    pub base_ms: u64,
    /// Backoff cap, in milliseconds.
    pub cap_ms: u64,
    /// Whether 500 is retried.
    pub retry_500: bool,
    /// Whether keys are minted for POST and PATCH.
    pub mint_keys: bool,
    /// The retry budget.
    pub budget: FullBudget,
}

/// A complete budget configuration, in tokens.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FullBudget {
    /// Capacity (and initial fill).
    pub capacity: u32,
    /// Cost of a retry after a transient error.
    pub transient_cost: u32,
    /// Cost of a retry after throttling.
    pub throttle_cost: u32,
    /// Refund of a first-attempt success.
    pub success_refund: u32,
}

/// Kind `jitter`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JitterScenario {
    /// Its id.
    pub id: String,
    /// The rule.
    pub rule: String,
    /// Where the rule comes from.
    pub sources: Vec<String>,
    /// Base and cap.
    pub policy: JitterPolicy,
    /// Draws per retry number.
    pub draws: u32,
    /// The retry numbers and what their draws must show.
    pub retries: Vec<JitterRetry>,
}

/// The backoff of a jitter scenario, in milliseconds.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JitterPolicy {
    /// Base delay.
    pub base_ms: u64,
    /// Cap on one delay.
    pub cap_ms: u64,
}

/// One retry number of a jitter scenario.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JitterRetry {
    /// The 0-based retry index (0 = the wait before the second attempt), up to `2^32 - 1`.
    pub retry: u32,
    /// What the draws must show.
    pub expect: JitterExpect,
}

/// What the draws of one retry number must show, in milliseconds.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JitterExpect {
    /// No draw above this.
    pub max_ms: f64,
    /// At least one draw below this.
    pub some_below_ms: f64,
    /// At least one draw above this.
    pub some_above_ms: f64,
    /// Bounds on the mean.
    pub mean_ms: Bound,
}

/// Optional lower and upper bounds.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    /// Lower bound, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Upper bound, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// A `[min, max]` pair in milliseconds; `max` `null` means no upper bound.
pub type Pair = (f64, Option<f64>);

/// A policy: every field optional (unset = the SDK's default); durations in milliseconds.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Attempts per logical call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Overall deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Per-attempt timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// Full-jitter base delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<u64>,
    /// Full-jitter cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_ms: Option<u64>,
    /// Retry 500 for requests safe to repeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_500: Option<bool>,
    /// Mint keys for POST and PATCH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mint_keys: Option<bool>,
    /// The budget: absent = inherit, `null` = disabled, an object = overrides key by key.
    #[serde(
        default,
        deserialize_with = "budget_field",
        skip_serializing_if = "BudgetSetting::is_inherit"
    )]
    pub budget: BudgetSetting,
}

/// The `budget` field of a policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum BudgetSetting {
    /// Not set: inherit.
    #[default]
    Inherit,
    /// `null`: no budget.
    Disabled,
    /// Overrides, key by key.
    Set(Budget),
}

impl BudgetSetting {
    fn is_inherit(&self) -> bool {
        *self == Self::Inherit
    }
}

fn budget_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BudgetSetting, D::Error> {
    Ok(match Option::<Budget>::deserialize(d)? {
        None => BudgetSetting::Disabled,
        Some(b) => BudgetSetting::Set(b),
    })
}

/// Budget overrides, in tokens.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Capacity (and initial fill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    /// Cost of a retry after a transient error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transient_cost: Option<u32>,
    /// Cost of a retry after throttling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle_cost: Option<u32>,
    /// Refund of a first-attempt success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_refund: Option<u32>,
}

impl Budget {
    fn over(self, under: Self) -> Self {
        Self {
            capacity: self.capacity.or(under.capacity),
            transient_cost: self.transient_cost.or(under.transient_cost),
            throttle_cost: self.throttle_cost.or(under.throttle_cost),
            success_refund: self.success_refund.or(under.success_refund),
        }
    }
}

impl Policy {
    /// `self` over `under`, key by key (the merge rule of the README).
    pub fn over(&self, under: &Self) -> Self {
        let budget = match (self.budget, under.budget) {
            (BudgetSetting::Inherit, b) => b,
            (BudgetSetting::Disabled, _) => BudgetSetting::Disabled,
            (BudgetSetting::Set(s), BudgetSetting::Set(u)) => BudgetSetting::Set(s.over(u)),
            (BudgetSetting::Set(s), _) => BudgetSetting::Set(s),
        };
        Self {
            max_attempts: self.max_attempts.or(under.max_attempts),
            deadline_ms: self.deadline_ms.or(under.deadline_ms),
            attempt_timeout_ms: self.attempt_timeout_ms.or(under.attempt_timeout_ms),
            base_ms: self.base_ms.or(under.base_ms),
            cap_ms: self.cap_ms.or(under.cap_ms),
            retry_500: self.retry_500.or(under.retry_500),
            mint_keys: self.mint_keys.or(under.mint_keys),
            budget,
        }
    }
}

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

    fn check(&self, target: Target) -> Result<(), String> {
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

/// What the testbench does on one attempt.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// The status (default 200).
    #[serde(default = "ok_status")]
    pub status: u16,
    /// Response headers, literal or templated.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, HeaderValue>,
    /// The body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<StepBody>,
    /// Wait before answering, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// The fault, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
}

fn ok_status() -> u16 {
    200
}

/// A response header value.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum HeaderValue {
    /// Sent as is.
    Literal(String),
    /// Filled in when answering.
    Template(Template),
}

/// A header template.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// An HTTP-date `in_ms` from now, rounded up to the whole second.
    pub http_date: HttpDateTemplate,
}

/// `{"in_ms": N, "form": F}`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpDateTemplate {
    /// Milliseconds from now (negative: in the past).
    pub in_ms: i64,
    /// Which of the three forms.
    pub form: DateForm,
}

/// The three HTTP-date forms of RFC 9110 section 5.6.7.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DateForm {
    /// `Sun, 06 Nov 1994 08:49:37 GMT`.
    ImfFixdate,
    /// `Sunday, 06-Nov-94 08:49:37 GMT`.
    Rfc850,
    /// `Sun Nov  6 08:49:37 1994`.
    Asctime,
}

/// A step's body.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum StepBody {
    /// Exact text.
    Text {
        /// The text.
        text: String,
    },
    /// A JSON value, serialized compactly.
    Json {
        /// The value.
        json: Value,
    },
}

impl StepBody {
    /// The bytes sent.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Self::Text { text } => text.as_bytes().to_vec(),
            Self::Json { json } => serde_json::to_vec(json).unwrap_or_default(),
        }
    }
}

/// A socket-level fault.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Fault {
    /// `"reset"` or `"hang"`.
    Named(NamedFault),
    /// Send the head with the full length, then only this many body bytes, then close.
    CutOff {
        /// Body bytes sent before closing.
        cut_off_after_bytes: usize,
    },
    /// Send the body in chunks, apart in time.
    Slow {
        /// The chunking.
        slow_body: SlowBody,
    },
}

/// The faults without parameters.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NamedFault {
    /// Close with a TCP reset after reading the request.
    Reset,
    /// Never answer.
    Hang,
}

/// `{"chunk_bytes": N, "interval_ms": M}`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SlowBody {
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Milliseconds between chunks.
    pub interval_ms: u64,
}

/// Which key the attempts (or the error) must carry.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeyExpect {
    /// One valid key, the same on every attempt.
    Minted,
    /// Exactly the call's key.
    Given,
    /// No key.
    None,
}

/// What must follow a call.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Attempts the testbench saw.
    pub attempts: u32,
    /// The key on the attempts.
    pub key: KeyExpect,
    /// Bounds on each wait between attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_ms: Option<Vec<Pair>>,
    /// Bounds on the sum of the waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_wait_ms: Option<Bound>,
    /// Bounds on how long the testbench held each attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_ms: Option<Vec<Pair>>,
    /// Bounds on the call's duration as the runner measures it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<Bound>,
    /// The result.
    pub result: CallResult,
}

/// What a call returns.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum CallResult {
    /// The SDK's retry error.
    Error(ErrorExpect),
    /// A response.
    Response(ResponseExpect),
}

/// A returned response.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseExpect {
    /// Its status.
    pub status: u16,
    /// Its body parsed as JSON, if checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_json: Option<Value>,
    /// Its body as text, if checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_text: Option<String>,
    /// Headers that must be present with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// The SDK's retry error.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorExpect {
    /// The error kind (see the README's table).
    pub error: ErrorKind,
    /// Whether the outcome is unknown.
    pub outcome_unknown: bool,
    /// Attempts the SDK reports.
    pub attempts: u32,
    /// The last HTTP status, if the last attempt got one.
    pub last_status: Option<u16>,
    /// The key the error carries.
    pub key: KeyExpect,
    /// Bounds on the `Retry-After` hint the error carries, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<Bound>,
}

/// The language-neutral error kinds.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Every allowed attempt failed retryably.
    AttemptsExhausted,
    /// The deadline ran out.
    DeadlineExhausted,
    /// `Retry-After` does not fit in the time left.
    RetryAfterBeyondDeadline,
    /// The retry budget could not pay.
    BudgetEmpty,
    /// Sent, then no answer, and not safe to repeat.
    OutcomeUnknown,
    /// The caller's key is invalid; nothing sent.
    InvalidIdempotencyKey,
    /// A failure retrying cannot fix.
    NotRetryable,
    /// A streaming body cannot be resent.
    BodyNotReplayable,
    /// A foreign retry layer below re-sent the request.
    NestedRetryLayer,
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
    fn policies_merge_key_by_key_and_null_disables_the_budget() {
        let under: Policy =
            serde_json::from_str(r#"{"max_attempts":3,"base_ms":20,"budget":{"capacity":20}}"#)
                .unwrap();
        let over: Policy =
            serde_json::from_str(r#"{"base_ms":5,"budget":{"transient_cost":10}}"#).unwrap();
        let merged = over.over(&under);
        assert_eq!(merged.max_attempts, Some(3));
        assert_eq!(merged.base_ms, Some(5));
        assert_eq!(
            merged.budget,
            BudgetSetting::Set(Budget {
                capacity: Some(20),
                transient_cost: Some(10),
                ..Budget::default()
            })
        );
        let off: Policy = serde_json::from_str(r#"{"budget":null}"#).unwrap();
        assert_eq!(off.over(&under).budget, BudgetSetting::Disabled);
        let none: Policy = serde_json::from_str("{}").unwrap();
        assert_eq!(none.over(&under).budget, under.budget);
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
