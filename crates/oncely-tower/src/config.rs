//! The plug points of the layer: which routes take a key ([`KeyRule`]) and whose key it is
//! ([`ScopeExtractor`]), each a small trait with a default.
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
use http::request::Parts;
use oncely_core::Scope;

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

/// Finds the authenticated caller a key belongs to.
///
/// Records are unique on `(scope, key)`, so the scope must come from the server's own
/// authentication (a session, a verified token), never from a client-supplied field. When it
/// returns `None`, the layer answers `401 idempotency_scope_missing` and nothing runs: there is
/// no global default scope, since one would let two tenants' keys collide (docs/DESIGN.md,
/// "Keys shared across tenants").
///
/// Any `Fn(&Parts) -> Option<Scope>` closure is an extractor.
pub trait ScopeExtractor: Send + Sync + 'static {
    /// The caller's scope, or `None` when the request is not authenticated.
    fn scope(&self, parts: &Parts) -> Option<Scope>;
}

/// The default extractor: reads the [`Scope`] that an authentication middleware (running
/// before this layer) inserted into the request extensions.
///
/// ```
/// use oncely_core::Scope;
/// use oncely_tower::{ExtensionScope, ScopeExtractor};
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Scope::new("acct_1"));
/// let (parts, ()) = req.into_parts();
/// assert_eq!(ExtensionScope.scope(&parts), Some(Scope::new("acct_1")));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtensionScope;

impl ScopeExtractor for ExtensionScope {
    fn scope(&self, parts: &Parts) -> Option<Scope> {
        parts.extensions.get::<Scope>().cloned()
    }
}

impl<F> ScopeExtractor for F
where
    F: Fn(&Parts) -> Option<Scope> + Send + Sync + 'static,
{
    fn scope(&self, parts: &Parts) -> Option<Scope> {
        self(parts)
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

    #[test]
    fn closures_are_extractors() {
        let e = |p: &Parts| p.headers.get("x-tenant").map(|_| Scope::new("t"));
        let (parts, ()) = http::Request::builder()
            .header("x-tenant", "1")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(e.scope(&parts), Some(Scope::new("t")));
    }
}
