//! The error a logical call ends with when it does not return a response.
//!
//! Every error says how many attempts were made and why the call stopped ([`StopReason`]). With
//! the reqwest-middleware face it travels inside `reqwest_middleware::Error::Middleware`; get it
//! back with [`RetryError::from_middleware`]. With the gRPC face it is the service error under
//! the `tonic::Status` a generated client returns (`oncely_client::grpc::retry_error` finds it).
//!
//! Nothing here promises exactly-once execution, and no error claims it: an
//! [`StopReason::OutcomeUnknown`] error exists precisely because a request sent once may or may
//! not have run, and only an idempotency key lets a retry find out safely.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use http::StatusCode;

/// The last answer a call got from the server, for the error and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LastAnswer {
    /// An HTTP status.
    Http(StatusCode),
    /// A gRPC status code (`grpc-status`, 0 to 16).
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    Grpc(i32),
}

impl LastAnswer {
    /// The status as a number, for the log: the HTTP status code or the gRPC code.
    pub(crate) fn as_number(self) -> i64 {
        match self {
            Self::Http(s) => i64::from(s.as_u16()),
            Self::Grpc(c) => i64::from(c),
        }
    }
}

/// A boxed underlying error (for the reqwest face, a `reqwest::Error`).
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a logical call stopped without a response to return.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The overall deadline ran out (or the next sleep would have ended past it).
    DeadlineExhausted {
        /// The configured overall deadline.
        deadline: Duration,
    },
    /// Every allowed attempt was made and the last one still failed retryably.
    AttemptsExhausted {
        /// The configured maximum number of attempts.
        max_attempts: u32,
    },
    /// The client's retry budget could not pay for another retry (a fleet-wide outage guard).
    BudgetEmpty {
        /// Tokens left in the bucket.
        available: u32,
        /// What the retry would have cost, in tokens.
        cost: u32,
    },
    /// The failure is not one that retrying can fix (a bug: invalid URL, redirect policy...).
    NotRetryable,
    /// The request was sent, then the attempt timed out or the connection broke, and repeating it
    /// is not safe (no idempotency key, non-idempotent method): it may or may not have taken
    /// effect. Check before trying again, or send it with an idempotency key.
    OutcomeUnknown,
    /// The server's `Retry-After` asked for a wait that does not fit in the time left.
    RetryAfterBeyondDeadline {
        /// The server's hint.
        hint: Duration,
        /// What was left of the deadline.
        remaining: Duration,
    },
    /// The request body is a stream that cannot be sent again, so the one attempt made was all.
    BodyNotReplayable,
    /// The caller's `Idempotency-Key` (or one a custom key maker minted) breaks the server's
    /// rules (1 to 255 visible ASCII characters, sent once: the IETF idempotency-key draft as
    /// `oncely_core::IdempotencyKey` parses it). Nothing was sent: a server that treats an
    /// invalid key as absent would run a retried request twice.
    InvalidIdempotencyKey(oncely_core::KeyError),
    /// Another retry layer below this one re-sent the request (`requests` went out for what this
    /// layer counted as one attempt), as seen by the [`crate::SendGuard`] at the bottom of the
    /// stack. Two retry layers in one stack are not supported: this layer stops instead of
    /// multiplying the attempts, and the guard refuses sends beyond the call's attempt limit.
    NestedRetryLayer {
        /// Requests that went out in the whole call.
        requests: u32,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeadlineExhausted { deadline } => {
                write!(f, "overall deadline of {} ms exhausted", deadline.as_millis())
            }
            Self::AttemptsExhausted { max_attempts } => {
                write!(f, "all {max_attempts} attempts failed")
            }
            Self::BudgetEmpty { available, cost } => write!(
                f,
                "retry budget empty ({available} tokens left, a retry costs {cost})"
            ),
            Self::NotRetryable => f.write_str("failure is not retryable"),
            Self::OutcomeUnknown => f.write_str(
                "outcome unknown: the request was sent and may have taken effect; \
                 it was not retried because it is not safe to repeat without an idempotency key",
            ),
            Self::RetryAfterBeyondDeadline { hint, remaining } => write!(
                f,
                "server asked to retry after {} ms but only {} ms of the deadline were left",
                hint.as_millis(),
                remaining.as_millis()
            ),
            Self::BodyNotReplayable => f.write_str(
                "request body is a stream and cannot be resent, so it was sent once and not retried",
            ),
            Self::InvalidIdempotencyKey(e) => write!(f, "invalid idempotency key, nothing sent: {e}"),
            Self::NestedRetryLayer { requests } => write!(
                f,
                "another retry layer below this one re-sent the request ({requests} requests in \
                 all); two retry layers in one stack are not supported, so this one did not retry"
            ),
        }
    }
}

/// A logical call that ended without a response to return.
///
/// Displays as the stop reason, the number of attempts, the time spent, the last status and the
/// last underlying error, for example `all 3 attempts failed (after 3 attempts in 1520 ms; last
/// response 503 Service Unavailable)`.
#[derive(Debug, thiserror::Error)]
#[error("{}", render(self))]
#[non_exhaustive]
pub struct RetryError {
    reason: StopReason,
    attempts: u32,
    elapsed: Duration,
    last_status: Option<StatusCode>,
    last_grpc_code: Option<i32>,
    idempotency_key: Option<String>,
    #[source]
    source: Option<BoxError>,
}

impl RetryError {
    pub(crate) fn new(reason: StopReason, attempts: u32, elapsed: Duration) -> Self {
        Self {
            reason,
            attempts,
            elapsed,
            last_status: None,
            last_grpc_code: None,
            idempotency_key: None,
            source: None,
        }
    }

    pub(crate) fn with_last(mut self, last: Option<LastAnswer>) -> Self {
        match last {
            Some(LastAnswer::Http(status)) => self.last_status = Some(status),
            Some(LastAnswer::Grpc(code)) => self.last_grpc_code = Some(code),
            None => {}
        }
        self
    }

    pub(crate) fn with_key(mut self, key: Option<String>) -> Self {
        self.idempotency_key = key;
        self
    }

    pub(crate) fn with_source(mut self, source: Option<BoxError>) -> Self {
        self.source = source;
        self
    }

    /// Why the call stopped.
    pub fn reason(&self) -> &StopReason {
        &self.reason
    }

    /// How many attempts were made (sent or tried to send), the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time from the start of the logical call to the error.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The HTTP status of the last response, when the last attempt got one (reqwest face).
    pub fn last_status(&self) -> Option<StatusCode> {
        self.last_status
    }

    /// The gRPC status code (`grpc-status`, 0 to 16) of the last response, when the last
    /// attempt got one (gRPC face). The whole status, details included, is this error's
    /// [`source`](StdError::source) (a `tonic::Status`).
    pub fn last_grpc_code(&self) -> Option<i32> {
        self.last_grpc_code
    }

    /// The `Idempotency-Key` every attempt carried, if any: reuse it to retry the same logical
    /// operation later and let the server collapse the repeat.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// The `Retry-After` hint that did not fit in the deadline, if that is why the call stopped.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.reason {
            StopReason::RetryAfterBeyondDeadline { hint, .. } => Some(hint),
            _ => None,
        }
    }

    /// Whether the request may have taken effect although no response says so.
    pub fn is_outcome_unknown(&self) -> bool {
        self.reason == StopReason::OutcomeUnknown
    }

    /// Finds the `RetryError` inside an error returned by a `reqwest_middleware` client.
    pub fn from_middleware(error: &reqwest_middleware::Error) -> Option<&RetryError> {
        match error {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<RetryError>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}

fn render(e: &RetryError) -> String {
    let mut out = format!(
        "{} (after {} attempt{} in {} ms",
        e.reason,
        e.attempts,
        if e.attempts == 1 { "" } else { "s" },
        e.elapsed.as_millis()
    );
    if let Some(status) = e.last_status {
        out.push_str(&format!("; last response {status}"));
    }
    if let Some(code) = e.last_grpc_code {
        out.push_str(&format!("; last grpc-status {code}"));
    }
    if let Some(source) = &e.source {
        out.push_str(&format!("; last error: {source}"));
    }
    out.push(')');
    out
}
