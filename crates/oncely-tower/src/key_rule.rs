//! [`KeyRule`]: which routes take a key, a plug point of the layer with a default
//! ([`DefaultKeyRule`]); whose key it is is the [`ScopeExtractor`](crate::ScopeExtractor)'s
//! (`scope.rs`).
//!
//! ```
//! use http::Method;
//! use oncely_tower::{KeyRequirement, KeyRule, DefaultKeyRule};
//!
//! // The default: POST and PATCH require a key, PUT and DELETE accept one, the rest pass.
//! assert_eq!(DefaultKeyRule.requirement(&Method::POST, "/v1/payments"), KeyRequirement::Required);
//! assert_eq!(DefaultKeyRule.requirement(&Method::GET, "/v1/payments"), KeyRequirement::Ignored);
//!
//! // A closure is a rule too: webhooks are exempt, everything else follows the default.
//! let rule = |method: &Method, path: &str| {
//!     if path.starts_with("/webhooks/") {
//!         KeyRequirement::Ignored
//!     } else {
//!         DefaultKeyRule.requirement(method, path)
//!     }
//! };
//! assert_eq!(rule.requirement(&Method::POST, "/webhooks/stripe"), KeyRequirement::Ignored);
//! ```

use http::Method;

/// Whether a route takes an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRequirement {
    /// A request without a key gets `400 idempotency_key_missing`; nothing runs.
    Required,
    /// A request with a key is made idempotent; one without passes through without a claim.
    Optional,
    /// The layer passes the request through untouched, key or not (safe methods).
    Ignored,
}

/// Declares, per route, whether a key is required, accepted or ignored.
///
/// Any `Fn(&Method, &str) -> KeyRequirement` closure is a rule. The `path` is the request's
/// full path as received (under axum, the path of axum's `OriginalUri`, so a
/// nested router sees its prefix), without the query.
pub trait KeyRule: Send + Sync + 'static {
    /// The requirement for `method` on `path`.
    fn requirement(&self, method: &Method, path: &str) -> KeyRequirement;
}

/// The default rule of the key contract: `POST` and `PATCH` require a key, `PUT` and `DELETE`
/// accept one, every other method passes through untouched.
///
/// Source: DESIGN.md, "The key contract" (after the IETF draft's advice that non-idempotent
/// methods are the ones that need a key; `PUT` and `DELETE` are idempotent by definition,
/// RFC 9110 section 9.2.2, but a key still lets them replay their original response).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultKeyRule;

impl KeyRule for DefaultKeyRule {
    fn requirement(&self, method: &Method, _path: &str) -> KeyRequirement {
        if method == Method::POST || method == Method::PATCH {
            KeyRequirement::Required
        } else if method == Method::PUT || method == Method::DELETE {
            KeyRequirement::Optional
        } else {
            KeyRequirement::Ignored
        }
    }
}

impl<F> KeyRule for F
where
    F: Fn(&Method, &str) -> KeyRequirement + Send + Sync + 'static,
{
    fn requirement(&self, method: &Method, path: &str) -> KeyRequirement {
        self(method, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rule_follows_the_contract() {
        let r = DefaultKeyRule;
        for (m, want) in [
            (Method::POST, KeyRequirement::Required),
            (Method::PATCH, KeyRequirement::Required),
            (Method::PUT, KeyRequirement::Optional),
            (Method::DELETE, KeyRequirement::Optional),
            (Method::GET, KeyRequirement::Ignored),
            (Method::HEAD, KeyRequirement::Ignored),
            (Method::OPTIONS, KeyRequirement::Ignored),
        ] {
            assert_eq!(r.requirement(&m, "/x"), want, "{m}");
        }
    }
}
