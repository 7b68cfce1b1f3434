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
use http::Response;
use http_body_util::{BodyExt, Full};
use oncely_core::{ErrorCode, Problem, StatusProfile};

/// Renders a problem as a response of the layer's body type: [`Problem::to_http_response`]
/// (its status, `Content-Type: application/problem+json`, the JSON body in RFC 9457's member
/// order, `x-should-retry: true` or `false` from the problem's `retryable`
/// ([`X_SHOULD_RETRY`](oncely_core::X_SHOULD_RETRY), the Stainless SDK convention)), with
/// `Retry-After: <seconds>` when `retry_after_secs` (or the problem's own
/// [`retry_after_secs`](Problem::retry_after_secs)) is given.
pub fn problem_response(problem: &Problem, retry_after_secs: Option<u64>) -> Response<Body> {
    let res = match retry_after_secs {
        Some(secs) if problem.retry_after_secs != Some(secs) => {
            let mut p = problem.clone();
            p.retry_after_secs = Some(secs);
            p.to_http_response()
        }
        _ => problem.to_http_response(),
    };
    res.map(|body| {
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync()
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::RETRY_AFTER;
    use oncely_core::X_SHOULD_RETRY;

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
        let p = Problem::from_code(ErrorCode::RequestBodyUnreadable, "d");
        assert_eq!(
            problem_response(&p, None).headers()[X_SHOULD_RETRY],
            "false"
        );
        // The problem's own delay, and the one given, which wins.
        let p = Problem::from_code(ErrorCode::ServerShuttingDown, "d").with_retry_after(4);
        assert_eq!(problem_response(&p, None).headers()[RETRY_AFTER], "4");
        assert_eq!(problem_response(&p, Some(9)).headers()[RETRY_AFTER], "9");
    }
}
