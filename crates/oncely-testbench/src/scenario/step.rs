//! The server half: what the testbench does on one attempt (status, headers, body, delay,
//! and a socket-level fault).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
