//! Idempotency keys: minted once per logical call, reused on every attempt.
//!
//! The `Idempotency-Key` request header (IETF HTTPAPI draft "The Idempotency-Key HTTP Header
//! Field") lets a server recognise a retried `POST` or `PATCH` and run its side effects once.
//! It only works if every attempt of one logical operation carries **the same** key.
//!
//! # Which key to use, best first
//!
//! 1. **Event-derived**: a key built from the business event the call performs, such as
//!    `order-confirm-{order_id}`. It survives a process restart, a queue redelivery, a user's
//!    double click: every path that performs the same event sends the same key. Recommended.
//! 2. **Request-scoped**: a key minted once when your own inbound request or job starts and
//!    passed down to this call. It survives retries inside that request, not a redelivery of it.
//! 3. **Random, reused**: what this crate does for you when you set nothing: a UUID v4 minted
//!    once per logical call (one `send()`), reused on every attempt of that call. It covers the
//!    retries this crate makes, nothing outside them.
//!
//! **Anti-pattern: a fresh key per attempt.** It looks idempotent and is not: the server sees
//! each retry as a brand-new request, and a retried payment is charged twice (case C2).
//!
//! Pass your own key by setting the header yourself, or with [`IdempotencyKeyExt`]:
//!
//! ```no_run
//! use oncely_client::key::IdempotencyKeyExt;
//! # async fn run(client: reqwest_middleware::ClientWithMiddleware, order_id: u64) -> Result<(), reqwest_middleware::Error> {
//! let response = client
//!     .post("http://127.0.0.1:8080/orders/confirm")
//!     .idempotency_key(format!("order-confirm-{order_id}"))
//!     .send()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Keys follow the Oncely key contract: 1 to 255 visible ASCII characters, the header sent
//! once (the IETF draft's structured-field string form `"abc"` is accepted, as the server
//! accepts it). The middleware checks a caller's key with the server's own parser
//! ([`oncely_core::IdempotencyKey`]) before sending anything; a bad key ends the call with
//! [`crate::StopReason::InvalidIdempotencyKey`] and nothing is sent.

use std::fmt;

use http::{HeaderMap, HeaderName, Method};

pub use oncely_core::{IdempotencyKey, KeyError};

/// The `Idempotency-Key` header name (lower case, as `http` stores header names).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Makes a new idempotency key for a logical call that has none.
///
/// Called once per logical call, never per attempt. The default is [`UuidV4Keys`].
pub trait MakeIdempotencyKey: Send + Sync + fmt::Debug + 'static {
    /// Returns a fresh key: 1 to 255 visible ASCII characters.
    fn make_key(&self) -> String;
}

/// The default key maker: a random UUID v4 in hyphenated lower-case form (36 characters).
#[derive(Clone, Copy, Debug, Default)]
pub struct UuidV4Keys;

impl MakeIdempotencyKey for UuidV4Keys {
    fn make_key(&self) -> String {
        uuid::Uuid::new_v4().hyphenated().to_string()
    }
}

/// Whether a method gets a key minted when the caller did not set one: `POST` and `PATCH`, the
/// methods RFC 9110 does not define as idempotent (section 9.2.2).
pub fn needs_key(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PATCH
}

/// Whether a key is a valid `Idempotency-Key` value by the server's rules: 1 to 255 visible
/// ASCII characters ([`IdempotencyKey::parse`]).
pub fn is_valid_key(key: &str) -> bool {
    IdempotencyKey::parse(key.as_bytes()).is_ok()
}

/// Checks the `Idempotency-Key` of a request, if it has one, with the server's rules.
///
/// # Errors
///
/// The [`KeyError`] the server would answer with (`idempotency_key_invalid`): empty, too long,
/// not visible ASCII, badly quoted, or the header repeated. A caller's key with leading or
/// trailing spaces or tabs is refused too ([`KeyError::NotVisibleAscii`] at that position):
/// the server drops them (they are not part of a header value, RFC 9110 section 5.5), so it
/// would store another key than the one the caller keeps to retry with later; every Oncely SDK
/// refuses such a key before sending.
pub fn check_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    if !headers.contains_key(IDEMPOTENCY_KEY) {
        return Ok(None);
    }
    for value in headers.get_all(IDEMPOTENCY_KEY) {
        let bytes = value.as_bytes();
        let blank = |b: &u8| *b == b' ' || *b == b'\t';
        if bytes.first().is_some_and(blank) {
            return Err(KeyError::NotVisibleAscii(0));
        }
        if bytes.last().is_some_and(blank) {
            return Err(KeyError::NotVisibleAscii(bytes.len() - 1));
        }
    }
    IdempotencyKey::from_header_values(
        headers
            .get_all(IDEMPOTENCY_KEY)
            .iter()
            .map(|v| v.as_bytes()),
    )
    .map(Some)
}

/// Sets a caller-chosen idempotency key on a request builder.
///
/// The key is used verbatim on every attempt; the middleware mints nothing for a request that
/// carries one.
pub trait IdempotencyKeyExt: Sized {
    /// Sets the `Idempotency-Key` header. Prefer an event-derived key such as
    /// `order-confirm-{order_id}` (see the [module docs](self)).
    fn idempotency_key(self, key: impl AsRef<str>) -> Self;
}

impl IdempotencyKeyExt for reqwest_middleware::RequestBuilder {
    fn idempotency_key(self, key: impl AsRef<str>) -> Self {
        self.header(IDEMPOTENCY_KEY, key.as_ref())
    }
}

impl IdempotencyKeyExt for reqwest::RequestBuilder {
    fn idempotency_key(self, key: impl AsRef<str>) -> Self {
        self.header(IDEMPOTENCY_KEY, key.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_keys_are_valid_and_distinct() {
        let a = UuidV4Keys.make_key();
        let b = UuidV4Keys.make_key();
        assert!(is_valid_key(&a));
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
    }

    #[test]
    fn a_key_with_surrounding_whitespace_is_refused() {
        for (value, pos) in [("abc ", 3), (" abc", 0), ("abc\t", 3)] {
            let mut headers = HeaderMap::new();
            headers.insert(IDEMPOTENCY_KEY, http::HeaderValue::from_static(value));
            assert_eq!(
                check_key(&headers),
                Err(KeyError::NotVisibleAscii(pos)),
                "{value:?}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, http::HeaderValue::from_static("abc"));
        assert!(check_key(&headers).unwrap().is_some());
    }

    #[test]
    fn only_post_and_patch_need_keys() {
        assert!(needs_key(&Method::POST));
        assert!(needs_key(&Method::PATCH));
        for m in [
            Method::GET,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::OPTIONS,
        ] {
            assert!(!needs_key(&m));
        }
    }

    #[test]
    fn key_validity() {
        assert!(is_valid_key("order-confirm-42"));
        assert!(!is_valid_key(""));
        assert!(!is_valid_key("has space"));
        assert!(!is_valid_key(&"a".repeat(256)));
        assert!(is_valid_key(&"a".repeat(255)));
    }
}
