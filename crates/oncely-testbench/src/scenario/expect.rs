//! What must follow a call: the attempts the testbench saw, their key, the waits, and the
//! response or the SDK's retry error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
