//! The error codes and their RFC 9457 `application/problem+json` bodies, with named status
//! profiles.
//!
//! The machine-readable `code` never changes between profiles; only the HTTP status does. The
//! two conflicts (`idempotency_request_in_flight`, retryable, and `idempotency_key_mismatch`,
//! not retryable) always carry different codes, so a client can tell them apart whatever the
//! status.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// The media type of problem bodies (RFC 9457 section 3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The response header that tells generated SDKs whether to retry: `x-should-retry: true` on
/// every retryable problem, `false` on every other one. It is the convention of
/// Stainless-generated clients (and Stripe's `Stripe-Should-Retry`), which honour it before
/// their own status rules: without it they retry a `409` a couple of times and then give up
/// while the first request still runs, and their caller retries with a new key.
pub const X_SHOULD_RETRY: &str = "x-should-retry";

/// What went wrong, as a stable machine-readable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The route requires a key and none was sent.
    KeyMissing,
    /// The key is empty, too long, not visible ASCII, badly quoted or the header was repeated.
    KeyInvalid,
    /// The key was used before for a request with a different fingerprint. A client bug: never
    /// retry it.
    KeyMismatch,
    /// Another request with this key is being processed; retry after `Retry-After`.
    RequestInFlight,
    /// The key store could not be reached or timed out; nothing ran (fail closed).
    StoreUnavailable,
    /// The request completed but its response was too large (or an over-limit stream) to keep;
    /// it is not re-executed and the original body cannot be replayed.
    ResponseNotRetained,
    /// The layer could not establish who the caller is, so it cannot scope the key.
    ScopeMissing,
    /// The request body is larger than the limit the layer buffers for fingerprinting.
    RequestTooLarge,
    /// The request body is JSON but not I-JSON (RFC 7493: a member name repeated in one object,
    /// a lone surrogate escape, or a number a double may not carry exactly), so it has no
    /// RFC 8785 canonical form and no fingerprint: refused before any claim, nothing ran. Not
    /// retryable unchanged: send the body without the repeated name (or the number as a
    /// string).
    BodyNotCanonicalizable,
}

impl ErrorCode {
    /// The code as it appears in the problem body, e.g. `idempotency_key_mismatch`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::KeyMissing => "idempotency_key_missing",
            Self::KeyInvalid => "idempotency_key_invalid",
            Self::KeyMismatch => "idempotency_key_mismatch",
            Self::RequestInFlight => "idempotency_request_in_flight",
            Self::StoreUnavailable => "idempotency_store_unavailable",
            Self::ResponseNotRetained => "idempotency_response_not_retained",
            Self::ScopeMissing => "idempotency_scope_missing",
            Self::RequestTooLarge => "idempotency_request_too_large",
            Self::BodyNotCanonicalizable => "idempotency_body_not_canonicalizable",
        }
    }

    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 9] = [
        Self::KeyMissing,
        Self::KeyInvalid,
        Self::KeyMismatch,
        Self::RequestInFlight,
        Self::StoreUnavailable,
        Self::ResponseNotRetained,
        Self::ScopeMissing,
        Self::RequestTooLarge,
        Self::BodyNotCanonicalizable,
    ];

    /// Whether a client may retry the same request unchanged.
    pub const fn retryable(self) -> bool {
        matches!(self, Self::RequestInFlight | Self::StoreUnavailable)
    }

    /// A short human title.
    pub const fn title(self) -> &'static str {
        match self {
            Self::KeyMissing => "Idempotency-Key header missing",
            Self::KeyInvalid => "Idempotency-Key header invalid",
            Self::KeyMismatch => "Idempotency-Key reused with a different request",
            Self::RequestInFlight => "A request with this Idempotency-Key is in progress",
            Self::StoreUnavailable => "Idempotency key store unavailable",
            Self::ResponseNotRetained => "Original response not retained",
            Self::ScopeMissing => "Caller not authenticated",
            Self::RequestTooLarge => "Request body too large",
            Self::BodyNotCanonicalizable => "JSON body not I-JSON",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which HTTP statuses the codes map to. The codes themselves never change.
///
/// | code | `ietf` (default) | `stripe` | `resend` |
/// |---|---|---|---|
/// | `idempotency_key_missing` | 400 | 400 | 400 |
/// | `idempotency_key_invalid` | 400 | 400 | 400 |
/// | `idempotency_key_mismatch` | 422 | 400 | 409 |
/// | `idempotency_request_in_flight` | 409 | 409 | 409 |
/// | `idempotency_store_unavailable` | 503 | 503 | 503 |
/// | `idempotency_response_not_retained` | 409 | 409 | 409 |
/// | `idempotency_scope_missing` | 401 | 401 | 401 |
/// | `idempotency_request_too_large` | 413 | 413 | 413 |
/// | `idempotency_body_not_canonicalizable` | 400 | 400 | 400 |
///
/// Sources: `ietf` follows draft-ietf-httpapi-idempotency-key-header section 2.7 (400 missing,
/// 422 reuse with another payload, 409 concurrent). `stripe` follows Stripe's documented
/// behaviour (an `idempotency_error` 400 when the parameters differ, 409 while the first request
/// is in progress). `resend` follows Resend's documented errors (409 `invalid_idempotent_request`
/// for another payload, 409 `concurrent_idempotent_requests`, 400 `invalid_idempotency_key`).
///
/// Why 422 by default: many generic retry loops retry every 409, and a mismatch is a client bug
/// that must not be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StatusProfile {
    /// The IETF draft's statuses (the default).
    #[default]
    Ietf,
    /// Stripe's statuses.
    Stripe,
    /// Resend's statuses.
    Resend,
}

impl StatusProfile {
    /// The HTTP status for a code under this profile.
    pub const fn status(self, code: ErrorCode) -> u16 {
        match code {
            ErrorCode::KeyMissing | ErrorCode::KeyInvalid | ErrorCode::BodyNotCanonicalizable => {
                400
            }
            ErrorCode::KeyMismatch => match self {
                Self::Ietf => 422,
                Self::Stripe => 400,
                Self::Resend => 409,
            },
            ErrorCode::RequestInFlight | ErrorCode::ResponseNotRetained => 409,
            ErrorCode::StoreUnavailable => 503,
            ErrorCode::ScopeMissing => 401,
            ErrorCode::RequestTooLarge => 413,
        }
    }

    /// The profile's name: `ietf`, `stripe` or `resend`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ietf => "ietf",
            Self::Stripe => "stripe",
            Self::Resend => "resend",
        }
    }

    /// Every profile.
    pub const ALL: [StatusProfile; 3] = [Self::Ietf, Self::Stripe, Self::Resend];
}

/// An unknown profile name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status profile {0:?}; expected ietf, stripe or resend")]
pub struct UnknownProfile(pub String);

impl FromStr for StatusProfile {
    type Err = UnknownProfile;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ietf" => Ok(Self::Ietf),
            "stripe" => Ok(Self::Stripe),
            "resend" => Ok(Self::Resend),
            other => Err(UnknownProfile(other.to_owned())),
        }
    }
}

/// An RFC 9457 problem details body with Oncely's `code` and `retryable` extensions, and any
/// further extension members (RFC 9457 section 3.2).
///
/// The one problem type of the workspace: the layer ([`Problem::new`] for an [`ErrorCode`]), the
/// transactional phases and the reference server ([`Problem::other`] for their own codes) build
/// it; `oncely_tower::problem_response` renders it.
///
/// ```
/// use oncely_core::Problem;
///
/// let p = Problem::other(422, "validation_failed", "Invalid request", "bad fields", false)
///     .with_extension("errors", serde_json::json!([{"field": "amount"}]));
/// let v: serde_json::Value = serde_json::from_slice(&p.to_json()).unwrap();
/// assert_eq!(v["type"], "urn:oncely:problem:validation_failed");
/// assert_eq!(v["errors"][0]["field"], "amount");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// A URI naming the problem type: `urn:oncely:problem:<code>`.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short human summary, the same for every occurrence of the type.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// A human explanation of this occurrence.
    pub detail: String,
    /// The machine-readable code, e.g. `idempotency_key_mismatch`.
    pub code: String,
    /// Whether the client may retry the same request unchanged.
    pub retryable: bool,
    /// Extension members, serialized after the members above (empty: none), e.g. `errors`
    /// (the invalid fields of a `422`). A name that repeats one of the members above is not
    /// allowed (the JSON would carry the name twice).
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    /// A problem for `code` under `profile`, with a human `detail`.
    pub fn new(code: ErrorCode, profile: StatusProfile, detail: impl Into<String>) -> Self {
        Self {
            type_uri: format!("urn:oncely:problem:{}", code.as_str()),
            title: code.title().to_owned(),
            status: profile.status(code),
            detail: detail.into(),
            code: code.as_str().to_owned(),
            retryable: code.retryable(),
            extensions: serde_json::Map::new(),
        }
    }

    /// A problem with a code outside [`ErrorCode`] (a server's own: `validation_failed`,
    /// `database_unavailable`, ...): `type` is `urn:oncely:problem:<code>`, `status` the HTTP
    /// status code.
    pub fn other(
        status: u16,
        code: &str,
        title: &str,
        detail: impl Into<String>,
        retryable: bool,
    ) -> Self {
        Self {
            type_uri: format!("urn:oncely:problem:{code}"),
            title: title.to_owned(),
            status,
            detail: detail.into(),
            code: code.to_owned(),
            retryable,
            extensions: serde_json::Map::new(),
        }
    }

    /// Adds (or replaces) the extension member `name`.
    #[must_use]
    pub fn with_extension(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.extensions.insert(name.into(), value);
        self
    }

    /// The JSON body bytes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_have_distinct_codes_and_retryability_in_every_profile() {
        for p in StatusProfile::ALL {
            let inflight = Problem::new(ErrorCode::RequestInFlight, p, "");
            let mismatch = Problem::new(ErrorCode::KeyMismatch, p, "");
            assert_ne!(inflight.code, mismatch.code);
            assert!(inflight.retryable);
            assert!(!mismatch.retryable);
            assert_eq!(p.name().parse::<StatusProfile>().unwrap(), p);
        }
        assert_eq!(StatusProfile::Ietf.status(ErrorCode::KeyMismatch), 422);
        assert_eq!(StatusProfile::Stripe.status(ErrorCode::KeyMismatch), 400);
        assert_eq!(StatusProfile::Resend.status(ErrorCode::KeyMismatch), 409);
        for p in StatusProfile::ALL {
            let refused = Problem::new(ErrorCode::BodyNotCanonicalizable, p, "");
            assert_eq!(refused.status, 400);
            assert_eq!(refused.code, "idempotency_body_not_canonicalizable");
            assert!(!refused.retryable);
        }
    }

    #[test]
    fn problem_body_has_the_rfc_9457_members() {
        let p = Problem::new(ErrorCode::KeyMismatch, StatusProfile::Ietf, "d");
        let v: serde_json::Value = serde_json::from_slice(&p.to_json()).unwrap();
        assert_eq!(v["type"], "urn:oncely:problem:idempotency_key_mismatch");
        assert_eq!(v["status"], 422);
        assert_eq!(v["code"], "idempotency_key_mismatch");
        assert_eq!(v["retryable"], false);
        assert_eq!(v["detail"], "d");
        assert!(v["title"].is_string());
        // No extension: the body is the six members, in RFC 9457's order.
        assert!(
            String::from_utf8(p.to_json()).unwrap().starts_with(
                "{\"type\":\"urn:oncely:problem:idempotency_key_mismatch\",\"title\":"
            )
        );
        assert_eq!(v.as_object().unwrap().len(), 6);
    }

    #[test]
    fn extensions_follow_the_standard_members() {
        let p = Problem::other(402, "card_declined", "Card declined", "no", false)
            .with_extension("payment", serde_json::json!({"id": "pay_1"}));
        let text = String::from_utf8(p.to_json()).unwrap();
        assert_eq!(
            text,
            r#"{"type":"urn:oncely:problem:card_declined","title":"Card declined","status":402,"detail":"no","code":"card_declined","retryable":false,"payment":{"id":"pay_1"}}"#
        );
    }
}
