//! The two kinds that need no server: `defaults` (the SDK's default policy) and `jitter`
//! (full-jitter draws).

use serde::{Deserialize, Serialize};

use super::Bound;

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
