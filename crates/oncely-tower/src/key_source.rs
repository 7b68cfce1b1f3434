//! [`KeySource`]: where a route's idempotency key is read from.
//!
//! Most APIs take the client-minted key from the `Idempotency-Key` header (the default). A
//! webhook receiver gets its key from the sender instead, as the event's id: the Standard
//! Webhooks `webhook-id` header (Svix, Resend, Clerk and others), GitHub's `X-GitHub-Delivery`
//! header, or a member of the JSON body such as Stripe's event `id`. Whatever the source, the
//! key follows the same rules (1 to 255 visible ASCII characters, sent once), is scoped by the
//! authenticated caller (for a webhook, the sender whose signature verified), and the
//! fingerprint covers the same parts of the request.
//!
//! ```
//! use oncely_core::MemoryStore;
//! use oncely_tower::{IdempotencyLayer, KeySource};
//! use std::sync::Arc;
//!
//! let api = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
//! assert_eq!(api.key_source(), &KeySource::default());
//!
//! // One layer per kind of route: clones share the store, metrics and graceful shutdown.
//! let standard_webhooks = api.clone().with_key_source(KeySource::header("webhook-id").unwrap());
//! let github = api.clone().with_key_source(KeySource::header("X-GitHub-Delivery").unwrap());
//! let stripe = api.clone().with_key_source(KeySource::json_pointer("/id").unwrap());
//! assert_eq!(stripe.key_source().to_string(), "the JSON body member at /id");
//! # let _ = (standard_webhooks, github);
//! ```

use http::HeaderName;
use oncely_core::{IdempotencyKey, KeyError};
use std::fmt;

/// The request header carrying the key: `Idempotency-Key` (IETF
/// draft-ietf-httpapi-idempotency-key-header), lower case.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Where the layer reads the idempotency key of the requests it handles. Default: the
/// `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header).
///
/// Every source applies the key rules of [`IdempotencyKey::parse`]: 1 to 255 visible ASCII
/// characters, the structured-field quoted form unquoted; a header must not be repeated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A request header, sent once (never repeated): `Idempotency-Key` (the default), `webhook-id`
    /// (Standard Webhooks), `X-GitHub-Delivery` (GitHub) ...
    Header(HeaderName),
    /// A string member of the JSON request body named by an RFC 6901 JSON Pointer, such as
    /// `/id` (Stripe's event id). The body is read (up to `Policy::max_request_bytes`) before
    /// the key, whatever its media type; a body that is not JSON, or not I-JSON (RFC 7493: a
    /// repeated member name could name two keys), is refused before any claim.
    JsonPointer(String),
}

impl Default for KeySource {
    fn default() -> Self {
        Self::Header(HeaderName::from_static(IDEMPOTENCY_KEY))
    }
}

/// A [`KeySource`] that cannot be built: a header name that is not a valid HTTP field name, or
/// a JSON Pointer that does not start with `/`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid key source {0:?}: expected an HTTP header name or a JSON Pointer such as /id")]
pub struct InvalidKeySource(pub String);

impl KeySource {
    /// The header `name` (any case; HTTP field names are case-insensitive).
    ///
    /// # Errors
    ///
    /// [`InvalidKeySource`] when `name` is not a valid header name.
    pub fn header(name: &str) -> Result<Self, InvalidKeySource> {
        HeaderName::from_bytes(name.as_bytes())
            .map(Self::Header)
            .map_err(|_| InvalidKeySource(name.to_owned()))
    }

    /// The body member at the RFC 6901 JSON Pointer `pointer` (`/id`, `/data/object/id`).
    ///
    /// # Errors
    ///
    /// [`InvalidKeySource`] when `pointer` does not start with `/` (the empty pointer names the
    /// whole body, which is never a key).
    pub fn json_pointer(pointer: &str) -> Result<Self, InvalidKeySource> {
        if pointer.starts_with('/') {
            Ok(Self::JsonPointer(pointer.to_owned()))
        } else {
            Err(InvalidKeySource(pointer.to_owned()))
        }
    }

    /// The key of a request whose headers are `headers`, for a header source; `None` for a
    /// body source.
    pub(crate) fn key_in_headers(
        &self,
        headers: &http::HeaderMap,
    ) -> Option<Result<IdempotencyKey, KeyError>> {
        match self {
            Self::Header(name) => Some(IdempotencyKey::from_header_values(
                headers
                    .get_all(name)
                    .iter()
                    .map(http::HeaderValue::as_bytes),
            )),
            Self::JsonPointer(_) => None,
        }
    }

    /// The key in a JSON `body`, for a body source.
    pub(crate) fn key_in_body(&self, body: &[u8]) -> Result<IdempotencyKey, BodyKeyError> {
        let Self::JsonPointer(pointer) = self else {
            return Err(BodyKeyError::Key(KeyError::Missing));
        };
        // I-JSON first: serde_json keeps the last of two members with the same name, another
        // parser the first, and the two would read two different keys.
        oncely_core::jcs::is_canonical(body).map_err(|e| BodyKeyError::NotIJson(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| BodyKeyError::NotIJson(e.to_string()))?;
        match value.pointer(pointer) {
            None | Some(serde_json::Value::Null) => Err(BodyKeyError::Key(KeyError::Missing)),
            Some(serde_json::Value::String(s)) => IdempotencyKey::new(s).map_err(BodyKeyError::Key),
            Some(other) => Err(BodyKeyError::NotAString(json_kind(other))),
        }
    }

    /// What a client is told when the key is missing or invalid: the source, then the rule.
    pub(crate) fn explain(&self, e: &KeyError) -> String {
        match e {
            KeyError::Missing => format!("{self} is missing"),
            KeyError::Repeated(n) => format!("{self} was sent {n} times; send it once"),
            KeyError::Empty => format!("the key in {self} is empty"),
            KeyError::TooLong(n) => {
                format!("the key in {self} is {n} characters long; the limit is 255")
            }
            KeyError::NotVisibleAscii(p) => {
                format!(
                    "the key in {self} has a character that is not visible ASCII at position {p}"
                )
            }
            KeyError::BadQuoting => format!("the key in {self} is a malformed quoted string"),
            other => format!("the key in {self} is invalid: {other}"),
        }
    }
}

/// Why a key could not be read from a body.
#[derive(Debug)]
pub(crate) enum BodyKeyError {
    /// The body is not JSON, or not I-JSON.
    NotIJson(String),
    /// The member is there but is not a string.
    NotAString(&'static str),
    /// The member is absent (`Missing`), or a string that is not a valid key.
    Key(KeyError),
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl fmt::Display for KeySource {
    /// `the Idempotency-Key header`, `the webhook-id header`, `the JSON body member at /id`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(h) if h == IDEMPOTENCY_KEY => f.write_str("the Idempotency-Key header"),
            Self::Header(h) => write!(f, "the {h} header"),
            Self::JsonPointer(p) => write!(f, "the JSON body member at {p}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_built_and_named() {
        assert_eq!(
            KeySource::default().to_string(),
            "the Idempotency-Key header"
        );
        let gh = KeySource::header("X-GitHub-Delivery").unwrap();
        assert_eq!(gh.to_string(), "the x-github-delivery header");
        assert!(KeySource::header("bad header").is_err());
        assert!(KeySource::json_pointer("id").is_err());
        assert!(KeySource::json_pointer("").is_err());
        assert_eq!(
            KeySource::json_pointer("/data/id").unwrap(),
            KeySource::JsonPointer("/data/id".into())
        );
    }

    #[test]
    fn a_header_source_reads_its_header_once() {
        let src = KeySource::header("webhook-id").unwrap();
        let mut h = http::HeaderMap::new();
        assert_eq!(src.key_in_headers(&h), Some(Err(KeyError::Missing)));
        h.append("webhook-id", "msg_1".parse().unwrap());
        assert_eq!(src.key_in_headers(&h).unwrap().unwrap().as_str(), "msg_1");
        h.append("webhook-id", "msg_2".parse().unwrap());
        assert_eq!(src.key_in_headers(&h), Some(Err(KeyError::Repeated(2))));
        // The default header is not read by another source.
        h.append("idempotency-key", "k".parse().unwrap());
        assert_eq!(
            KeySource::json_pointer("/id").unwrap().key_in_headers(&h),
            None
        );
    }

    #[test]
    fn a_pointer_source_reads_a_string_member_by_the_key_rules() {
        let src = KeySource::json_pointer("/data/id").unwrap();
        let key = src
            .key_in_body(br#"{"data":{"id":"evt_1"},"type":"x"}"#)
            .unwrap();
        assert_eq!(key.as_str(), "evt_1");
        assert!(matches!(
            src.key_in_body(br#"{"data":{}}"#),
            Err(BodyKeyError::Key(KeyError::Missing))
        ));
        assert!(matches!(
            src.key_in_body(br#"{"data":{"id":null}}"#),
            Err(BodyKeyError::Key(KeyError::Missing))
        ));
        assert!(matches!(
            src.key_in_body(br#"{"data":{"id":42}}"#),
            Err(BodyKeyError::NotAString("a number"))
        ));
        assert!(matches!(
            src.key_in_body(br#"{"data":{"id":""}}"#),
            Err(BodyKeyError::Key(KeyError::Empty))
        ));
        let long = format!(r#"{{"data":{{"id":"{}"}}}}"#, "a".repeat(256));
        assert!(matches!(
            src.key_in_body(long.as_bytes()),
            Err(BodyKeyError::Key(KeyError::TooLong(256)))
        ));
        assert!(matches!(
            src.key_in_body(br#"{"data":{"id":"a b"}}"#),
            Err(BodyKeyError::Key(KeyError::NotVisibleAscii(1)))
        ));
        assert!(matches!(
            src.key_in_body(b"id=1"),
            Err(BodyKeyError::NotIJson(_))
        ));
        // Two members named id: which one is the key depends on the parser, so neither is.
        assert!(matches!(
            src.key_in_body(br#"{"data":{"id":"a","id":"b"}}"#),
            Err(BodyKeyError::NotIJson(_))
        ));
    }

    #[test]
    fn explanations_name_the_source() {
        let src = KeySource::header("webhook-id").unwrap();
        assert_eq!(
            src.explain(&KeyError::Repeated(2)),
            "the webhook-id header was sent 2 times; send it once"
        );
        let p = KeySource::json_pointer("/id").unwrap();
        assert_eq!(
            p.explain(&KeyError::TooLong(300)),
            "the key in the JSON body member at /id is 300 characters long; the limit is 255"
        );
    }
}
