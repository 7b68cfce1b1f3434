//! Key-machine outcomes as gRPC statuses ([`GrpcDialect`]), and a gRPC response's status as the
//! HTTP status the store policy judges.
//!
//! # The status table
//!
//! Every answer of the layer is a gRPC status (a trailers-only response: HTTP `200` with
//! `grpc-status`, `grpc-message` and `grpc-status-details-bin` in the headers) whose details,
//! a `google.rpc.Status`, carry:
//!
//! - `google.rpc.ErrorInfo`: `reason` our machine code in upper case (AIP-193's form, e.g.
//!   `IDEMPOTENCY_REQUEST_IN_FLIGHT`), `domain` [`ERROR_DOMAIN`], `metadata`
//!   `{"code": "idempotency_request_in_flight", "retryable": "true", "httpStatus": "409"}`
//!   (`code` the machine code exactly as the REST API's problem+json says it);
//! - `google.rpc.RetryInfo` with `retry_delay` (whole seconds) on exactly the answers that
//!   carry `Retry-After` over HTTP;
//!
//! and those retryable answers also carry gRFC A6's server pushback, `grpc-retry-pushback-ms`
//! (the same delay in milliseconds), which stock gRPC clients with a retry policy honour: their
//! next attempt waits that long instead of their own backoff (A6, "Pushback"). gRPC libraries do
//! not read `RetryInfo` themselves; the Oncely client SDK reads both.
//!
//! The codes follow gRPC's status code guide and AIP-193/AIP-194, chosen so that an A6 retry
//! policy with `"retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]` retries exactly the answers
//! after which a retry is safe and may succeed ([`GRPC_STATUS_TABLE`]):
//!
//! | machine code | gRPC status | retried by that policy | why this code |
//! |---|---|---|---|
//! | `idempotency_request_in_flight` | `ABORTED` + `RetryInfo` | yes | a concurrency conflict with the first call (gRPC's guide: ABORTED for a conflict the client resolves by retrying); nothing ran twice |
//! | `idempotency_store_unavailable` | `UNAVAILABLE` + `RetryInfo` | yes | transient, nothing ran (AIP-194: UNAVAILABLE is the code to retry) |
//! | `server_shutting_down` | `UNAVAILABLE` + `RetryInfo` | yes | this instance stops; another answers |
//! | `idempotency_key_mismatch` | `FAILED_PRECONDITION` | never | the key already belongs to a different request: the system's state, not the message, is wrong, and no retry fixes it (AIP-193) |
//! | `idempotency_key_missing`, `idempotency_key_invalid` | `INVALID_ARGUMENT` | never | the call itself is malformed |
//! | `idempotency_body_not_canonicalizable`, `idempotency_request_body_unreadable` | `INVALID_ARGUMENT` | never | the call itself is malformed |
//! | `idempotency_scope_missing` | `UNAUTHENTICATED` | never | no caller to scope the key by |
//! | `idempotency_request_too_large` | `RESOURCE_EXHAUSTED` | never | gRPC's own code for a message over the size limit |
//! | `idempotency_response_not_retained` | `ALREADY_EXISTS` | never | the call completed earlier; its response was too large to keep, and it is not run again |
//! | `idempotency_streaming_unsupported` | `UNIMPLEMENTED` | never | a key on a client-streaming or bidirectional method, which the layer cannot make idempotent |
//! | `database_unavailable`, `response_failed` | `UNAVAILABLE` + `RetryInfo` | yes | a transactional phase failed transiently and rolled back; a retry runs it again |
//! | `request_suspended` | `UNAVAILABLE` + `RetryInfo` | yes | a later phase rolled back after earlier ones committed; the request waits at its recovery point, and a retry resumes it there |
//! | `idempotency_request_needs_attention` | `FAILED_PRECONDITION` | never | the completer gave up on the request and marked it for a person: the system is not in the state the call needs, and no retry changes that (AIP-193) |
//! | `handler_did_not_commit` | `INTERNAL` | never | a server bug (a success whose writes were rolled back) |
//! | `idempotency_layer_missing`, `idempotency_handler_misuse`, `database_error`, `recovery_point_invalid` | `INTERNAL` | never | a server bug or misconfiguration |
//! | `database_refused` | `INVALID_ARGUMENT` | never | the database refuses a value of the message for good |
//! | `webhook_signature_invalid` | `UNAUTHENTICATED` | never | the webhook receiver's refusals, by gRPC's HTTP mapping |
//! | `webhook_timestamp_out_of_tolerance`, `webhook_headers_invalid` | `INVALID_ARGUMENT` | never | |
//! | `webhook_body_too_large` | `RESOURCE_EXHAUSTED` | never | |
//!
//! The HTTP status profiles (`ietf`, `stripe`, `resend`) change only the `httpStatus` entry of
//! the metadata, never the gRPC status.
//!
//! # What a handler's status means to the store policy
//!
//! A gRPC response is HTTP `200` whatever its outcome; its status is `grpc-status`, in the
//! headers (a trailers-only error) or in the trailers. [`GrpcDialect`] reads it and classifies
//! it ([`call_end`], every one of the 17 codes), and the layer's
//! [`StorePolicy`](oncely_core::StorePolicy) decides from that as from an HTTP status
//! ([`judged_status`]): a final answer is stored and replayed with its trailers, a "try again"
//! releases the key, and a failure is stored from a non-transactional handler (its effects are
//! unknown) but never committed by a transactional one (docs/DESIGN.md, "The store policy"):
//!
//! | gRPC status | [`CallEnd`] | non-transactional handler | `Tx::commit` of it | why |
//! |---|---|---|---|---|
//! | `OK` | answered | stored | committed | the call's result |
//! | `INVALID_ARGUMENT`, `OUT_OF_RANGE` | answered | stored | committed | the message is wrong: a retry of it gets the same answer |
//! | `FAILED_PRECONDITION` | answered | stored | committed | the system is not in the state the call needs (gRPC's guide: not retried until it is fixed) |
//! | `NOT_FOUND`, `PERMISSION_DENIED`, `UNAUTHENTICATED` | answered | stored | committed | final answers (HTTP 404, 403, 401) |
//! | `ALREADY_EXISTS` | answered | stored | committed | what the call would create exists: final (gRPC's guide: not retried). `google.rpc.Code` maps it to 409 like `ABORTED`, but only `ABORTED` says "try again" |
//! | `UNIMPLEMENTED` | answered | stored | committed | the method is not implemented or not enabled: final, whatever `google.rpc.Code`'s 501 suggests |
//! | `ABORTED` | try again | released | rolled back, released | a concurrency conflict, resolved by retrying (gRPC's guide; HTTP 409) |
//! | `RESOURCE_EXHAUSTED` | try again | released | rolled back, released | a quota or rate limit, or a message too large: nothing was done (HTTP 429) |
//! | `CANCELLED` | failed | stored | rolled back, released | the call stopped before its end (its caller went away, or a call it made was cancelled): its effects are unknown, and a retry's caller cancelled nothing, so it is never a final answer |
//! | `DEADLINE_EXCEEDED` | failed | stored | rolled back, released | the handler ran out of time part-way; it may have done its work (gRPC's guide; HTTP 504) |
//! | `UNAVAILABLE` | failed | stored | rolled back, released | transient, but after the handler ran: as HTTP 503 |
//! | `UNKNOWN`, `INTERNAL`, `DATA_LOSS` | failed | stored | rolled back, released | server errors (HTTP 500) |
//!
//! "Rolled back, released": a transactional handler's `Tx::commit` of it does not commit; the
//! phase rolls back with its writes and the key is released, or the request suspended at its
//! last committed recovery point, so that a retry runs again. A `grpc-status` that is not a
//! number is `UNKNOWN`.

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use oncely_core::{ErrorCode, Problem};
use oncely_tower::{Body, Dialect, IDEMPOTENT_REPLAYED};
use std::collections::HashMap;
use std::time::Duration;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt as _};

/// The `google.rpc.ErrorInfo.domain` of every answer of the layer: `oncely.dev`.
pub const ERROR_DOMAIN: &str = "oncely.dev";

/// gRFC A6's server pushback header, `grpc-retry-pushback-ms`: how long, in milliseconds, a
/// client's retry policy waits before its next attempt. Sent on every retryable answer.
pub const RETRY_PUSHBACK_MS: http::HeaderName =
    http::HeaderName::from_static("grpc-retry-pushback-ms");

/// The machine code of a key sent on a method that cannot be made idempotent (client-streaming
/// or bidirectional): `idempotency_streaming_unsupported`
/// ([`ErrorCode::StreamingUnsupported`]), answered `UNIMPLEMENTED`.
pub const STREAMING_UNSUPPORTED: &str = ErrorCode::StreamingUnsupported.as_str();

/// One row of the status table: a machine code, its gRPC status, whether the answer carries
/// `RetryInfo` (and is retried by the recommended A6 policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatusRow {
    /// The machine code, e.g. [`ErrorCode::RequestInFlight`].
    pub code: ErrorCode,
    /// The gRPC status.
    pub grpc: Code,
    /// `true` for the answers with `RetryInfo`, after which a retry with the same key is safe.
    pub retryable: bool,
}

/// The status table (see the [module docs](self)), in the order the contract shows it: one row
/// for every [`ErrorCode`] (a test checks it).
pub const GRPC_STATUS_TABLE: &[StatusRow] = &[
    row(ErrorCode::RequestInFlight, Code::Aborted),
    row(ErrorCode::StoreUnavailable, Code::Unavailable),
    row(ErrorCode::ServerShuttingDown, Code::Unavailable),
    // Transient failures of a transactional phase, rolled back: a retry runs it again.
    row(ErrorCode::DatabaseUnavailable, Code::Unavailable),
    // A later phase rolled back; the request waits at its recovery point for the retry.
    row(ErrorCode::RequestSuspended, Code::Unavailable),
    row(ErrorCode::ResponseFailed, Code::Unavailable),
    row(ErrorCode::KeyMismatch, Code::FailedPrecondition),
    row(ErrorCode::KeyMissing, Code::InvalidArgument),
    row(ErrorCode::KeyInvalid, Code::InvalidArgument),
    row(ErrorCode::BodyNotCanonicalizable, Code::InvalidArgument),
    row(ErrorCode::RequestBodyUnreadable, Code::InvalidArgument),
    row(ErrorCode::ScopeMissing, Code::Unauthenticated),
    row(ErrorCode::RequestTooLarge, Code::ResourceExhausted),
    row(ErrorCode::ResponseNotRetained, Code::AlreadyExists),
    row(ErrorCode::StreamingUnsupported, Code::Unimplemented),
    row(ErrorCode::HandlerDidNotCommit, Code::Internal),
    // The completer gave up on the request and a person must look: never retried (AIP-193:
    // the system is not in the state the call needs, and retrying will not change that).
    row(ErrorCode::RequestNeedsAttention, Code::FailedPrecondition),
    // Server bugs and misconfigurations: gRPC's guide keeps INTERNAL for them.
    row(ErrorCode::LayerMissing, Code::Internal),
    row(ErrorCode::HandlerMisuse, Code::Internal),
    row(ErrorCode::DatabaseError, Code::Internal),
    row(ErrorCode::RecoveryPointInvalid, Code::Internal),
    // A value the database refuses for good: the message is wrong (gRPC's mapping of 422).
    row(ErrorCode::DatabaseRefused, Code::InvalidArgument),
    // The webhook receiver's refusals, by gRPC's HTTP mapping (401, 400, 413).
    row(ErrorCode::WebhookSignatureInvalid, Code::Unauthenticated),
    row(
        ErrorCode::WebhookTimestampOutOfTolerance,
        Code::InvalidArgument,
    ),
    row(ErrorCode::WebhookHeadersInvalid, Code::InvalidArgument),
    row(ErrorCode::WebhookBodyTooLarge, Code::ResourceExhausted),
];

/// The gRPC statuses the recommended A6 retry policy retries: `UNAVAILABLE` and `ABORTED`.
pub const RETRYABLE_STATUS_CODES: &[Code] = &[Code::Unavailable, Code::Aborted];

const fn row(code: ErrorCode, grpc: Code) -> StatusRow {
    StatusRow {
        code,
        grpc,
        retryable: code.retryable(),
    }
}

/// The gRPC status of a machine code: by [`GRPC_STATUS_TABLE`]; a code outside it (a problem a
/// layer added later) by its HTTP status ([`code_of_http_status`]), `UNAVAILABLE` when it is
/// retryable.
pub fn grpc_code_of(code: &str, http_status: u16, retryable: bool) -> Code {
    match GRPC_STATUS_TABLE.iter().find(|r| r.code.as_str() == code) {
        Some(r) => r.grpc,
        None if retryable => Code::Unavailable,
        // A final answer must never come out as a status the recommended A6 policy retries
        // (a 409 that is not "in flight" would otherwise be ABORTED).
        None => match code_of_http_status(http_status) {
            c if RETRYABLE_STATUS_CODES.contains(&c) => Code::FailedPrecondition,
            c => c,
        },
    }
}

/// The gRPC status for an HTTP status, by the mapping of gRPC's "HTTP to gRPC status code
/// mapping" and `google.rpc.Code` (400 `INVALID_ARGUMENT`, 401 `UNAUTHENTICATED`, 403
/// `PERMISSION_DENIED`, 404 `NOT_FOUND`, 409 `ABORTED`, 413 `RESOURCE_EXHAUSTED`, 429
/// `RESOURCE_EXHAUSTED`, 501 `UNIMPLEMENTED`, 503 `UNAVAILABLE`, 504 `DEADLINE_EXCEEDED`,
/// other 4xx `FAILED_PRECONDITION`, other 5xx `INTERNAL`).
pub fn code_of_http_status(status: u16) -> Code {
    match status {
        200..=299 => Code::Ok,
        400 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::Aborted,
        413 | 429 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        400..=499 => Code::FailedPrecondition,
        _ => Code::Internal,
    }
}

/// The HTTP status of a gRPC status, by `google.rpc.Code`'s documented mapping (`OK` 200,
/// `CANCELLED` 499, `UNKNOWN` 500, `INVALID_ARGUMENT` 400, `DEADLINE_EXCEEDED` 504, `NOT_FOUND`
/// 404, `ALREADY_EXISTS` 409, `PERMISSION_DENIED` 403, `RESOURCE_EXHAUSTED` 429,
/// `FAILED_PRECONDITION` 400, `ABORTED` 409, `OUT_OF_RANGE` 400, `UNIMPLEMENTED` 501, `INTERNAL`
/// 500, `UNAVAILABLE` 503, `DATA_LOSS` 500, `UNAUTHENTICATED` 401).
pub fn http_status_of(code: Code) -> StatusCode {
    let n = match code {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::DeadlineExceeded => 504,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::PermissionDenied => 403,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::Unauthenticated => 401,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    };
    StatusCode::from_u16(n).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// Every gRPC status code, in the order of their numbers (0 to 16).
pub const ALL_CODES: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

/// What a handler's gRPC status says about its call, for the store policy (the table in the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallEnd {
    /// A final answer (`OK`, or an error a retry of the same call would get again): stored and
    /// replayed; a transactional handler's `Tx::commit` of it commits.
    Answered,
    /// Nothing was done and a retry may succeed (`ABORTED`, `RESOURCE_EXHAUSTED`; HTTP's 408,
    /// 409, 425 and 429): not stored, the key is released.
    TryAgain,
    /// The call failed or stopped part-way, its effects unknown (HTTP's 5xx): stored from a
    /// non-transactional handler; a transactional handler's `Tx::commit` of it does not commit,
    /// and the key is released (or the request suspended at its recovery point).
    Failed,
}

/// The class of every gRPC status code for the store policy (see the [module docs](self) for
/// the reasons, after gRPC's status code guide and AIP-194).
pub const fn call_end(code: Code) -> CallEnd {
    match code {
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Unauthenticated => CallEnd::Answered,
        Code::ResourceExhausted | Code::Aborted => CallEnd::TryAgain,
        Code::Cancelled
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss => CallEnd::Failed,
    }
}

/// The HTTP status the store policy judges a handler's gRPC status by: `google.rpc.Code`'s
/// mapping ([`http_status_of`]) where it says what [`call_end`] says, else the HTTP status of
/// that class: `400` for the final answers `ALREADY_EXISTS` (mapped to 409, "try again" to the
/// policy) and `UNIMPLEMENTED` (mapped to 501), `500` for `CANCELLED` (mapped to 499, a final
/// client error to the policy).
pub fn judged_status(code: Code) -> StatusCode {
    let mapped = http_status_of(code);
    match (call_end(code), code) {
        (CallEnd::Answered, Code::AlreadyExists | Code::Unimplemented) => StatusCode::BAD_REQUEST,
        (CallEnd::Failed, Code::Cancelled) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => mapped,
    }
}

/// The gRPC status of a problem, with its `google.rpc` details (see the [module docs](self)):
/// `ErrorInfo` always, `RetryInfo` when the problem's
/// [`retry_after_secs`](Problem::retry_after_secs) is set (the one channel of the delay, the
/// `Retry-After` of plain HTTP).
pub fn status_of(problem: &Problem) -> tonic::Status {
    let code = grpc_code_of(&problem.code, problem.status, problem.retryable);
    let mut details = ErrorDetails::new();
    let metadata = HashMap::from([
        ("code".to_owned(), problem.code.clone()),
        ("retryable".to_owned(), problem.retryable.to_string()),
        ("httpStatus".to_owned(), problem.status.to_string()),
    ]);
    details.set_error_info(problem.code.to_ascii_uppercase(), ERROR_DOMAIN, metadata);
    if let Some(secs) = problem.retry_after_secs {
        details.set_retry_info(Some(Duration::from_secs(secs)));
    }
    tonic::Status::with_error_details(code, problem.detail.clone(), details)
}

/// The gRPC dialect of the layer: answers as gRPC statuses with `google.rpc` details, responses
/// judged by their `grpc-status` (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcDialect;

impl Dialect for GrpcDialect {
    fn render(&self, problem: &Problem) -> Response<Body> {
        let mut res: Response<Body> = status_of(problem).into_http();
        // The status travels as a `tonic::Status` extension too; a replayed marker is added
        // by the layer where it applies (`idempotency_response_not_retained`).
        res.extensions_mut().remove::<tonic::Status>();
        if let Some(secs) = problem.retry_after_secs {
            res.headers_mut().insert(
                RETRY_PUSHBACK_MS,
                HeaderValue::from(secs.saturating_mul(1000)),
            );
        }
        debug_assert!(!res.headers().contains_key(IDEMPOTENT_REPLAYED));
        res
    }

    fn effective_status(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        trailers: &[(String, Vec<u8>)],
    ) -> StatusCode {
        if status != StatusCode::OK {
            // Not a gRPC answer (a proxy's, or the transport's): judged as HTTP.
            return status;
        }
        let from_trailers = trailers
            .iter()
            .rev()
            .find(|(n, _)| n == "grpc-status")
            .map(|(_, v)| v.as_slice());
        let grpc_status =
            from_trailers.or_else(|| headers.get("grpc-status").map(HeaderValue::as_bytes));
        match grpc_status {
            // The status is still to come in the trailers: kept until then.
            None => StatusCode::OK,
            Some(v) => {
                let code = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                    .map_or(Code::Unknown, Code::from_i32);
                judged_status(code)
            }
        }
    }
}

/// The gRPC service config (gRFC A2) of a retry policy (gRFC A6) that retries exactly the safe
/// answers of `service` (a full name, e.g. `oncely.payments.v1.Payments`): at most
/// `max_attempts` attempts in total, the backoff `random(0, min(initial x 2^(n-1), max))`
/// (A6's own full jitter), `retryableStatusCodes` [`RETRYABLE_STATUS_CODES`], and A6 retry
/// throttling (`maxTokens` 10, `tokenRatio` 0.1: retries stop while more than half of the
/// recent calls failed). Backoffs are written in seconds with a fraction, as A2 wants.
///
/// ```
/// use std::time::Duration;
/// let json = oncely_grpc::status::service_config("oncely.payments.v1.Payments", 3, Duration::from_millis(500), Duration::from_secs(8));
/// assert!(json.contains(r#""retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]"#));
/// assert!(json.contains(r#""initialBackoff": "0.5s""#));
/// ```
pub fn service_config(
    service: &str,
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
) -> String {
    let codes: Vec<String> = RETRYABLE_STATUS_CODES
        .iter()
        .map(|c| format!("\"{}\"", code_name(*c)))
        .collect();
    format!(
        r#"{{
  "methodConfig": [{{
    "name": [{{"service": "{service}"}}],
    "retryPolicy": {{
      "maxAttempts": {max_attempts},
      "initialBackoff": "{}s",
      "maxBackoff": "{}s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": [{}]
    }}
  }}],
  "retryThrottling": {{"maxTokens": 10, "tokenRatio": 0.1}}
}}"#,
        initial_backoff.as_secs_f64(),
        max_backoff.as_secs_f64(),
        codes.join(", ")
    )
}

/// A status code's name as gRPC writes it, e.g. `FAILED_PRECONDITION`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Decodes `grpc-status-details-bin` (base64, padded or not, as gRPC allows) into its
/// `google.rpc` details: for clients and tests that hold the raw metadata.
///
/// # Errors
///
/// The value is not base64, or not an encoded `google.rpc.Status`.
pub fn decode_details(value: &[u8]) -> Result<ErrorDetails, tonic::Status> {
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(
            value
                .strip_suffix(b"==")
                .or_else(|| value.strip_suffix(b"="))
                .unwrap_or(value),
        )
        .map_err(|e| {
            tonic::Status::internal(format!("grpc-status-details-bin is not base64: {e}"))
        })?;
    let status = tonic::Status::with_details(Code::Unknown, "", bytes.into());
    Ok(status.get_error_details())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::StatusProfile;

    #[test]
    fn the_recommended_policy_retries_exactly_the_safe_answers() {
        for r in GRPC_STATUS_TABLE {
            assert_eq!(
                RETRYABLE_STATUS_CODES.contains(&r.grpc),
                r.retryable,
                "{}",
                r.code
            );
        }
        let mut codes: Vec<_> = GRPC_STATUS_TABLE.iter().map(|r| r.code.as_str()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), GRPC_STATUS_TABLE.len(), "a code listed twice");
        // A code outside the table that is final never maps to a status A6 retries, whatever
        // its HTTP status (409 would be ABORTED, 503 UNAVAILABLE).
        for http in [409, 503, 400, 500] {
            let c = grpc_code_of("some_layer_code", http, false);
            assert!(!RETRYABLE_STATUS_CODES.contains(&c), "{http} -> {c:?}");
        }
        assert_eq!(
            grpc_code_of("some_layer_code", 409, false),
            Code::FailedPrecondition
        );
        assert_eq!(grpc_code_of("some_layer_code", 404, false), Code::NotFound);
        assert_eq!(
            grpc_code_of("some_layer_code", 409, true),
            Code::Unavailable
        );
        // And the table agrees with the core's own view of what is retryable.
        for code in ErrorCode::ALL {
            let row = GRPC_STATUS_TABLE
                .iter()
                .find(|r| r.code == code)
                .unwrap_or_else(|| panic!("{code} is missing from the table"));
            assert_eq!(row.retryable, code.retryable(), "{code}");
        }
    }

    /// The store policy's verdict on every gRPC status a handler can answer: its class, whether
    /// a non-transactional handler's response is stored, whether `Tx::commit` of it commits.
    /// The match has no wildcard arm: a new status code does not build until it is classified.
    fn expected_policy(code: Code) -> (CallEnd, bool, bool) {
        match code {
            Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated => (CallEnd::Answered, true, true),
            Code::ResourceExhausted | Code::Aborted => (CallEnd::TryAgain, false, false),
            Code::Cancelled
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss => (CallEnd::Failed, true, false),
        }
    }

    #[test]
    fn every_grpc_status_has_its_store_policy() {
        let policy = oncely_core::StorePolicy::default();
        let none = HeaderMap::new();
        for (n, code) in ALL_CODES.into_iter().enumerate() {
            assert_eq!(Code::from_i32(i32::try_from(n).unwrap()), code);
            let (class, stored, committed) = expected_policy(code);
            assert_eq!(call_end(code), class, "{code:?}");
            // Read from the trailers and from a trailers-only head alike.
            let trailers = vec![("grpc-status".to_owned(), n.to_string().into_bytes())];
            let mut head = HeaderMap::new();
            head.insert("grpc-status", HeaderValue::from(n));
            for judged in [
                GrpcDialect.effective_status(StatusCode::OK, &none, &trailers),
                GrpcDialect.effective_status(StatusCode::OK, &head, &[]),
            ] {
                assert_eq!(judged, judged_status(code), "{code:?}");
                assert_eq!(policy.stores(judged.as_u16(), false), stored, "{code:?}");
                assert_eq!(policy.keeps_commit(judged.as_u16()), committed, "{code:?}");
                // A status the policy stores is never one a rolled-back transaction keeps.
                assert!(!policy.stores(judged.as_u16(), true), "{code:?}");
            }
        }
        assert_eq!(Code::from_i32(17), Code::Unknown, "a 17th code is unknown");
    }

    #[test]
    fn the_module_docs_have_a_row_for_every_machine_code_and_grpc_status() {
        let rows: Vec<&str> = include_str!("status.rs")
            .lines()
            .filter(|l| l.starts_with("//! | `"))
            .collect();
        for code in ErrorCode::ALL {
            let name = format!("`{}`", code.as_str());
            assert!(rows.iter().any(|r| r.contains(&name)), "{name}");
        }
        // The store policy's table: the first column, by class.
        for code in ALL_CODES {
            let name = format!("`{}`", code_name(code));
            let class = match expected_policy(code).0 {
                CallEnd::Answered => "| answered |",
                CallEnd::TryAgain => "| try again |",
                CallEnd::Failed => "| failed |",
            };
            assert!(
                rows.iter().any(|r| r.contains(class)
                    && r.split(" | ").nth(1).is_some_and(|c| c.contains(&name))),
                "{name} {class}"
            );
        }
    }

    #[test]
    fn problems_render_as_statuses_with_error_info_and_retry_info() {
        let p = Problem::new(ErrorCode::RequestInFlight, StatusProfile::Ietf, "busy")
            .with_retry_after(2);
        let s = status_of(&p);
        assert_eq!(s.code(), Code::Aborted);
        assert_eq!(s.message(), "busy");
        let d = s.get_error_details();
        let info = d.error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "IDEMPOTENCY_REQUEST_IN_FLIGHT");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(info.metadata["code"], "idempotency_request_in_flight");
        assert_eq!(info.metadata["retryable"], "true");
        assert_eq!(info.metadata["httpStatus"], "409");
        assert_eq!(
            d.retry_info().and_then(|r| r.retry_delay),
            Some(Duration::from_secs(2))
        );
        let res = GrpcDialect.render(&p);
        assert_eq!(res.headers()["grpc-status"], "10");
        assert_eq!(res.headers()[RETRY_PUSHBACK_MS], "2000");

        let p = Problem::new(ErrorCode::KeyMismatch, StatusProfile::Stripe, "other");
        let res = GrpcDialect.render(&p);
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["content-type"], "application/grpc");
        assert_eq!(res.headers()["grpc-status"], "9");
        let d = decode_details(res.headers()["grpc-status-details-bin"].as_bytes()).unwrap();
        assert!(d.retry_info().is_none());
        assert!(!res.headers().contains_key(RETRY_PUSHBACK_MS));
        assert_eq!(d.error_info().unwrap().metadata["httpStatus"], "400");
    }

    #[test]
    fn responses_are_judged_by_their_grpc_status() {
        let d = GrpcDialect;
        let mut h = HeaderMap::new();
        assert_eq!(d.effective_status(StatusCode::OK, &h, &[]), StatusCode::OK);
        let t = |code: &str| vec![("grpc-status".to_owned(), code.as_bytes().to_vec())];
        assert_eq!(
            d.effective_status(StatusCode::OK, &h, &t("0")),
            StatusCode::OK
        );
        assert_eq!(
            d.effective_status(StatusCode::OK, &h, &t("10")),
            StatusCode::CONFLICT
        );
        assert_eq!(
            d.effective_status(StatusCode::OK, &h, &t("14")),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            d.effective_status(StatusCode::OK, &h, &t("x")),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        h.insert("grpc-status", HeaderValue::from_static("3"));
        assert_eq!(
            d.effective_status(StatusCode::OK, &h, &[]),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            d.effective_status(StatusCode::BAD_GATEWAY, &h, &[]),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(code_of_http_status(409), Code::Aborted);
        assert_eq!(code_of_http_status(503), Code::Unavailable);
        assert_eq!(code_of_http_status(418), Code::FailedPrecondition);
    }
}
