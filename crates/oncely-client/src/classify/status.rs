//! Classification of an HTTP response: the server's explicit word first, then the allowlist of
//! statuses (see the [module docs](super) for both tables).

use http::StatusCode;

use super::facts::{IN_FLIGHT_CODE, Outcome, RequestFacts, ResponseFacts};
use super::reason::{RetryReason, Verdict};
use super::signals::{ResponseClassifier, explicit_word};
use super::transport::classify_transport;

/// Classifies one attempt's outcome; `retry_500` enables retrying `500` for requests that are
/// safe to repeat. The same as [`classify_with`] without a caller hook.
pub fn classify(request: &RequestFacts<'_>, outcome: &Outcome<'_>, retry_500: bool) -> Verdict {
    classify_with(request, outcome, retry_500, None)
}

/// Classifies one attempt's outcome with the caller's hook (see the [module docs](super) for the
/// order of the signals).
pub fn classify_with(
    request: &RequestFacts<'_>,
    outcome: &Outcome<'_>,
    retry_500: bool,
    caller: Option<&ResponseClassifier>,
) -> Verdict {
    let safe = request.safe_to_repeat();
    match *outcome {
        Outcome::Transport { phase, failure } => classify_transport(safe, phase, failure),
        Outcome::Response(response) => {
            let allowed = allowlist(&response, safe, retry_500);
            if response.status.as_u16() < 400 {
                return allowed;
            }
            match explicit_word(&response, caller) {
                Some((_, false)) => Verdict::Done,
                Some((signal, true)) => match allowed {
                    Verdict::Retry(_) => allowed,
                    _ if safe => Verdict::Retry(RetryReason::ServerAsked {
                        status: response.status,
                        signal,
                    }),
                    _ => allowed,
                },
                None => allowed,
            }
        }
    }
}

/// The allowlist alone (no explicit word).
fn allowlist(response: &ResponseFacts<'_>, safe: bool, retry_500: bool) -> Verdict {
    let status = response.status;
    match status {
        StatusCode::TOO_MANY_REQUESTS => Verdict::Retry(RetryReason::Throttled),
        StatusCode::REQUEST_TIMEOUT => Verdict::Retry(RetryReason::RequestTimeout),
        StatusCode::CONFLICT
            if response.problem.and_then(|p| p.code.as_deref()) == Some(IN_FLIGHT_CODE) =>
        {
            Verdict::Retry(RetryReason::InFlight)
        }
        StatusCode::SERVICE_UNAVAILABLE => Verdict::Retry(RetryReason::ServerError(status)),
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT if safe => {
            Verdict::Retry(RetryReason::ServerError(status))
        }
        StatusCode::INTERNAL_SERVER_ERROR if retry_500 && safe => {
            Verdict::Retry(RetryReason::ServerError(status))
        }
        _ => Verdict::Done,
    }
}

/// Whether a response's problem+json body is read to classify it: every error response
/// (status 400 or above), since any of them may carry `retryable` or the in-flight `code`.
/// The middleware reads it only when it is JSON and at most 64 KiB.
pub fn needs_problem_body(status: StatusCode) -> bool {
    status.as_u16() >= 400
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::super::facts::ProblemFacts;
    use super::super::facts::examples::{GET, KEYED_POST, POST, headers};
    use super::super::signals::Signal;
    use super::*;
    use crate::budget::RetryCost;

    static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

    fn resp(status: u16, problem: Option<&ProblemFacts>) -> Outcome<'_> {
        Outcome::Response(ResponseFacts::new(
            StatusCode::from_u16(status).unwrap(),
            &NO_HEADERS,
            problem,
        ))
    }

    #[test]
    fn client_errors_are_never_retried() {
        for status in [400, 401, 403, 404, 405, 409, 410, 412, 413, 422] {
            for req in [POST, KEYED_POST, GET] {
                assert_eq!(classify(&req, &resp(status, None), true), Verdict::Done);
            }
        }
    }

    #[test]
    fn throttles_and_unavailable_are_retried_for_every_method() {
        for req in [POST, KEYED_POST, GET] {
            assert_eq!(
                classify(&req, &resp(429, None), false),
                Verdict::Retry(RetryReason::Throttled)
            );
            assert_eq!(
                classify(&req, &resp(408, None), false),
                Verdict::Retry(RetryReason::RequestTimeout)
            );
            assert!(matches!(
                classify(&req, &resp(503, None), false),
                Verdict::Retry(RetryReason::ServerError(_))
            ));
        }
    }

    #[test]
    fn gateway_errors_need_a_safe_request() {
        assert_eq!(classify(&POST, &resp(502, None), false), Verdict::Done);
        assert_eq!(classify(&POST, &resp(504, None), false), Verdict::Done);
        assert!(matches!(
            classify(&KEYED_POST, &resp(504, None), false),
            Verdict::Retry(_)
        ));
        assert!(matches!(
            classify(&GET, &resp(502, None), false),
            Verdict::Retry(_)
        ));
    }

    #[test]
    fn five_hundred_is_off_by_default() {
        assert_eq!(classify(&GET, &resp(500, None), false), Verdict::Done);
        assert!(matches!(
            classify(&GET, &resp(500, None), true),
            Verdict::Retry(_)
        ));
        assert_eq!(classify(&POST, &resp(500, None), true), Verdict::Done);
    }

    #[test]
    fn problem_json_codes() {
        let in_flight = ProblemFacts {
            code: Some(IN_FLIGHT_CODE.into()),
            retryable: Some(true),
        };
        assert_eq!(
            classify(&KEYED_POST, &resp(409, Some(&in_flight)), false),
            Verdict::Retry(RetryReason::InFlight)
        );
        let mismatch = ProblemFacts {
            code: Some("idempotency_key_mismatch".into()),
            retryable: Some(false),
        };
        assert_eq!(
            classify(&KEYED_POST, &resp(422, Some(&mismatch)), false),
            Verdict::Done
        );
        assert_eq!(
            classify(&KEYED_POST, &resp(409, Some(&mismatch)), false),
            Verdict::Done
        );
        let no = ProblemFacts {
            code: None,
            retryable: Some(false),
        };
        assert_eq!(classify(&GET, &resp(503, Some(&no)), false), Verdict::Done);
        assert_eq!(classify(&GET, &resp(429, Some(&no)), false), Verdict::Done);
    }

    fn with_headers<'a>(
        status: u16,
        headers: &'a HeaderMap,
        problem: Option<&'a ProblemFacts>,
    ) -> Outcome<'a> {
        Outcome::Response(ResponseFacts::new(
            StatusCode::from_u16(status).unwrap(),
            headers,
            problem,
        ))
    }

    #[test]
    fn explicit_word_precedence_and_limits() {
        let stripe_no = headers(&[("stripe-should-retry", "false")]);
        assert_eq!(
            classify(&GET, &with_headers(503, &stripe_no, None), false),
            Verdict::Done
        );
        let both = headers(&[("x-should-retry", "true"), ("stripe-should-retry", "false")]);
        assert!(matches!(
            classify(&GET, &with_headers(503, &both, None), false),
            Verdict::Retry(RetryReason::ServerError(_))
        ));
        // `true` on a status the allowlist returns: retried only when safe to repeat.
        let yes = headers(&[("x-should-retry", "true")]);
        assert_eq!(
            classify(&KEYED_POST, &with_headers(400, &yes, None), false),
            Verdict::Retry(RetryReason::ServerAsked {
                status: StatusCode::BAD_REQUEST,
                signal: Signal::XShouldRetry
            })
        );
        assert_eq!(
            classify(&POST, &with_headers(400, &yes, None), false),
            Verdict::Done
        );
        assert_eq!(
            classify(&POST, &with_headers(500, &yes, None), false),
            Verdict::Done
        );
        // Success and redirects are never turned into retries.
        assert_eq!(
            classify(&GET, &with_headers(200, &yes, None), false),
            Verdict::Done
        );
        assert_eq!(
            classify(&GET, &with_headers(304, &yes, None), false),
            Verdict::Done
        );
        // The problem's `retryable` comes first.
        let no = ProblemFacts {
            code: None,
            retryable: Some(false),
        };
        assert_eq!(
            classify(&GET, &with_headers(503, &yes, Some(&no)), false),
            Verdict::Done
        );
        // The caller's hook comes after the server's headers, before the allowlist.
        let hook =
            ResponseClassifier::new(|r| (r.status == StatusCode::IM_A_TEAPOT).then_some(true));
        let none = HeaderMap::new();
        assert_eq!(
            classify_with(&GET, &with_headers(418, &none, None), false, Some(&hook)),
            Verdict::Retry(RetryReason::ServerAsked {
                status: StatusCode::IM_A_TEAPOT,
                signal: Signal::Caller
            })
        );
        let refuse = ResponseClassifier::new(|_| Some(false));
        assert!(matches!(
            classify_with(&GET, &with_headers(503, &yes, None), false, Some(&refuse)),
            Verdict::Retry(_)
        ));
        assert_eq!(
            classify_with(&GET, &with_headers(503, &none, None), false, Some(&refuse)),
            Verdict::Done
        );
        assert_eq!(
            RetryReason::ServerAsked {
                status: StatusCode::TOO_MANY_REQUESTS,
                signal: Signal::StripeShouldRetry
            }
            .cost(),
            RetryCost::Throttle
        );
    }
}
