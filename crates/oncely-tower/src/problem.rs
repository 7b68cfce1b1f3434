//! The layer's error answers: RFC 9457 `application/problem+json` bodies built from
//! [`oncely_core::Problem`], with the status of the policy's
//! [`StatusProfile`](oncely_core::StatusProfile).
//!
//! ```
//! use oncely_core::{ErrorCode, Problem, StatusProfile, X_SHOULD_RETRY};
//! use oncely_tower::problem_response;
//!
//! let p = Problem::new(ErrorCode::RequestInFlight, StatusProfile::Ietf, "retry later")
//!     .with_retry_after(1);
//! let res = problem_response(&p);
//! assert_eq!(res.status(), 409);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! assert_eq!(res.headers()["retry-after"], "1");
//! assert_eq!(res.headers()["x-should-retry"], "true");
//! ```

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use oncely_core::Problem;
use oncely_core::response::Body;

/// Renders a problem as a response of the layer's body type: [`Problem::to_http_response`]
/// (its status, `Content-Type: application/problem+json`, the JSON body in RFC 9457's member
/// order, `x-should-retry: true` or `false` from the problem's `retryable`
/// ([`X_SHOULD_RETRY`](oncely_core::X_SHOULD_RETRY), the Stainless SDK convention)), with
/// `Retry-After: <seconds>` when the problem's [`retry_after_secs`](Problem::retry_after_secs)
/// is set (the one channel of the delay: set it with [`Problem::with_retry_after`]).
pub fn problem_response(problem: &Problem) -> Response<Body> {
    problem.to_http_response().map(|body| {
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync()
    })
}
