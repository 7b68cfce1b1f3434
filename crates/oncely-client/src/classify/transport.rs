//! Classification of an attempt that got no response: a transport failure, by its phase
//! (before or after the request may have been sent) and whether the request is safe to repeat.

use super::facts::{Phase, TransportFailure};
use super::reason::{RetryReason, Verdict};

/// Classifies an attempt that got no response, for any transport (the reqwest middleware and
/// the gRPC layer share it); `safe` says whether repeating the request cannot cause a second
/// side effect (an idempotent method or gRPC method, or an idempotency key).
///
/// A failure before sending is retried whatever the request; a timeout or a reset after
/// sending only when `safe`, otherwise the outcome is unknown (case C1); any other failure is
/// a bug and not retried.
pub fn classify_transport(safe: bool, phase: Phase, failure: TransportFailure) -> Verdict {
    match (phase, failure) {
        (_, TransportFailure::Other) => Verdict::NotRetryable,
        (Phase::BeforeSend, _) => Verdict::Retry(RetryReason::ConnectFailed),
        (Phase::AfterSend, TransportFailure::Connect) => Verdict::Retry(RetryReason::ConnectFailed),
        (Phase::AfterSend, TransportFailure::Timeout) if safe => {
            Verdict::Retry(RetryReason::TimedOut)
        }
        (Phase::AfterSend, TransportFailure::Reset) if safe => {
            Verdict::Retry(RetryReason::ConnectionReset)
        }
        (Phase::AfterSend, _) => Verdict::OutcomeUnknown,
    }
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::super::facts::examples::{GET, KEYED_POST, POST};
    use super::super::facts::{Outcome, RequestFacts};
    use super::super::status::classify;
    use super::*;

    #[test]
    fn transport_phases() {
        let t = |phase, failure| Outcome::Transport { phase, failure };
        assert_eq!(
            classify(
                &POST,
                &t(Phase::BeforeSend, TransportFailure::Connect),
                false
            ),
            Verdict::Retry(RetryReason::ConnectFailed)
        );
        assert_eq!(
            classify(
                &POST,
                &t(Phase::AfterSend, TransportFailure::Timeout),
                false
            ),
            Verdict::OutcomeUnknown
        );
        assert_eq!(
            classify(&POST, &t(Phase::AfterSend, TransportFailure::Reset), false),
            Verdict::OutcomeUnknown
        );
        assert_eq!(
            classify(
                &KEYED_POST,
                &t(Phase::AfterSend, TransportFailure::Timeout),
                false
            ),
            Verdict::Retry(RetryReason::TimedOut)
        );
        for m in [
            Method::GET,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::OPTIONS,
        ] {
            let req = RequestFacts {
                method: &m,
                has_key: false,
            };
            assert_eq!(
                classify(&req, &t(Phase::AfterSend, TransportFailure::Reset), false),
                Verdict::Retry(RetryReason::ConnectionReset)
            );
        }
        let patch = RequestFacts {
            method: &Method::PATCH,
            has_key: false,
        };
        assert_eq!(
            classify(
                &patch,
                &t(Phase::AfterSend, TransportFailure::Timeout),
                false
            ),
            Verdict::OutcomeUnknown
        );
        assert_eq!(
            classify(&GET, &t(Phase::BeforeSend, TransportFailure::Other), false),
            Verdict::NotRetryable
        );
    }
}
