//! [`Dialect`]: how the layer speaks to its callers. The key machine is the same for every
//! protocol carried over HTTP; what differs is how an error answer is said and what the
//! "status" of a finished response is. The default, [`ProblemJson`], is plain HTTP:
//! RFC 9457 `application/problem+json` errors and the HTTP status. The `oncely-grpc` crate's
//! dialect answers gRPC statuses with `google.rpc` details, and judges a response by its
//! `grpc-status` (sent in the headers or in the trailers).
//!
//! ```
//! use http::{HeaderMap, StatusCode};
//! use oncely_core::{ErrorCode, Problem, StatusProfile};
//! use oncely_tower::{Dialect, ProblemJson};
//!
//! let p = Problem::new(ErrorCode::KeyMismatch, StatusProfile::Ietf, "a different request");
//! let res = ProblemJson.render(&p);
//! assert_eq!(res.status(), 422);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! // Plain HTTP: a response is judged by its status alone.
//! assert_eq!(ProblemJson.effective_status(StatusCode::CREATED, &HeaderMap::new(), &[]), StatusCode::CREATED);
//! ```

use crate::problem::problem_response;
use http::{HeaderMap, Response, StatusCode};
use oncely_core::response::Body;
use oncely_core::{ErrorCode, Problem, StatusProfile};

/// How the layer renders its answers and reads its handlers' responses; see the
/// [module docs](self). Set it with
/// [`IdempotencyLayer::with_dialect`](crate::IdempotencyLayer::with_dialect).
pub trait Dialect: Send + Sync + 'static {
    /// The response for one of the layer's own answers (a missing or invalid key, an in-flight
    /// duplicate, a mismatch, an unavailable store, ...): `problem` carries the machine code,
    /// the HTTP status of the policy's profile, the detail, whether a retry may succeed and,
    /// in [`Problem::retry_after_secs`] (the one channel of the delay), the delay in seconds
    /// that plain HTTP sends as `Retry-After` (set on retryable answers only).
    fn render(&self, problem: &Problem) -> Response<Body>;

    /// The HTTP status the store policy judges a handler's response by
    /// ([`StorePolicy::stores`](oncely_core::StorePolicy::stores)): which responses are stored
    /// and replayed, which release the key. `trailers` are the stored trailers once the body
    /// was read, empty before (the layer asks twice: with the head alone, then with the
    /// trailers). Default: `status` itself.
    fn effective_status(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        trailers: &[(String, Vec<u8>)],
    ) -> StatusCode {
        let _ = (headers, trailers);
        status
    }
}

/// The default dialect: RFC 9457 problem details ([`problem_response`])
/// and the HTTP status.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl Dialect for ProblemJson {
    fn render(&self, problem: &Problem) -> Response<Body> {
        problem_response(problem)
    }
}

/// A problem for one of the codes, under a profile, as `dialect` says it. Retryable codes
/// carry `Retry-After` (`retry_after_secs`, in seconds).
pub(crate) fn code_response(
    dialect: &dyn Dialect,
    code: ErrorCode,
    profile: StatusProfile,
    detail: impl Into<String>,
    retry_after_secs: u64,
) -> Response<Body> {
    let p = Problem::new(code, profile, detail);
    let p = if code.retryable() {
        p.with_retry_after(retry_after_secs)
    } else {
        p
    };
    dialect.render(&p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::RETRY_AFTER;
    use http_body_util::BodyExt;
    use oncely_core::X_SHOULD_RETRY;

    #[tokio::test]
    async fn renders_json_body_and_retry_after_only_for_retryable_codes() {
        let res = code_response(
            &ProblemJson,
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
            &ProblemJson,
            ErrorCode::StoreUnavailable,
            StatusProfile::Ietf,
            "d",
            7,
        );
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()[RETRY_AFTER], "7");
        assert_eq!(res.headers()[X_SHOULD_RETRY], "true");
        let p = Problem::from_code(ErrorCode::RequestBodyUnreadable, "d");
        assert_eq!(problem_response(&p).headers()[X_SHOULD_RETRY], "false");
        // The problem's own delay: the one channel of `Retry-After`.
        let p = Problem::from_code(ErrorCode::ServerShuttingDown, "d").with_retry_after(4);
        assert_eq!(problem_response(&p).headers()[RETRY_AFTER], "4");
    }
}
