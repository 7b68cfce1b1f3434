//! Authentication, a stand-in: `Authorization: Bearer <account>` makes `<account>` the caller
//! and puts it into the request as its idempotency [`Scope`]. A real service puts its own
//! authenticated identity there.

use super::problems::unauthenticated;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use oncely_core::Scope;

/// The credentials of `Authorization: Bearer <token>`: the scheme name is matched
/// case-insensitively (RFC 9110 section 11.1), with one or more spaces before the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_matches(' '))
}

/// The authentication stand-in: `Authorization: Bearer <account>` -> [`Scope`].
pub async fn authenticate(mut req: Request, next: Next) -> Response {
    let account = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .filter(|a| !a.is_empty() && a.len() <= 255 && a.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned);
    match account {
        Some(a) => {
            req.extensions_mut().insert(Scope::new(a));
            next.run(req).await
        }
        None if req.uri().path().starts_with("/v1/") => unauthenticated(),
        None => next.run(req).await,
    }
}
