//! The request fingerprint: a digest of what a request asks for.
//!
//! A key that comes back with a different fingerprint is a client bug (the key was reused for
//! another operation): the server answers `422 idempotency_key_mismatch` and never replays.
//!
//! # Algorithm, version 1
//!
//! SHA-256 over a length-framed encoding of, in order: a domain tag, the method, the route path,
//! the raw query string (with a presence flag: no query and an empty query differ), the media
//! type essence of `Content-Type` (lower-cased, parameters dropped), how the body was encoded,
//! the body, and the configured extra headers (name and every value). Every part is framed by
//! its length as a big-endian `u64`, so no two different requests encode to the same bytes
//! (`("ab","c")` and `("a","bc")` differ).
//!
//! JSON bodies (`application/json` and any `+json` type) are canonicalized by RFC 8785 (JSON
//! Canonicalization Scheme) first, so key order and whitespace do not cause false mismatches,
//! while array order stays significant (the canonicalizer is [`crate::jcs`]: it streams the
//! canonical bytes into the hash without building a tree). A body that is not valid JSON, or
//! that nests deeper than [`crate::jcs::MAX_DEPTH`] levels, is taken as raw bytes. Other media
//! types are always raw bytes.
//!
//! A JSON body that is not I-JSON (RFC 7493) has no fingerprint: two members with the same name,
//! or a lone surrogate escape (see [`crate::jcs`]). RFC 8785 is defined over I-JSON only, and
//! such a body may be read as two different requests by two parsers
//! (`{"amount":1,"amount":5000}` is 1 for one and 5000 for another).
//! [`Fingerprinter::try_fingerprint`] refuses it with [`FingerprintError::NotIJson`], which the
//! layer answers with `400 idempotency_body_not_canonicalizable` before any claim.
//!
//! Numbers: one that a double carries (exactly the decimal of its nearest double's shortest
//! form, within the range of normal doubles) is hashed in RFC 8785's form, so `1.0` and `1` are
//! one request. Any other number (an integer beyond 2^53 such as a 64-bit id
//! `12345678901234567890`, a decimal with more precision than a double, a value beyond the
//! range of normal doubles) is hashed by its digits as written: two different numbers are
//! never one request, and another spelling of the same such number
//! (`1.2345678901234567890e19`) is another request (a `422` mismatch, never a wrong replay).
//! See [`crate::jcs`], "Numbers".
//!
//! History, within version 1 (no fingerprint of a stored record changed, so the version
//! stayed): numbers of 16 or 17 significant digits that are their double's shortest form
//! (`3.141592653589793`, what JavaScript writes for `Math.PI`) were refused until December
//! 2026; the numbers no double carries were refused until later that month, and are hashed by
//! their digits now. [`Fingerprinter::try_fingerprint`] had no fingerprint for either kind of
//! body before. The non-refusing [`Fingerprinter::fingerprint`] hashed such a body as raw
//! bytes and now hashes its canonical form: a record stored that way before a change and
//! retried after it, within its replay window, answers `422` (a mismatch, never a wrong
//! replay).
//!
//! Credentials are never part of the fingerprint: the scope carries identity, and a rotated API
//! key must not turn a retry into a mismatch.
//!
//! The version is stored with every record, and two fingerprints are equal only when both
//! their versions and their digests are (see [`Fingerprint::version`]): a record stored under
//! another version than the one the layer computes now gets, inside its replay window or while
//! in flight, a mismatch (`422`), never another request's response.

use crate::jcs::{self, JcsError};
use sha2::{Digest, Sha256};
use std::fmt;

/// The current fingerprint algorithm version.
pub const FINGERPRINT_VERSION: u16 = 1;

/// A versioned SHA-256 request digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    version: u16,
    digest: [u8; 32],
}

impl Fingerprint {
    /// Builds a fingerprint from its stored parts.
    pub const fn from_parts(version: u16, digest: [u8; 32]) -> Self {
        Self { version, digest }
    }

    /// The algorithm version that produced the digest.
    pub const fn version(&self) -> u16 {
        self.version
    }

    /// The 32-byte SHA-256 digest.
    pub const fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// Rebuilds a fingerprint from a stored version and digest.
    ///
    /// # Errors
    ///
    /// [`FingerprintDecodeError`] when the digest is not 32 bytes or the version is negative or
    /// too large.
    pub fn from_stored(version: i64, digest: &[u8]) -> Result<Self, FingerprintDecodeError> {
        let version = u16::try_from(version).map_err(|_| FingerprintDecodeError)?;
        let digest: [u8; 32] = digest.try_into().map_err(|_| FingerprintDecodeError)?;
        Ok(Self { version, digest })
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Fingerprint(v{}:{})",
            self.version,
            hex::encode(self.digest)
        )
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}:{}", self.version, hex::encode(self.digest))
    }
}

/// A stored fingerprint could not be decoded (corrupt record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the stored fingerprint is corrupt")]
pub struct FingerprintDecodeError;

/// What the fingerprint is computed from: the bytes received, before any parsing by the handler.
///
/// Built with [`RequestParts::new`] and the `with_*` methods (more parts may take part in a later
/// version of the fingerprint, so the struct cannot be written as a literal outside this crate):
///
/// ```
/// use oncely_core::fingerprint::{DefaultFingerprinter, Fingerprinter, RequestParts};
///
/// let parts = RequestParts::new("POST", "/v1/orders", br#"{"sku":"A"}"#)
///     .with_query(Some("dry_run=false"))
///     .with_content_type(Some(b"application/json"));
/// assert_eq!(parts.query, Some("dry_run=false"));
/// let _ = DefaultFingerprinter.fingerprint(&parts);
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestParts<'a> {
    /// The method, e.g. `POST`.
    pub method: &'a str,
    /// The route path, e.g. `/v1/payments`.
    pub path: &'a str,
    /// The raw query string without `?`, if the URI had one.
    pub query: Option<&'a str>,
    /// The `Content-Type` header value, if any.
    pub content_type: Option<&'a [u8]>,
    /// The whole request body.
    pub body: &'a [u8],
    /// Extra headers configured to take part, as `(lower-case name, value)`, in configured
    /// order; a name with no value in the request is passed with an empty slice of values.
    pub extra_headers: &'a [(&'a str, Vec<&'a [u8]>)],
}

impl<'a> RequestParts<'a> {
    /// The parts of a request by its `method` (e.g. `POST`), route `path` (e.g. `/v1/payments`)
    /// and whole `body`, with no query, no `Content-Type` and no extra headers until the
    /// `with_*` methods set them.
    #[must_use]
    pub const fn new(method: &'a str, path: &'a str, body: &'a [u8]) -> Self {
        Self {
            method,
            path,
            query: None,
            content_type: None,
            body,
            extra_headers: &[],
        }
    }

    /// Sets the raw query string without `?` (`None`: the URI had none).
    #[must_use]
    pub const fn with_query(mut self, query: Option<&'a str>) -> Self {
        self.query = query;
        self
    }

    /// Sets the `Content-Type` header value (`None`: the request had none).
    #[must_use]
    pub const fn with_content_type(mut self, content_type: Option<&'a [u8]>) -> Self {
        self.content_type = content_type;
        self
    }

    /// Sets the extra headers configured to take part, as `(lower-case name, values)` in
    /// configured order (a name the request lacks comes with no values).
    #[must_use]
    pub const fn with_extra_headers(
        mut self,
        extra_headers: &'a [(&'a str, Vec<&'a [u8]>)],
    ) -> Self {
        self.extra_headers = extra_headers;
        self
    }
}

/// Why a request has no fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The body is JSON (by its media type and its syntax) but not I-JSON (RFC 7493), so it has
    /// no RFC 8785 canonical form: see [`crate::jcs`] for what is refused.
    #[error("the JSON body is not I-JSON (RFC 7493) and has no RFC 8785 canonical form: {0}")]
    NotIJson(JcsError),
}

/// Computes fingerprints. The default is [`DefaultFingerprinter`]; a custom one must be
/// deterministic and must use the same function at claim and at every later comparison.
pub trait Fingerprinter: Send + Sync + 'static {
    /// The fingerprint of one request, for callers that know the request has one (a body that
    /// [`try_fingerprint`](Self::try_fingerprint) refuses gets some deterministic fingerprint
    /// here; for [`DefaultFingerprinter`], that of its raw bytes).
    fn fingerprint(&self, parts: &RequestParts<'_>) -> Fingerprint;

    /// The fingerprint of one request, or why it has none. The layer calls this one, and
    /// answers an error with `400 idempotency_body_not_canonicalizable` before any claim.
    /// Defaults to [`fingerprint`](Self::fingerprint), which never fails.
    ///
    /// # Errors
    ///
    /// [`FingerprintError`] when the request has no fingerprint.
    fn try_fingerprint(&self, parts: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        Ok(self.fingerprint(parts))
    }
}

/// Fingerprint algorithm version 1 (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultFingerprinter;

impl Fingerprinter for DefaultFingerprinter {
    fn fingerprint(&self, parts: &RequestParts<'_>) -> Fingerprint {
        fingerprint_v1(parts)
    }

    fn try_fingerprint(&self, parts: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        try_fingerprint_v1(parts)
    }
}

/// How a body entered the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyEncoding {
    Raw,
    Jcs,
}

fn frame(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// Version 1 of the fingerprint (see the module docs), for a request known to have one: a JSON
/// body that is not I-JSON is taken as raw bytes here (which never merges two different
/// bodies); [`try_fingerprint_v1`] refuses it instead.
pub fn fingerprint_v1(parts: &RequestParts<'_>) -> Fingerprint {
    v1(parts, false).unwrap_or_else(|_| unreachable!("only refusals fail"))
}

/// Version 1 of the fingerprint (see the module docs).
///
/// # Errors
///
/// [`FingerprintError::NotIJson`] for a JSON body that is not I-JSON.
pub fn try_fingerprint_v1(parts: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
    v1(parts, true)
}

fn v1(parts: &RequestParts<'_>, refuse: bool) -> Result<Fingerprint, FingerprintError> {
    let mut h = Sha256::new();
    frame(&mut h, b"oncely-fingerprint");
    h.update(FINGERPRINT_VERSION.to_be_bytes());
    if parts.method.bytes().any(|b| b.is_ascii_lowercase()) {
        frame(&mut h, parts.method.to_ascii_uppercase().as_bytes());
    } else {
        frame(&mut h, parts.method.as_bytes());
    }
    frame(&mut h, parts.path.as_bytes());
    match parts.query {
        Some(q) => {
            h.update([1]);
            frame(&mut h, q.as_bytes());
        }
        None => h.update([0]),
    }
    let essence = parts.content_type.map(essence_of).unwrap_or_default();
    frame(&mut h, essence.as_bytes());
    let mut canonical = false;
    if is_json_media_type(&essence) {
        let mut hj = h.clone();
        frame(&mut hj, &[BodyEncoding::Jcs as u8]);
        match jcs::hash_framed(parts.body, &mut hj) {
            Ok(()) => {
                h = hj;
                canonical = true;
            }
            Err(e) if refuse && e.kind().is_json() => return Err(FingerprintError::NotIJson(e)),
            Err(_) => {}
        }
    }
    if !canonical {
        frame(&mut h, &[BodyEncoding::Raw as u8]);
        frame(&mut h, parts.body);
    }
    h.update((parts.extra_headers.len() as u64).to_be_bytes());
    for (name, values) in parts.extra_headers {
        frame(&mut h, name.to_ascii_lowercase().as_bytes());
        h.update((values.len() as u64).to_be_bytes());
        for v in values {
            frame(&mut h, v);
        }
    }
    Ok(Fingerprint {
        version: FINGERPRINT_VERSION,
        digest: h.finalize().into(),
    })
}

/// The lower-cased `type/subtype` of a `Content-Type` value, parameters dropped.
pub fn media_type_essence(content_type: &[u8]) -> String {
    let s = String::from_utf8_lossy(content_type);
    s.split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// [`media_type_essence`], borrowed from `content_type` when it is plain lower-case ASCII
/// (the usual case: no allocation on the hot path).
fn essence_of(content_type: &[u8]) -> std::borrow::Cow<'_, str> {
    let head = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    if head.iter().all(|b| b.is_ascii() && !b.is_ascii_uppercase())
        && let Ok(s) = std::str::from_utf8(head)
    {
        return std::borrow::Cow::Borrowed(s.trim());
    }
    std::borrow::Cow::Owned(media_type_essence(content_type))
}

/// Whether a media type essence is JSON (`application/json` or a `+json` suffix, RFC 6839).
pub fn is_json_media_type(essence: &str) -> bool {
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The RFC 8785 canonical form of a JSON body (what version 1 hashes for a JSON media type).
///
/// # Errors
///
/// As [`jcs::canonicalize`]: the body is not JSON (the fingerprint then takes it as raw bytes)
/// or not I-JSON (refused).
pub fn canonical_json(body: &[u8]) -> Result<Vec<u8>, JcsError> {
    jcs::canonicalize(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(method: &str, path: &str, ct: Option<&str>, body: &[u8]) -> Fingerprint {
        DefaultFingerprinter.fingerprint(&RequestParts {
            method,
            path,
            query: None,
            content_type: ct.map(str::as_bytes),
            body,
            extra_headers: &[],
        })
    }

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    #[tokio::test]
    async fn a_record_of_another_version_is_a_mismatch_never_a_replay() {
        use crate::{
            ClaimOutcome, ClaimRequest, IdempotencyKey, KeyStore, MemoryStore, RecordKey, Scope,
            StoredResponse,
        };
        use std::time::Duration;
        let store = MemoryStore::new();
        let id = RecordKey::new(Scope::new("s"), IdempotencyKey::new("k").unwrap());
        let v1 = fp("POST", "/v1/payments", JSON, b"{}");
        let other = Fingerprint::from_parts(v1.version() + 1, *v1.digest());
        assert_ne!(v1, other, "the same digest under another version");
        let day = Duration::from_secs(86_400);
        let req = |f| ClaimRequest::new(id.clone(), f, Duration::from_secs(30), day, 3 * day);
        let ClaimOutcome::Claimed(c) = store.claim(req(v1)).await.unwrap() else {
            panic!("a first claim")
        };
        store
            .complete(
                &id,
                c.token,
                StoredResponse::new(201, vec![], b"ok".to_vec()),
                3 * day,
            )
            .await
            .unwrap();
        assert!(matches!(
            store.claim(req(other)).await.unwrap(),
            ClaimOutcome::Mismatch
        ));
        assert!(matches!(
            store.claim(req(v1)).await.unwrap(),
            ClaimOutcome::Replay { .. }
        ));
    }

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        // docs/DESIGN.md, "Serializer differences": the same members, reordered and spaced.
        let a = fp("POST", "/v1/payments", JSON, br#"{"a":1,"b":2}"#);
        let b = fp("POST", "/v1/payments", JSON, b"{\"b\": 2,\n \"a\": 1}");
        assert_eq!(a, b);
        // Arrays stay order-sensitive.
        let c = fp("POST", "/v1/payments", JSON, br#"{"a":[1,2]}"#);
        let d = fp("POST", "/v1/payments", JSON, br#"{"a":[2,1]}"#);
        assert_ne!(c, d);
    }

    #[test]
    fn every_part_counts() {
        let base = fp("POST", "/v1/payments", JSON, br#"{"amount":100}"#);
        assert_ne!(base, fp("PUT", "/v1/payments", JSON, br#"{"amount":100}"#));
        assert_ne!(base, fp("POST", "/v1/orders", JSON, br#"{"amount":100}"#));
        assert_ne!(base, fp("POST", "/v1/payments", JSON, br#"{"amount":101}"#));
        assert_ne!(
            base,
            fp(
                "POST",
                "/v1/payments",
                Some("text/plain"),
                br#"{"amount":100}"#
            )
        );
        // docs/DESIGN.md, "Validation skipped on one path": another nested value, another request.
        assert_ne!(
            fp(
                "POST",
                "/x",
                JSON,
                br#"{"ref":"X","accounts":[{"id":"12345"}]}"#
            ),
            fp(
                "POST",
                "/x",
                JSON,
                br#"{"ref":"X","accounts":[{"id":"54321"}]}"#
            )
        );
    }

    #[test]
    fn framing_is_unambiguous() {
        let q = |query: Option<&str>, path: &str| {
            DefaultFingerprinter.fingerprint(&RequestParts {
                method: "POST",
                path,
                query,
                content_type: None,
                body: b"",
                extra_headers: &[],
            })
        };
        assert_ne!(q(None, "/a"), q(Some(""), "/a"));
        assert_ne!(q(Some("b"), "/a"), q(Some(""), "/ab"));
    }

    fn try_fp(ct: Option<&str>, body: &[u8]) -> Result<Fingerprint, FingerprintError> {
        DefaultFingerprinter.try_fingerprint(&RequestParts {
            method: "POST",
            path: "/v1/payments",
            query: None,
            content_type: ct.map(str::as_bytes),
            body,
            extra_headers: &[],
        })
    }

    /// Version 1 as it was before the streaming canonicalizer: the body through a
    /// `serde_json::Value` and `serde_json_canonicalizer`, framed the same way.
    fn fp_before(body: &[u8]) -> Fingerprint {
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        let canonical = serde_json_canonicalizer::to_vec(&value).unwrap();
        let mut h = Sha256::new();
        frame(&mut h, b"oncely-fingerprint");
        h.update(FINGERPRINT_VERSION.to_be_bytes());
        frame(&mut h, b"POST");
        frame(&mut h, b"/v1/payments");
        h.update([0]);
        frame(&mut h, b"application/json");
        frame(&mut h, &[BodyEncoding::Jcs as u8]);
        frame(&mut h, &canonical);
        h.update(0u64.to_be_bytes());
        Fingerprint::from_parts(FINGERPRINT_VERSION, h.finalize().into())
    }

    #[test]
    fn json_fingerprints_are_those_of_version_1_before() {
        for body in [
            &br#"{"b": [1, 2.50, "x\u0041"], "a": {"d": null, "c": true}}"#[..],
            br#"{"amount":5000,"currency":"eur"}"#,
            b"[]",
            br#""\ud83d\ude00""#,
        ] {
            assert_eq!(try_fp(JSON, body).unwrap(), fp_before(body));
            assert_eq!(fp("POST", "/v1/payments", JSON, body), fp_before(body));
        }
    }

    /// Case: a retry whose body repeats a member name must never be matched with the first
    /// request that had one of its values (`{"amount":5000}` and `{"amount":1,"amount":5000}`
    /// used to share a fingerprint: the tree kept the last value).
    #[test]
    fn not_i_json_has_no_fingerprint() {
        let refused = |body: &[u8]| match try_fp(JSON, body) {
            Err(FingerprintError::NotIJson(e)) => e.kind(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(br#"{"amount":1,"amount":5000}"#),
            jcs::JcsErrorKind::DuplicateName
        );
        assert_eq!(
            refused(br#"{"s":"\ud800"}"#),
            jcs::JcsErrorKind::LoneSurrogate
        );
        // What JavaScript serializes `Math.PI` and `0.1 + 0.2` to, and a 16-digit id, are
        // I-JSON: each is exactly its double's shortest form. Another spelling of the same
        // decimal is the same request; a decimal that only rounds to the same double is not.
        for (body, same) in [
            (
                &br#"{"pi":3.141592653589793}"#[..],
                &br#"{ "pi" : 3141592653589793e-15 }"#[..],
            ),
            (br#"[0.30000000000000004]"#, br#"[30000000000000004E-17]"#),
            (
                br#"{"id":1234567890123456}"#,
                br#"{"id":1234567890123456.0}"#,
            ),
        ] {
            let f = try_fp(JSON, body).unwrap();
            assert_eq!(try_fp(JSON, same).unwrap(), f);
        }
        assert_ne!(
            try_fp(JSON, br#"{"pi":3.1415926535897932}"#).unwrap(),
            try_fp(JSON, br#"{"pi":3.141592653589793}"#).unwrap()
        );
        // Any +json type is JSON; other media types are raw bytes and never refused.
        assert!(try_fp(Some("application/merge-patch+json"), br#"{"a":1,"a":2}"#).is_err());
        assert!(try_fp(Some("text/plain"), br#"{"a":1,"a":2}"#).is_ok());
        // Not JSON at all: raw bytes, as before.
        assert_eq!(
            try_fp(JSON, b"{not json").unwrap(),
            fp("POST", "/v1/payments", JSON, b"{not json")
        );
        // The infallible form takes a refused body as raw bytes: still never the fingerprint of
        // the body with the duplicate removed.
        assert_ne!(
            fp(
                "POST",
                "/v1/payments",
                JSON,
                br#"{"amount":1,"amount":5000}"#
            ),
            fp("POST", "/v1/payments", JSON, br#"{"amount":5000}"#)
        );
    }

    /// A 64-bit id beyond 2^53 has a fingerprint (its digits): the same digits in a reordered
    /// body are the same request; the double's neighbour, the double's own form and another
    /// spelling of the same number are other requests (docs/DESIGN.md, "Large numbers").
    #[test]
    fn numbers_no_double_carries_are_fingerprinted_by_their_digits() {
        let id = try_fp(
            JSON,
            br#"{"customer_id":12345678901234567890,"amount":100}"#,
        )
        .unwrap();
        assert_eq!(
            try_fp(
                JSON,
                b"{ \"amount\": 100,\n  \"customer_id\": 12345678901234567890 }"
            )
            .unwrap(),
            id
        );
        assert_eq!(
            fp(
                "POST",
                "/v1/payments",
                JSON,
                br#"{"amount":100,"customer_id":12345678901234567890}"#
            ),
            id
        );
        for other in [
            &br#"{"customer_id":12345678901234567891,"amount":100}"#[..],
            // The shortest form of its nearest double, what RFC 8785 alone would write.
            br#"{"customer_id":12345678901234567000,"amount":100}"#,
            br#"{"customer_id":1.2345678901234567890e19,"amount":100}"#,
            br#"{"customer_id":12345678901234567890.0,"amount":100}"#,
            br#"{"customer_id":"12345678901234567890","amount":100}"#,
        ] {
            assert_ne!(
                try_fp(JSON, other).unwrap(),
                id,
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        // 2^53 + 1 and 2^53 are one double, and two requests.
        assert_ne!(
            try_fp(JSON, br#"{"n":9007199254740993}"#).unwrap(),
            try_fp(JSON, br#"{"n":9007199254740992}"#).unwrap()
        );
        // Long decimals, and values beyond the range of doubles, likewise.
        for (a, b) in [
            (&br#"[0.1000000000000000000001]"#[..], &br#"[0.1]"#[..]),
            (br#"[1e400]"#, br#"[1e401]"#),
            (br#"[1e-400]"#, br#"[0]"#),
        ] {
            assert_ne!(try_fp(JSON, a).unwrap(), try_fp(JSON, b).unwrap());
            assert_eq!(try_fp(JSON, a).unwrap(), try_fp(JSON, a).unwrap());
        }
        // Numbers a double carries keep RFC 8785's form: `1.0` is `1`, as before.
        assert_eq!(
            try_fp(JSON, br#"{"n":1.0}"#).unwrap(),
            try_fp(JSON, br#"{"n":1}"#).unwrap()
        );
        assert_eq!(
            try_fp(JSON, br#"{"n":1.0}"#).unwrap(),
            fp_before(br#"{"n":1}"#)
        );
    }

    #[test]
    fn big_numbers_never_collapse() {
        // 2^53 and 2^53 + 1 are the same double; RFC 8785 alone would merge them.
        let a = fp("POST", "/x", JSON, br#"{"n":9007199254740992}"#);
        let b = fp("POST", "/x", JSON, br#"{"n":9007199254740993}"#);
        assert_ne!(a, b);
        let c = fp("POST", "/x", JSON, br#"{"n":0.1000000000000000000001}"#);
        let d = fp("POST", "/x", JSON, br#"{"n":0.1}"#);
        assert_ne!(c, d);
    }

    #[test]
    fn invalid_json_falls_back_to_raw_bytes() {
        let a = fp("POST", "/x", JSON, b"{not json");
        let b = fp("POST", "/x", JSON, b"{not json ");
        assert_ne!(a, b);
        assert_eq!(a, fp("POST", "/x", JSON, b"{not json"));
    }

    #[test]
    fn stored_form_round_trips() {
        let a = fp("POST", "/x", JSON, b"{}");
        let b = Fingerprint::from_stored(i64::from(a.version()), a.digest()).unwrap();
        assert_eq!(a, b);
        assert!(Fingerprint::from_stored(1, &[0; 31]).is_err());
        assert!(Fingerprint::from_stored(-1, &[0; 32]).is_err());
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            (-1_000_000_000_i64..1_000_000_000).prop_map(serde_json::Value::from),
            "[a-z0-9 ]{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map("[a-e]{1,2}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Serializes with object members in reverse order and extra whitespace.
    fn reordered(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Object(m) => {
                let mut parts: Vec<String> = m
                    .iter()
                    .map(|(k, v)| {
                        format!("{} : {}", serde_json::to_string(k).unwrap(), reordered(v))
                    })
                    .collect();
                parts.reverse();
                format!("{{ {} }}", parts.join(" ,\n"))
            }
            serde_json::Value::Array(a) => {
                format!(
                    "[ {} ]",
                    a.iter().map(reordered).collect::<Vec<_>>().join(" , ")
                )
            }
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn canonical_equal_bodies_have_equal_fingerprints(v in json_value()) {
            let compact = serde_json::to_vec(&v).unwrap();
            let spaced = reordered(&v);
            prop_assert_eq!(
                fp("POST", "/p", JSON, &compact),
                fp("POST", "/p", JSON, spaced.as_bytes())
            );
        }

        #[test]
        fn different_values_have_different_fingerprints(a in json_value(), b in json_value()) {
            prop_assume!(a != b);
            prop_assert_ne!(
                fp("POST", "/p", JSON, &serde_json::to_vec(&a).unwrap()),
                fp("POST", "/p", JSON, &serde_json::to_vec(&b).unwrap())
            );
        }

        #[test]
        fn same_fingerprint_as_before(v in json_value()) {
            let body = reordered(&v);
            prop_assert_eq!(try_fp(JSON, body.as_bytes()).unwrap(), fp_before(body.as_bytes()));
        }

        #[test]
        fn fingerprint_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512), ct in "[a-z/+;= -]{0,30}") {
            let _ = fp("POST", "/p", Some(&ct), &body);
            let _ = fp("POST", "/p", JSON, &body);
        }

        /// The borrowed fast path reads a `Content-Type` exactly as `media_type_essence` does,
        /// for any bytes (upper case, parameters, spaces, non-ASCII, invalid UTF-8).
        #[test]
        fn the_borrowed_essence_is_the_essence(ct in proptest::collection::vec(prop_oneof![
            Just(b'a'), Just(b'J'), Just(b'/'), Just(b'+'), Just(b';'), Just(b' '), Just(b'\t'),
            Just(0xC3), Just(0xA9), Just(0xFF), any::<u8>()
        ], 0..24)) {
            let (fast, slow) = (essence_of(&ct), media_type_essence(&ct));
            prop_assert_eq!(fast.as_ref(), slow.as_str());
        }

        /// A lower-case method and its upper-case form give one fingerprint (methods are
        /// compared case-insensitively here, as before the fast path).
        #[test]
        fn method_case_does_not_matter(m in "[a-zA-Z]{1,8}") {
            prop_assert_eq!(
                fp(&m, "/p", JSON, b"{}"),
                fp(&m.to_ascii_uppercase(), "/p", JSON, b"{}")
            );
        }
    }
}
