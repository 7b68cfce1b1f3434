//! What classification reads: the request's facts (method, key), one attempt's outcome (a
//! response's status, headers and problem+json fields, or a transport failure and its phase).

use http::{HeaderMap, Method, StatusCode};
use serde::Deserialize;

/// The problem+json `code` of the server's "a request with this key is still running" conflict.
pub const IN_FLIGHT_CODE: &str = "idempotency_request_in_flight";

/// When a transport failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before any byte of the request could reach the server (the connection failed).
    BeforeSend,
    /// After the request may have been sent: the server may have acted on it.
    AfterSend,
}

/// What kind of transport failure an attempt ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportFailure {
    /// The connection could not be established (refused, DNS, connect timeout).
    Connect,
    /// The attempt timed out.
    Timeout,
    /// The connection was reset or closed before a complete response arrived.
    Reset,
    /// Anything else (invalid request, redirect policy, body error): a bug, never retried.
    Other,
}

/// The fields of an RFC 9457 problem+json body that classification reads: Oncely's `code` and
/// `retryable` extensions, each absent (`None`) when the body lacks it.
///
/// A reader's view of any server's problem, not the problem itself: the one problem type the
/// servers build and render is `oncely_core::Problem`, whose every member is required. This one
/// parses a body from any server (Oncely's, or a Stripe-like API) that carries the two members
/// or only one of them; every other member is ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct ProblemFacts {
    /// The machine-readable `code` extension, such as `idempotency_request_in_flight`.
    #[serde(default)]
    pub code: Option<String>,
    /// The `retryable` extension: `Some(false)` is the server's explicit "do not retry".
    #[serde(default)]
    pub retryable: Option<bool>,
}

impl ProblemFacts {
    /// Parses a JSON body; `None` if it is not a JSON object.
    pub fn from_json(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }
}

/// A response, as far as classification cares.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ResponseFacts<'a> {
    /// Its status.
    pub status: StatusCode,
    /// Its headers (for `x-should-retry` and `Stripe-Should-Retry`).
    pub headers: &'a HeaderMap,
    /// Its problem+json body, when it had one and it was read.
    pub problem: Option<&'a ProblemFacts>,
}

impl<'a> ResponseFacts<'a> {
    /// The facts of one response.
    pub const fn new(
        status: StatusCode,
        headers: &'a HeaderMap,
        problem: Option<&'a ProblemFacts>,
    ) -> Self {
        Self {
            status,
            headers,
            problem,
        }
    }
}

/// One attempt's outcome, as far as classification cares.
#[derive(Clone, Copy, Debug)]
pub enum Outcome<'a> {
    /// A response arrived.
    Response(ResponseFacts<'a>),
    /// No response arrived.
    Transport {
        /// When the failure happened.
        phase: Phase,
        /// What it was.
        failure: TransportFailure,
    },
}

/// The request facts classification depends on; made with [`RequestFacts::new`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RequestFacts<'a> {
    /// The request method.
    pub method: &'a Method,
    /// Whether the request carries an `Idempotency-Key` header.
    pub has_key: bool,
}

impl<'a> RequestFacts<'a> {
    /// The facts of a request by its `method` and whether it carries an `Idempotency-Key`
    /// header (`has_key`).
    #[must_use]
    pub const fn new(method: &'a Method, has_key: bool) -> Self {
        Self { method, has_key }
    }

    /// Whether repeating the request cannot cause a second side effect: an idempotent method
    /// (RFC 9110 section 9.2.2) or an idempotency key.
    pub fn safe_to_repeat(&self) -> bool {
        self.has_key || is_idempotent_method(self.method)
    }
}

/// `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`: idempotent by RFC 9110 section 9.2.2.
pub fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
pub(super) mod examples {
    //! Requests and headers the classification tests share.

    use super::*;

    pub(crate) const POST: RequestFacts<'static> = RequestFacts {
        method: &Method::POST,
        has_key: false,
    };
    pub(crate) const KEYED_POST: RequestFacts<'static> = RequestFacts {
        method: &Method::POST,
        has_key: true,
    };
    pub(crate) const GET: RequestFacts<'static> = RequestFacts {
        method: &Method::GET,
        has_key: false,
    };

    pub(crate) fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, http::HeaderValue::from_static(value));
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_parsing() {
        let p = ProblemFacts::from_json(
            br#"{"type":"about:blank","status":409,"code":"idempotency_request_in_flight","retryable":true}"#,
        )
        .unwrap();
        assert_eq!(p.code.as_deref(), Some(IN_FLIGHT_CODE));
        assert_eq!(p.retryable, Some(true));
        assert!(ProblemFacts::from_json(b"not json").is_none());
    }
}
