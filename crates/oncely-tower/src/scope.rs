//! [`ScopeExtractor`]: whose key it is, a plug point of the layer with a default
//! ([`ExtensionScope`]).

use http::request::Parts;
use oncely_core::Scope;

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
