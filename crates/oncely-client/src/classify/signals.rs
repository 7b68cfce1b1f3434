//! The server's explicit word (problem+json `retryable`, `x-should-retry`,
//! `Stripe-Should-Retry`) and the caller's hook, read in that order before the allowlist (see
//! the [module docs](super)).

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};

use super::facts::ResponseFacts;

/// The Stainless convention's header: `x-should-retry: true|false`.
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// Stripe's header: `Stripe-Should-Retry: true|false` (stored lower case, as `http` does).
pub const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

/// Where an explicit "retry" / "do not retry" came from (see the [module docs](super) for the
/// order in which they are read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Signal {
    /// The problem+json `retryable` extension.
    ProblemRetryable,
    /// The `x-should-retry` header (Stainless convention).
    XShouldRetry,
    /// The `Stripe-Should-Retry` header.
    StripeShouldRetry,
    /// The caller's [`ResponseClassifier`].
    Caller,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProblemRetryable => "problem+json retryable",
            Self::XShouldRetry => "x-should-retry",
            Self::StripeShouldRetry => "Stripe-Should-Retry",
            Self::Caller => "the caller's classifier",
        })
    }
}

/// The caller's hook: an extra "retry" (`Some(true)`) / "do not retry" (`Some(false)`) signal
/// read from a response, or `None` for no opinion (the allowlist then decides).
///
/// It is read after the server's own signals (problem+json `retryable`, `x-should-retry`,
/// `Stripe-Should-Retry`) and before the allowlist, only for error responses (status 400 or
/// above), and obeys the same limits: `Some(true)` retries only a request that is safe to
/// repeat, within the attempt limit, the deadline and the budget. Set it for every call with
/// [`crate::OncelyRetry::with_classifier`] or for one with [`crate::CallOptions::with_classifier`].
///
/// ```
/// use oncely_client::classify::ResponseClassifier;
///
/// // An API that says "come back later" with its own header.
/// let hook = ResponseClassifier::new(|r| {
///     r.headers.get("x-acme-retryable").map(|v| v.as_bytes() == b"yes")
/// });
/// # let _ = hook;
/// ```
#[derive(Clone)]
pub struct ResponseClassifier(Arc<ClassifyFn>);

type ClassifyFn = dyn Fn(&ResponseFacts<'_>) -> Option<bool> + Send + Sync;

impl ResponseClassifier {
    /// Wraps a function from a response's facts to `Some(retry?)` or `None` (no opinion).
    pub fn new(f: impl Fn(&ResponseFacts<'_>) -> Option<bool> + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Runs the hook.
    pub fn should_retry(&self, response: &ResponseFacts<'_>) -> Option<bool> {
        (self.0)(response)
    }
}

impl fmt::Debug for ResponseClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseClassifier(..)")
    }
}

/// Reads a `true` / `false` header (ASCII case and surrounding whitespace ignored); anything
/// else, or several values, counts as absent.
pub fn bool_header(headers: &HeaderMap, name: &HeaderName) -> Option<bool> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// The first explicit word present, in the documented order: problem+json `retryable`,
/// `x-should-retry`, `Stripe-Should-Retry`, then the caller's hook.
pub fn explicit_word(
    response: &ResponseFacts<'_>,
    caller: Option<&ResponseClassifier>,
) -> Option<(Signal, bool)> {
    if let Some(r) = response.problem.and_then(|p| p.retryable) {
        return Some((Signal::ProblemRetryable, r));
    }
    if let Some(r) = bool_header(response.headers, &X_SHOULD_RETRY) {
        return Some((Signal::XShouldRetry, r));
    }
    if let Some(r) = bool_header(response.headers, &STRIPE_SHOULD_RETRY) {
        return Some((Signal::StripeShouldRetry, r));
    }
    caller
        .and_then(|c| c.should_retry(response))
        .map(|r| (Signal::Caller, r))
}

#[cfg(test)]
mod tests {
    use super::super::facts::examples::headers;
    use super::*;

    #[test]
    fn bool_headers_accept_only_one_true_or_false() {
        let name = X_SHOULD_RETRY;
        assert_eq!(
            bool_header(&headers(&[("x-should-retry", " True ")]), &name),
            Some(true)
        );
        assert_eq!(
            bool_header(&headers(&[("x-should-retry", "false")]), &name),
            Some(false)
        );
        assert_eq!(
            bool_header(&headers(&[("x-should-retry", "1")]), &name),
            None
        );
        assert_eq!(
            bool_header(
                &headers(&[("x-should-retry", "true"), ("x-should-retry", "false")]),
                &name
            ),
            None
        );
        assert_eq!(bool_header(&HeaderMap::new(), &name), None);
    }
}
