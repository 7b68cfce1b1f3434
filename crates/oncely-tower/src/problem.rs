//! The layer's error answers: RFC 9457 `application/problem+json` bodies built from
//! [`oncely_core::Problem`], with the status of the policy's
//! [`StatusProfile`](oncely_core::StatusProfile).
//!
//! ```
//! use oncely_core::{ErrorCode, Problem, StatusProfile, X_SHOULD_RETRY};
//! use oncely_tower::problem_response;
//!
//! let p = Problem::new(ErrorCode::RequestInFlight, StatusProfile::Ietf, "retry later");
//! let res = problem_response(&p, Some(1));
//! assert_eq!(res.status(), 409);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! assert_eq!(res.headers()["retry-after"], "1");
//! assert_eq!(res.headers()["x-should-retry"], "true");
//! ```

use crate::Body;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use oncely_core::problem::PROBLEM_JSON;
use oncely_core::{ErrorCode, Problem, StatusProfile, X_SHOULD_RETRY};

/// Renders a problem as a response: its status, `Content-Type: application/problem+json`, the
/// JSON body, `x-should-retry: true` or `false` from the problem's `retryable`
/// ([`X_SHOULD_RETRY`](oncely_core::X_SHOULD_RETRY), the Stainless SDK convention), and
/// `Retry-After: <seconds>` when `retry_after_secs` is given.
pub fn problem_response(problem: &Problem, retry_after_secs: Option<u64>) -> Response<Body> {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = Full::new(Bytes::from(problem.to_json()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut res = Response::new(body);
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    res.headers_mut().insert(
        http::HeaderName::from_static(X_SHOULD_RETRY),
        HeaderValue::from_static(if problem.retryable { "true" } else { "false" }),
    );
    if let Some(secs) = retry_after_secs {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    res
}

/// A problem for one of the codes, under a profile, as `dialect` says it. Retryable codes
/// carry `Retry-After`.
pub(crate) fn code_response(
    dialect: &dyn crate::Dialect,
    code: ErrorCode,
    profile: StatusProfile,
    detail: impl Into<String>,
    retry_after_secs: u64,
) -> Response<Body> {
    let retry = code.retryable().then_some(retry_after_secs);
    dialect.render(&Problem::new(code, profile, detail), retry)
}

/// A problem outside the core's codes (the request body could not be read, the layer is
/// missing): `urn:oncely:problem:<code>`, not retryable.
pub(crate) fn custom_problem(status: u16, code: &str, title: &str, detail: &str) -> Problem {
    Problem::other(status, code, title, detail, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn renders_json_body_and_retry_after_only_for_retryable_codes() {
        let res = code_response(
            &crate::ProblemJson,
            ErrorCode::KeyMismatch,
            StatusProfile::Resend,
            "d",
            7,
        );
        assert_eq!(res.status(), 409);
        assert!(res.headers().get(RETRY_AFTER).is_none());
        assert_eq!(res.headers()[X_SHOULD_RETRY], "false");
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["code"], "idempotency_key_mismatch");
        assert_eq!(v["status"], 409);
        assert_eq!(v["retryable"], false);

        let res = code_response(
            &crate::ProblemJson,
            ErrorCode::StoreUnavailable,
            StatusProfile::Ietf,
            "d",
            7,
        );
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()[RETRY_AFTER], "7");
        assert_eq!(res.headers()[X_SHOULD_RETRY], "true");
        let p = custom_problem(400, "x", "X", "d");
        assert_eq!(
            problem_response(&p, None).headers()[X_SHOULD_RETRY],
            "false"
        );
    }
}
