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

/// What went wrong, as a stable machine-readable code: every code a library crate of Oncely
/// emits (the layer, the transactional phases, the webhook receiver, the gRPC dialect).
///
/// Each code knows its HTTP status ([`ErrorCode::status`], under the default `ietf` profile;
/// [`StatusProfile::status`] for the others), its [`title`](ErrorCode::title) and whether a
/// retry of the same request may succeed ([`retryable`](ErrorCode::retryable)). Each variant's
/// doc says where its rule comes from. Codes of an application (a server's `not_found`,
/// `validation_failed`, ...) are not variants: build them with [`Problem::custom`].
///
/// `#[non_exhaustive]`: a later version may add codes; [`ErrorCode::ALL`] lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `idempotency_key_missing`, `400`: the route requires a key and none was sent
    /// (draft-ietf-httpapi-idempotency-key-header section 2.7).
    KeyMissing,
    /// `idempotency_key_invalid`, `400`: the key is empty, too long, not visible ASCII, badly
    /// quoted or the header was repeated (the key contract of `docs/DESIGN.md`; the draft's
    /// section 2.1 for the quoted form).
    KeyInvalid,
    /// `idempotency_key_mismatch`, `422` (`ietf`; profile-dependent): the key was used before
    /// for a request with a different fingerprint. A client bug: never retry it (the draft's
    /// section 2.7).
    KeyMismatch,
    /// `idempotency_request_in_flight`, `409`, retryable: another request with this key is
    /// being processed; retry after `Retry-After` (the draft's section 2.7).
    RequestInFlight,
    /// `idempotency_store_unavailable`, `503`, retryable: the key store could not be reached or
    /// timed out; nothing ran (fail closed, `docs/DESIGN.md`).
    StoreUnavailable,
    /// `idempotency_response_not_retained`, `409`: the request completed but its response was
    /// too large (or an over-limit stream) to keep; it is not re-executed and the original body
    /// cannot be replayed (never a silent partial replay, `docs/DESIGN.md`).
    ResponseNotRetained,
    /// `idempotency_scope_missing`, `401`: the layer could not establish who the caller is, so
    /// it cannot scope the key (records are unique on `(scope, key)`, `docs/DESIGN.md`).
    ScopeMissing,
    /// `idempotency_request_too_large`, `413`: the request body is larger than the limit the
    /// layer buffers for fingerprinting (RFC 9110 section 15.5.14).
    RequestTooLarge,
    /// `idempotency_body_not_canonicalizable`, `400`: the request body is JSON but not I-JSON
    /// (RFC 7493: a member name repeated in one object, or a lone surrogate escape), so it has
    /// no RFC 8785 canonical form and no fingerprint: refused before any claim, nothing ran.
    /// Not retryable unchanged: send the body without the repeated name. (A number is never
    /// refused: see [`crate::jcs`], "Numbers".)
    BodyNotCanonicalizable,
    /// `idempotency_request_needs_attention`, `409`: the request with this key was abandoned
    /// part-way (its server died or an outside system kept failing), the completer re-drove it
    /// a bounded number of times without finishing it, and marked it for a person. It is never
    /// executed again: the first attempt may have taken effect part-way, and only a person can
    /// tell. Not retryable, and a retry with a *new* key may execute the request a second time:
    /// contact the operator instead (`docs/DESIGN.md`, "Every request ends").
    RequestNeedsAttention,
    /// `idempotency_request_body_unreadable`, `400`: the layer could not read the request body
    /// completely (the client or a proxy broke the stream), so it has no fingerprint; nothing
    /// ran (the fingerprint is computed from the bytes received, `docs/DESIGN.md`).
    RequestBodyUnreadable,
    /// `idempotency_layer_missing`, `500`: a handler needs the layer's claim (an
    /// `IdempotencyContext` or a transactional `Tx`) but the request carries none: a server
    /// misconfiguration (the route is not behind the layer).
    LayerMissing,
    /// `idempotency_handler_misuse`, `500`: the handler used its idempotent transaction wrongly
    /// (a second `Tx` extractor, a step begun after the commit): a server bug.
    HandlerMisuse,
    /// `handler_did_not_commit`, `500`: the handler answered success without committing its
    /// idempotent transaction, so its writes were rolled back and nothing was stored; the layer
    /// answers this instead of the success, which would be a lie (a server bug).
    HandlerDidNotCommit,
    /// `response_failed`, `500`, retryable: the response body broke while the transactional
    /// commit captured it; nothing was committed, so a retry with the same key runs again.
    ResponseFailed,
    /// `server_shutting_down`, `503`, retryable: the server instance is draining (graceful
    /// shutdown, `docs/DESIGN.md` "Operating the server") and did not run the request; another
    /// instance answers the retry.
    ServerShuttingDown,
    /// `idempotency_streaming_unsupported`, `501`: a key on a client-streaming or bidirectional
    /// gRPC method, which cannot be made idempotent (`UNIMPLEMENTED` over gRPC).
    StreamingUnsupported,
    /// `database_unavailable`, `503`, retryable: a transactional phase failed transiently in
    /// the database (connection, lock, deadlock, serialization: SQLSTATE classes 08, 40, 53,
    /// 57, SQLite `BUSY`/`LOCKED`); it rolled back, and a retry with the same key runs it again.
    DatabaseUnavailable,
    /// `request_suspended`, `503`, retryable: a later phase of a multi-step request failed
    /// (database, key store or response) and rolled back after earlier phases committed their
    /// recovery points; the record stays in flight at its last recovery point (named in
    /// `detail`), and a retry with the same key resumes there (DESIGN: transactional phases).
    RequestSuspended,
    /// `database_refused`, `422`: the database refused a value of the request for good (a
    /// constraint, a value of the wrong shape: SQLSTATE classes 22 and 23, SQLite constraint
    /// errors); nothing committed and the same request cannot succeed.
    DatabaseRefused,
    /// `database_error`, `500`: any other database failure of a transactional phase (a bug, a
    /// schema problem); nothing committed.
    DatabaseError,
    /// `recovery_point_invalid`, `500`: a stored recovery point does not decode as the
    /// handler's step type (a deploy changed the steps); the request is not re-driven blindly.
    RecoveryPointInvalid,
    /// `webhook_signature_invalid`, `401`: a Standard Webhooks delivery without a `v1`
    /// signature that matches a sender's secret (Standard Webhooks specification, "Verifying
    /// webhook authenticity"); nothing ran.
    WebhookSignatureInvalid,
    /// `webhook_timestamp_out_of_tolerance`, `400`: the delivery's `webhook-timestamp` is more
    /// than the tolerance (5 minutes) away from now (Standard Webhooks, replay protection);
    /// nothing ran.
    WebhookTimestampOutOfTolerance,
    /// `webhook_headers_invalid`, `400`: `webhook-id`, `webhook-timestamp` or
    /// `webhook-signature` missing, repeated or malformed, or a body that is not UTF-8
    /// (Standard Webhooks' required headers); nothing ran.
    WebhookHeadersInvalid,
    /// `webhook_body_too_large`, `413`: the delivery's body is over the receiver's limit
    /// (RFC 9110 section 15.5.14); nothing ran.
    WebhookBodyTooLarge,
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
            Self::RequestNeedsAttention => "idempotency_request_needs_attention",
            Self::RequestBodyUnreadable => "idempotency_request_body_unreadable",
            Self::LayerMissing => "idempotency_layer_missing",
            Self::HandlerMisuse => "idempotency_handler_misuse",
            Self::HandlerDidNotCommit => "handler_did_not_commit",
            Self::ResponseFailed => "response_failed",
            Self::ServerShuttingDown => "server_shutting_down",
            Self::StreamingUnsupported => "idempotency_streaming_unsupported",
            Self::DatabaseUnavailable => "database_unavailable",
            Self::RequestSuspended => "request_suspended",
            Self::DatabaseRefused => "database_refused",
            Self::DatabaseError => "database_error",
            Self::RecoveryPointInvalid => "recovery_point_invalid",
            Self::WebhookSignatureInvalid => "webhook_signature_invalid",
            Self::WebhookTimestampOutOfTolerance => "webhook_timestamp_out_of_tolerance",
            Self::WebhookHeadersInvalid => "webhook_headers_invalid",
            Self::WebhookBodyTooLarge => "webhook_body_too_large",
        }
    }

    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 26] = [
        Self::KeyMissing,
        Self::KeyInvalid,
        Self::KeyMismatch,
        Self::RequestInFlight,
        Self::StoreUnavailable,
        Self::ResponseNotRetained,
        Self::ScopeMissing,
        Self::RequestTooLarge,
        Self::BodyNotCanonicalizable,
        Self::RequestNeedsAttention,
        Self::RequestBodyUnreadable,
        Self::LayerMissing,
        Self::HandlerMisuse,
        Self::HandlerDidNotCommit,
        Self::ResponseFailed,
        Self::ServerShuttingDown,
        Self::StreamingUnsupported,
        Self::DatabaseUnavailable,
        Self::RequestSuspended,
        Self::DatabaseRefused,
        Self::DatabaseError,
        Self::RecoveryPointInvalid,
        Self::WebhookSignatureInvalid,
        Self::WebhookTimestampOutOfTolerance,
        Self::WebhookHeadersInvalid,
        Self::WebhookBodyTooLarge,
    ];

    /// The code named `s` (its [`as_str`](ErrorCode::as_str)), if it is one of [`ALL`](Self::ALL).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Whether a client may retry the same request unchanged.
    pub const fn retryable(self) -> bool {
        matches!(
            self,
            Self::RequestInFlight
                | Self::StoreUnavailable
                | Self::ResponseFailed
                | Self::ServerShuttingDown
                | Self::DatabaseUnavailable
                | Self::RequestSuspended
        )
    }

    /// The HTTP status under the default `ietf` profile (see [`StatusProfile`] for the
    /// others: only `idempotency_key_mismatch` differs).
    pub const fn status(self) -> u16 {
        match self {
            Self::KeyMissing
            | Self::KeyInvalid
            | Self::BodyNotCanonicalizable
            | Self::RequestBodyUnreadable
            | Self::WebhookTimestampOutOfTolerance
            | Self::WebhookHeadersInvalid => 400,
            Self::ScopeMissing | Self::WebhookSignatureInvalid => 401,
            Self::RequestInFlight | Self::ResponseNotRetained | Self::RequestNeedsAttention => 409,
            Self::RequestTooLarge | Self::WebhookBodyTooLarge => 413,
            Self::KeyMismatch | Self::DatabaseRefused => 422,
            Self::LayerMissing
            | Self::HandlerMisuse
            | Self::HandlerDidNotCommit
            | Self::ResponseFailed
            | Self::DatabaseError
            | Self::RecoveryPointInvalid => 500,
            Self::StreamingUnsupported => 501,
            Self::StoreUnavailable
            | Self::ServerShuttingDown
            | Self::DatabaseUnavailable
            | Self::RequestSuspended => 503,
        }
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
            Self::RequestNeedsAttention => {
                "The request with this Idempotency-Key could not be finished and needs a person"
            }
            Self::RequestBodyUnreadable => "Request body unreadable",
            Self::LayerMissing => "Idempotency layer missing",
            Self::HandlerMisuse => "Handler misuse",
            Self::HandlerDidNotCommit => "Handler did not commit",
            Self::ResponseFailed => "Response failed",
            Self::ServerShuttingDown => "Server shutting down",
            Self::StreamingUnsupported => "Idempotency key on a streaming method",
            Self::DatabaseUnavailable => "Database unavailable",
            Self::RequestSuspended => "Request suspended at its recovery point",
            Self::DatabaseRefused => "Request refused by the database",
            Self::DatabaseError => "Database error",
            Self::RecoveryPointInvalid => "Recovery point invalid",
            Self::WebhookSignatureInvalid => "Webhook signature invalid",
            Self::WebhookTimestampOutOfTolerance => "Webhook timestamp out of tolerance",
            Self::WebhookHeadersInvalid => "Webhook headers invalid",
            Self::WebhookBodyTooLarge => "Webhook body too large",
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
/// | `idempotency_request_needs_attention` | 409 | 409 | 409 |
/// | every other code | [`ErrorCode::status`] | the same | the same |
///
/// Sources: `ietf` follows draft-ietf-httpapi-idempotency-key-header section 2.7 (400 missing,
/// 422 reuse with another payload, 409 concurrent). `stripe` follows Stripe's documented
/// behaviour (an `idempotency_error` 400 when the parameters differ, 409 while the first request
/// is in progress). `resend` follows Resend's documented errors (409 `invalid_idempotent_request`
/// for another payload, 409 `concurrent_idempotent_requests`, 400 `invalid_idempotency_key`).
///
/// Why 422 by default: many generic retry loops retry every 409, and a mismatch is a client bug
/// that must not be retried.
///
/// Why 409 for `idempotency_request_needs_attention`: the key's record is in a state that
/// conflicts with running the request (it may have taken effect part-way), it is not a
/// transient failure (a `503` would invite retries for ever), and it is not the client's error.
/// Like every problem it carries `retryable: false` and `x-should-retry: false`, which the SDKs
/// that retry a bare `409` honour first.
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
            ErrorCode::KeyMismatch => match self {
                Self::Ietf => 422,
                Self::Stripe => 400,
                Self::Resend => 409,
            },
            other => other.status(),
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
/// The one problem type of the workspace. The libraries build it from an [`ErrorCode`]
/// ([`Problem::new`], [`Problem::from_code`]); an application builds its own codes with
/// [`Problem::custom`] and the `with_*` builders. It has one serialization ([`Problem::to_json`]:
/// the members in RFC 9457's order, `type`, `title`, `status`, `detail`, `instance`, then
/// `code`, `retryable` and the extensions in insertion order) and one HTTP rendering
/// (`Problem::to_http_response`, behind the `http` feature, and `axum`'s `IntoResponse`
/// behind the `axum` feature): without those features this crate has no web dependency.
///
/// ```
/// use oncely_core::Problem;
///
/// let p = Problem::custom(422, "validation_failed", "Invalid request", "bad fields")
///     .with_extension("errors", serde_json::json!([{"field": "amount"}]));
/// assert_eq!(
///     String::from_utf8(p.to_json()).unwrap(),
///     r#"{"type":"urn:oncely:problem:validation_failed","title":"Invalid request","status":422,"detail":"bad fields","code":"validation_failed","retryable":false,"errors":[{"field":"amount"}]}"#
/// );
/// ```
///
/// `#[non_exhaustive]`: build it with the constructors; the fields stay readable (and
/// writable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
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
    /// A URI reference naming this occurrence (RFC 9457 section 3.1.5); omitted when `None`
    /// (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The machine-readable code, e.g. `idempotency_key_mismatch`.
    pub code: String,
    /// Whether the client may retry the same request unchanged.
    pub retryable: bool,
    /// Extension members, serialized after the members above (empty: none), e.g. `errors`
    /// (the invalid fields of a `422`). A name that repeats one of the members above is not
    /// allowed (the JSON would carry the name twice).
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
    /// The `Retry-After` delay, in whole seconds, that the rendered response carries (`None`,
    /// the default: no `Retry-After`). Not a member of the body.
    #[serde(skip)]
    pub retry_after_secs: Option<u64>,
}

impl Problem {
    /// A problem for `code` under `profile`, with a human `detail`: the code's title, the
    /// profile's status, the code's `retryable`; no `Retry-After` (add one with
    /// [`with_retry_after`](Problem::with_retry_after)).
    pub fn new(code: ErrorCode, profile: StatusProfile, detail: impl Into<String>) -> Self {
        Self::custom(profile.status(code), code.as_str(), code.title(), detail)
            .with_retryable(code.retryable())
    }

    /// [`Problem::new`] under the default `ietf` profile (for answers no profile changes).
    pub fn from_code(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self::new(code, StatusProfile::Ietf, detail)
    }

    /// A problem with an application's own code (outside [`ErrorCode`]: a server's
    /// `validation_failed`, `not_found`, ...): `type` is `urn:oncely:problem:<code>`, `status`
    /// the HTTP status code; not retryable and without `Retry-After` until the builders say
    /// otherwise.
    pub fn custom(
        status: u16,
        code: impl Into<String>,
        title: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        let code = code.into();
        Self {
            type_uri: format!("urn:oncely:problem:{code}"),
            title: title.into(),
            status,
            detail: detail.into(),
            instance: None,
            code,
            retryable: false,
            extensions: serde_json::Map::new(),
            retry_after_secs: None,
        }
    }

    /// Sets whether a retry of the same request may succeed (`retryable`, and the
    /// `x-should-retry` header).
    #[must_use]
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Sets the HTTP status.
    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Sets the `instance` member (a URI reference for this occurrence).
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// Sets the `Retry-After` delay of the rendered response, in whole seconds.
    #[must_use]
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// Adds (or replaces) the extension member `name`.
    #[must_use]
    pub fn with_extension(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.extensions.insert(name.into(), value);
        self
    }

    /// Adds (or replaces) every member of `members` as an extension.
    #[must_use]
    pub fn with_extensions(mut self, members: serde_json::Map<String, serde_json::Value>) -> Self {
        self.extensions.extend(members);
        self
    }

    /// The JSON body bytes: the members in RFC 9457's order (see the [type docs](Problem)).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The value of the `x-should-retry` header for this problem: `true` or `false`, from
    /// `retryable`.
    pub const fn should_retry(&self) -> &'static str {
        if self.retryable { "true" } else { "false" }
    }

    /// The HTTP response of this problem, the one rendering every crate uses: its status
    /// (`500` if it is not a valid status code), `Content-Type: application/problem+json`,
    /// [`X_SHOULD_RETRY`] `true` or `false` from `retryable`, `Retry-After: <seconds>` when
    /// [`retry_after_secs`](Problem::retry_after_secs) is set, and [`to_json`](Problem::to_json)
    /// as the body.
    #[cfg(feature = "http")]
    pub fn to_http_response(&self) -> http::Response<Vec<u8>> {
        use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
        let mut res = http::Response::new(self.to_json());
        *res.status_mut() = http::StatusCode::from_u16(self.status)
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        h.insert(
            http::HeaderName::from_static(X_SHOULD_RETRY),
            HeaderValue::from_static(self.should_retry()),
        );
        if let Some(secs) = self.retry_after_secs {
            h.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

/// `axum`'s `IntoResponse`: [`Problem::to_http_response`].
#[cfg(feature = "axum")]
impl axum_core::response::IntoResponse for Problem {
    fn into_response(self) -> axum_core::response::Response {
        self.to_http_response().map(axum_core::body::Body::from)
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
            let person = Problem::new(ErrorCode::RequestNeedsAttention, p, "");
            assert_eq!(person.status, 409);
            assert_eq!(person.code, "idempotency_request_needs_attention");
            assert!(!person.retryable);
            assert_ne!(person.code, ErrorCode::RequestInFlight.as_str());
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
        let p = Problem::custom(402, "card_declined", "Card declined", "no")
            .with_extension("payment", serde_json::json!({"id": "pay_1"}));
        let text = String::from_utf8(p.to_json()).unwrap();
        assert_eq!(
            text,
            r#"{"type":"urn:oncely:problem:card_declined","title":"Card declined","status":402,"detail":"no","code":"card_declined","retryable":false,"payment":{"id":"pay_1"}}"#
        );
    }

    #[test]
    fn every_code_is_listed_once_and_named_uniquely() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(c.as_str()), Some(c));
            assert!((400..=599).contains(&c.status()), "{c}");
            // A retryable answer is one a retry may fix: a conflict or a server that is down,
            // never a client error other than the in-flight conflict.
            if c.retryable() {
                assert!(c.status() >= 500 || c == ErrorCode::RequestInFlight, "{c}");
            }
        }
        assert_eq!(ErrorCode::from_name("not_found"), None);
    }

    #[cfg(feature = "http")]
    #[test]
    fn every_code_renders_its_status_and_a_problem_json_body() {
        for profile in StatusProfile::ALL {
            for c in ErrorCode::ALL {
                let res = Problem::new(c, profile, "d")
                    .with_retry_after(3)
                    .to_http_response();
                assert_eq!(res.status().as_u16(), profile.status(c), "{c}");
                assert_eq!(res.headers()["content-type"], PROBLEM_JSON);
                assert_eq!(
                    res.headers()[X_SHOULD_RETRY],
                    if c.retryable() { "true" } else { "false" }
                );
                assert_eq!(res.headers()["retry-after"], "3");
                let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
                assert_eq!(v["code"], c.as_str());
                assert_eq!(v["status"], profile.status(c));
                assert_eq!(v["title"], c.title());
                assert_eq!(v["retryable"], c.retryable());
                assert_eq!(v["type"], format!("urn:oncely:problem:{c}"));
                assert!(v.get("retry_after_secs").is_none());
            }
        }
        let res = Problem::custom(404, "not_found", "Not found", "no").to_http_response();
        assert!(!res.headers().contains_key("retry-after"));
        assert_eq!(res.headers()[X_SHOULD_RETRY], "false");
        let res = Problem::custom(1000, "weird", "W", "d").to_http_response();
        assert_eq!(res.status(), 500);
    }

    #[test]
    fn instance_sits_between_detail_and_code() {
        let p = Problem::from_code(ErrorCode::LayerMissing, "d").with_instance("/v1/x");
        let text = String::from_utf8(p.to_json()).unwrap();
        assert!(
            text.contains(r#""detail":"d","instance":"/v1/x","code":"idempotency_layer_missing""#),
            "{text}"
        );
    }
}
