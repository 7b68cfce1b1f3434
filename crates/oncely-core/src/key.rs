//! The `Idempotency-Key` header value and its scope.
//!
//! The rules come from the IETF draft "The Idempotency-Key HTTP Header Field"
//! (draft-ietf-httpapi-idempotency-key-header): the value is an RFC 8941 structured-field
//! *String*, so the quoted form `"abc"` is accepted and unquoted. Oncely also accepts the bare
//! form (`abc`) that Stripe and most clients send.
//!
//! A valid key is 1 to 255 visible ASCII characters (`0x21..=0x7E`) after unquoting. The key is
//! minted by the client; the server never derives one from the request body.

use std::fmt;
use std::sync::Arc;

/// The largest accepted key length, in characters (bytes: keys are ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// Why a key was rejected. Every variant maps to the `idempotency_key_invalid` problem
/// (except [`KeyError::Missing`], which is `idempotency_key_missing`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No `Idempotency-Key` header was sent.
    #[error("the Idempotency-Key header is missing")]
    Missing,
    /// The header was sent more than once; which value is meant is ambiguous.
    #[error("the Idempotency-Key header was sent {0} times; send it once")]
    Repeated(usize),
    /// The value is empty (or `""`).
    #[error("the Idempotency-Key header is empty")]
    Empty,
    /// The value is longer than [`MAX_KEY_LEN`] characters.
    #[error("the Idempotency-Key is {0} characters long; the limit is 255")]
    TooLong(usize),
    /// A byte outside visible ASCII (`0x21..=0x7E`) was found at this position (0-based).
    #[error("the Idempotency-Key has a character that is not visible ASCII at position {0}")]
    NotVisibleAscii(usize),
    /// A quoted value is not a well-formed RFC 8941 string (unbalanced quote, bad escape).
    #[error("the Idempotency-Key is a malformed quoted string")]
    BadQuoting,
}

/// A validated idempotency key: 1 to 255 visible ASCII characters.
///
/// # Examples
///
/// ```
/// use oncely_core::IdempotencyKey;
/// assert_eq!(IdempotencyKey::parse(b"order-confirm-42").unwrap().as_str(), "order-confirm-42");
/// // The IETF draft's structured-field string form is unquoted.
/// assert_eq!(IdempotencyKey::parse(b"\"abc\"").unwrap().as_str(), "abc");
/// assert!(IdempotencyKey::parse(b"").is_err());
/// ```
// `Arc<str>`: a claimed request's key is copied into its claim, its context, the drain's
// register and the heartbeat, and a clone then costs no allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

impl IdempotencyKey {
    /// Parses one header value.
    ///
    /// # Errors
    ///
    /// [`KeyError::Empty`], [`KeyError::TooLong`], [`KeyError::NotVisibleAscii`] or
    /// [`KeyError::BadQuoting`]. Never panics, whatever the bytes.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        // Optional whitespace around a field value is not part of it (RFC 9110 section 5.5).
        let raw = trim_ows(raw);
        let unquoted;
        let value: &[u8] = if raw.first() == Some(&b'"') {
            unquoted = unquote(raw)?;
            &unquoted
        } else {
            raw
        };
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some(pos) = value.iter().position(|b| !(0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii(pos));
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong(value.len()));
        }
        // All bytes are ASCII, so this cannot fail.
        std::str::from_utf8(value)
            .map(|s| Self(Arc::from(s)))
            .map_err(|_| KeyError::NotVisibleAscii(0))
    }

    /// Parses the key from every value of the header in a request: exactly one is allowed.
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] for none, [`KeyError::Repeated`] for more than one, else as
    /// [`IdempotencyKey::parse`].
    pub fn from_header_values<'a, I>(values: I) -> Result<Self, KeyError>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut iter = values.into_iter();
        let first = iter.next().ok_or(KeyError::Missing)?;
        let rest = iter.count();
        if rest > 0 {
            return Err(KeyError::Repeated(rest + 1));
        }
        // One field line is one key, commas and all: the field is a structured-field String
        // (an Item, never a List), so a bare `a,b` is the key `a,b`, while two quoted keys
        // that an intermediary joined into one line (`"a", "b"`) are not one well-formed
        // String and are refused by `parse` as badly quoted.
        Self::parse(first)
    }

    /// The key as sent (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Builds a key from a string, by the same rules as [`IdempotencyKey::parse`].
    ///
    /// # Errors
    ///
    /// As [`IdempotencyKey::parse`].
    pub fn new(s: &str) -> Result<Self, KeyError> {
        Self::parse(s.as_bytes())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// RFC 8941 section 4.2.5: a String is `DQUOTE *( chr / "\" ( DQUOTE / "\" ) ) DQUOTE`.
fn unquote(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let inner = raw
        .strip_prefix(b"\"")
        .and_then(|r| r.strip_suffix(b"\""))
        .ok_or(KeyError::BadQuoting)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut iter = inner.iter();
    while let Some(&b) = iter.next() {
        match b {
            b'\\' => match iter.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(KeyError::BadQuoting),
            },
            b'"' => return Err(KeyError::BadQuoting),
            _ => out.push(b),
        }
    }
    Ok(out)
}

/// The authenticated caller a key belongs to (an account or tenant).
///
/// Records are unique on `(scope, key)`, never on the key alone, so two tenants that pick the
/// same key never see each other's responses. The scope must come from the server's own
/// authentication, never from a client-supplied field.
// `Arc<str>`, as `IdempotencyKey`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Arc<str>);

impl Scope {
    /// Wraps an authenticated identity (an account or tenant id). Any string is accepted;
    /// stores keep it verbatim.
    pub fn new(s: impl Into<String>) -> Self {
        Self(Arc::from(s.into()))
    }

    /// The scope as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", self.0)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The identity of a record: `(scope, key)`, made with [`RecordKey::new`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RecordKey {
    /// Whose key it is.
    pub scope: Scope,
    /// The client's idempotency key.
    pub key: IdempotencyKey,
}

impl RecordKey {
    /// Pairs a scope and a key.
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self { scope, key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_bare_and_quoted_forms() {
        assert_eq!(IdempotencyKey::parse(b"abc").unwrap().as_str(), "abc");
        assert_eq!(IdempotencyKey::parse(b"\"abc\"").unwrap().as_str(), "abc");
        assert_eq!(
            IdempotencyKey::parse(br#""a\"b\\c""#).unwrap().as_str(),
            r#"a"b\c"#
        );
        assert_eq!(IdempotencyKey::parse(b"  abc\t").unwrap().as_str(), "abc");
    }

    #[test]
    fn a_comma_is_part_of_a_bare_key_and_joined_quoted_keys_are_refused() {
        let one = |v: &[u8]| IdempotencyKey::from_header_values([v]);
        assert_eq!(one(b"a,b").unwrap().as_str(), "a,b");
        assert_eq!(one(b"\"a,b\"").unwrap().as_str(), "a,b");
        assert_eq!(one(br#""a","b""#), Err(KeyError::BadQuoting));
        assert_eq!(one(br#""a", "b""#), Err(KeyError::BadQuoting));
        assert_eq!(one(b"a, b"), Err(KeyError::NotVisibleAscii(2)));
        assert_eq!(
            IdempotencyKey::from_header_values([&b"a"[..], b"b"]),
            Err(KeyError::Repeated(2))
        );
    }

    #[test]
    fn rejects_malformed_keys() {
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse(b"a b"),
            Err(KeyError::NotVisibleAscii(1))
        );
        assert_eq!(
            IdempotencyKey::parse("caf\u{e9}".as_bytes()),
            Err(KeyError::NotVisibleAscii(3))
        );
        assert_eq!(IdempotencyKey::parse(b"\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(
            IdempotencyKey::parse(b"\"a\"b\""),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(
            IdempotencyKey::parse(b"\"a\\xb\""),
            Err(KeyError::BadQuoting)
        );
        let long = vec![b'k'; 256];
        assert_eq!(IdempotencyKey::parse(&long), Err(KeyError::TooLong(256)));
        let max = vec![b'k'; 255];
        assert_eq!(IdempotencyKey::parse(&max).unwrap().as_str().len(), 255);
    }

    #[test]
    fn header_must_appear_exactly_once() {
        assert_eq!(
            IdempotencyKey::from_header_values(Vec::<&[u8]>::new()),
            Err(KeyError::Missing)
        );
        assert_eq!(
            IdempotencyKey::from_header_values([&b"a"[..], &b"a"[..]]),
            Err(KeyError::Repeated(2))
        );
        assert_eq!(
            IdempotencyKey::from_header_values([&b"k1"[..]])
                .unwrap()
                .as_str(),
            "k1"
        );
    }

    proptest! {
        #[test]
        fn parser_never_panics_and_accepts_only_visible_ascii(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(k) = IdempotencyKey::parse(&bytes) {
                prop_assert!(!k.as_str().is_empty());
                prop_assert!(k.as_str().len() <= MAX_KEY_LEN);
                prop_assert!(k.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
            }
        }

        #[test]
        fn every_valid_key_round_trips(s in "[!-~]{1,255}") {
            // A bare value that does not start with a quote is taken verbatim.
            prop_assume!(!s.starts_with('"'));
            let k = IdempotencyKey::parse(s.as_bytes()).unwrap();
            prop_assert_eq!(k.as_str(), s.as_str());
        }
    }
}
