//! The stored record of one `(scope, key)` and its three states.
//!
//! ```text
//!             claim                    complete(token)
//!   absent ----------> in_flight ---------------------> complete
//!     ^                 |   ^  \                           |
//!     |  release(token) |   |   `-- lease lapses: a new    | replay window passes:
//!     `-----------------'   |       claim takes over with  | the next claim starts anew
//!                           `------ a new fencing token ---'
//! ```
//!
//! A released record stays in the store as a tombstone ([`RecordState::Released`]) that behaves
//! exactly like `absent`, so that the fencing token keeps increasing: a stale owner whose record
//! was released and claimed again can never write with an old token that happens to match.

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use serde::{Deserialize, Serialize};

/// A point in time as integer milliseconds since the Unix epoch (UTC).
pub type UnixMillis = i64;

/// The token a claim hands its owner. Every later write by the owner carries it, and the store
/// rejects a write whose token is not the record's current one (the owner was fenced off because
/// its lease lapsed and another request took over).
///
/// Tokens of one `(scope, key)` strictly increase: each claim or takeover gets the previous
/// token plus one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken(pub i64);

/// A response as stored for replay: status, headers in order (multi-valued headers as repeated
/// entries), the whole body and the trailers.
///
/// Build one with [`StoredResponse::new`] and the `with_*` methods (the struct is
/// `#[non_exhaustive]`: it may gain fields):
///
/// ```
/// use oncely_core::StoredResponse;
///
/// let r = StoredResponse::new(201, vec![("content-type".into(), b"application/json".to_vec())], b"{}".to_vec())
///     .with_trailers(vec![("grpc-status".into(), b"0".to_vec())]);
/// assert!(r.body_retained);
/// assert_eq!(r.trailers.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StoredResponse {
    /// The HTTP status code, e.g. `201`.
    pub status: u16,
    /// Header `(lower-case name, value bytes)` pairs, in the order they were sent.
    #[serde(with = "compact::headers")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes; when [`StoredResponse::body_retained`] is `false`, empty.
    pub body: Vec<u8>,
    /// `false` when the body was over the size limit or was a stream that exceeded it: the
    /// response was delivered to the first caller but cannot be replayed. A replay then answers
    /// the `idempotency_response_not_retained` problem, never a partial body.
    pub body_retained: bool,
    /// Trailer `(lower-case name, value bytes)` pairs sent after the body, in order; empty for
    /// most HTTP responses. gRPC sends its status here (`grpc-status`, `grpc-message`,
    /// `grpc-status-details-bin`), so a replay without them would not be the same call at the
    /// gRPC level. Stores keep them in the headers column ([`StoredResponse::encode_headers`]);
    /// a record written before trailers were kept decodes with none.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "compact::headers"
    )]
    pub trailers: Vec<(String, Vec<u8>)>,
}

/// Headers and trailers as decoded from a store's headers column by
/// [`StoredResponse::decode_header_fields`]: `(headers, trailers)`, each a list of
/// `(lower-case name, value bytes)` pairs in order.
pub type HeaderFields = (Vec<(String, Vec<u8>)>, Vec<(String, Vec<u8>)>);

impl StoredResponse {
    /// A retained response without trailers: the HTTP `status` (e.g. `201`), header
    /// `(lower-case name, value bytes)` pairs in the order they were sent (a multi-valued header
    /// as repeated entries), and the whole `body`.
    pub fn new(status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            body,
            body_retained: true,
            trailers: Vec::new(),
        }
    }

    /// Sets the trailer `(lower-case name, value bytes)` pairs, in order (default: none).
    pub fn with_trailers(mut self, trailers: Vec<(String, Vec<u8>)>) -> Self {
        self.trailers = trailers;
        self
    }

    /// Sets whether the body was retained (default `true`). `false` (the body was over the
    /// size limit) also empties the body: a response that is not retained keeps none, and its
    /// replay answers `idempotency_response_not_retained`.
    pub fn with_body_retained(mut self, retained: bool) -> Self {
        self.body_retained = retained;
        if !retained {
            self.body = Vec::new();
        }
        self
    }

    /// Encodes the headers (and trailers) for a store column.
    ///
    /// Without trailers (almost every HTTP response): a JSON array of `[name, value]` pairs, the
    /// value a JSON string when it is UTF-8 (almost always), else an array of its byte values;
    /// value bytes are kept exactly either way. Example:
    /// `[["content-type","application/json"],["x-raw",[255,0]]]`. This is the form every record
    /// had before trailers were kept, byte for byte.
    ///
    /// With trailers (a gRPC response): a JSON object holding both lists in that form,
    /// `{"headers":[...],"trailers":[["grpc-status","0"]]}`. Read it back with
    /// [`StoredResponse::decode_header_fields`].
    pub fn encode_headers(&self) -> Vec<u8> {
        if self.trailers.is_empty() {
            return serde_json::to_vec(&compact::Headers(&self.headers)).unwrap_or_default();
        }
        serde_json::to_vec(&compact::Fields {
            headers: compact::Headers(&self.headers),
            trailers: compact::Headers(&self.trailers),
        })
        .unwrap_or_default()
    }

    /// Decodes a headers column written by [`StoredResponse::encode_headers`] in either form
    /// (with or without trailers), and by its earlier form (every value an array of byte
    /// values), which records in existing stores still hold: `(headers, trailers)`, the
    /// trailers empty for the array forms.
    ///
    /// # Errors
    ///
    /// The bytes are not an encoded header list (a corrupt record).
    pub fn decode_header_fields(bytes: &[u8]) -> Result<HeaderFields, serde_json::Error> {
        match serde_json::from_slice::<compact::OwnedFields>(bytes)? {
            compact::OwnedFields::Headers(h) => Ok((compact::owned(h), Vec::new())),
            compact::OwnedFields::Both { headers, trailers } => {
                Ok((compact::owned(headers), compact::owned(trailers)))
            }
        }
    }

    /// Decodes headers written by [`StoredResponse::encode_headers`], and by its earlier form
    /// (every value an array of byte values), which records in existing stores still hold.
    ///
    /// # Errors
    ///
    /// The bytes are not an encoded header list (a corrupt record).
    pub fn decode_headers(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, serde_json::Error> {
        Ok(Self::decode_header_fields(bytes)?.0)
    }
}

/// The compact serde forms of byte strings in stored records: a JSON string when the bytes are
/// UTF-8, else an array of byte values. Both forms are read back, so records written before
/// (arrays only) still decode.
mod compact {
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::ser::{SerializeSeq, Serializer};
    use serde::{Deserialize, Serialize};
    use std::fmt;

    /// Bytes, serialized as text when they are UTF-8.
    pub(super) struct Bytes<'a>(pub(super) &'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match std::str::from_utf8(self.0) {
                Ok(text) => s.serialize_str(text),
                Err(_) => {
                    let mut seq = s.serialize_seq(Some(self.0.len()))?;
                    for b in self.0 {
                        seq.serialize_element(b)?;
                    }
                    seq.end()
                }
            }
        }
    }

    /// Bytes read from either form.
    pub(super) struct Value(pub(super) Vec<u8>);

    impl<'de> Deserialize<'de> for Value {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Value;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a string or an array of byte values")
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
                    Ok(Value(v.as_bytes().to_vec()))
                }
                fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
                    Ok(Value(v.into_bytes()))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
                    let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0));
                    while let Some(b) = a.next_element::<u8>()? {
                        out.push(b);
                    }
                    Ok(Value(out))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// Headers and trailers together (the headers column of a response with trailers).
    #[derive(Serialize)]
    pub(super) struct Fields<'a> {
        pub(super) headers: Headers<'a>,
        pub(super) trailers: Headers<'a>,
    }

    /// A headers column as read back: the array (no trailers) or the object.
    #[derive(Deserialize)]
    #[serde(untagged)]
    pub(super) enum OwnedFields {
        Headers(Vec<(String, Value)>),
        Both {
            headers: Vec<(String, Value)>,
            trailers: Vec<(String, Value)>,
        },
    }

    pub(super) fn owned(pairs: Vec<(String, Value)>) -> Vec<(String, Vec<u8>)> {
        pairs.into_iter().map(|(n, v)| (n, v.0)).collect()
    }

    /// Header pairs with compact values.
    pub(super) struct Headers<'a>(pub(super) &'a [(String, Vec<u8>)]);

    impl Serialize for Headers<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.0.len()))?;
            for (name, value) in self.0 {
                seq.serialize_element(&(name, Bytes(value)))?;
            }
            seq.end()
        }
    }

    /// `#[serde(with = "compact::bytes")]`.
    pub(super) mod bytes {
        use super::*;

        pub(in super::super) fn serialize<S: Serializer>(
            v: &[u8],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            Bytes(v).serialize(s)
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<u8>, D::Error> {
            Ok(Value::deserialize(d)?.0)
        }
    }

    /// `#[serde(with = "compact::headers")]`.
    pub(super) mod headers {
        use super::*;

        pub(in super::super) fn serialize<S: Serializer>(
            v: &[(String, Vec<u8>)],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            Headers(v).serialize(s)
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
            let pairs: Vec<(String, Value)> = Vec::deserialize(d)?;
            Ok(pairs.into_iter().map(|(n, v)| (n, v.0)).collect())
        }
    }
}

/// The request that made a claim, kept so that the completer can re-drive an abandoned request
/// through the service with the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StoredRequest {
    /// The method, e.g. `POST`.
    pub method: String,
    /// The path and query, e.g. `/v1/payments?expand=charge`.
    pub uri: String,
    /// Header `(lower-case name, value bytes)` pairs needed to re-drive it (never credentials:
    /// the completer re-authenticates as the scope).
    #[serde(with = "compact::headers")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes.
    #[serde(with = "compact::bytes")]
    pub body: Vec<u8>,
}

impl StoredRequest {
    /// A request: its `method` (e.g. `POST`), its path and query `uri` (e.g.
    /// `/v1/payments?expand=charge`), the header `(lower-case name, value bytes)` pairs needed to
    /// re-drive it (never credentials), and its whole `body`.
    pub fn new(
        method: impl Into<String>,
        uri: impl Into<String>,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    ) -> Self {
        Self {
            method: method.into(),
            uri: uri.into(),
            headers,
            body,
        }
    }

    /// Encodes the request for a store column: a JSON object with `method`, `uri`, `headers`
    /// (as [`StoredResponse::encode_headers`] writes them) and `body`, a JSON string when the
    /// body is UTF-8, else an array of its byte values.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a request written by [`StoredRequest::encode`], or by its earlier form (header
    /// values and the body as arrays of byte values), which existing stores still hold.
    ///
    /// # Errors
    ///
    /// The bytes are not an encoded request (a corrupt record).
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// Where a record is in the key state machine.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm, which should fail
/// closed (treat an unknown state as "do not execute, do not replay").
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// Owned by the holder of the record's current token until `lease_expires_at`.
    InFlight {
        /// When the lease lapses unless renewed (epoch milliseconds).
        lease_expires_at: UnixMillis,
        /// The last committed atomic phase, if the request has several.
        recovery_point: Option<String>,
    },
    /// Done; the response replays until `completed_at` plus the replay window.
    Complete {
        /// The stored response.
        response: StoredResponse,
        /// When it completed (epoch milliseconds).
        completed_at: UnixMillis,
    },
    /// Released by its owner (nothing executed, or a rolled-back transaction): behaves as
    /// absent, kept only so that fencing tokens keep increasing.
    Released,
}

/// One record of the key store. Stores build it with [`Record::new`] (the struct is
/// `#[non_exhaustive]`: it may gain fields).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// Whose key.
    pub scope: Scope,
    /// The key.
    pub key: IdempotencyKey,
    /// The fingerprint of the request that claimed it (with its algorithm version).
    pub fingerprint: Fingerprint,
    /// The current fencing token.
    pub token: FencingToken,
    /// The state.
    pub state: RecordState,
    /// When the current claim was made (epoch milliseconds).
    pub created_at: UnixMillis,
    /// When the reaper may delete the record (epoch milliseconds): claim or completion time
    /// plus the retention.
    pub expires_at: UnixMillis,
    /// The request that claimed it, for the completer; kept only while the record is in flight
    /// (the completer re-drives in-flight records only): completing or releasing the record
    /// drops it, so a complete or released record holds `None`.
    pub request: Option<StoredRequest>,
    /// What the completer did with the record while it was abandoned in flight: its attempts,
    /// its backoff and whether it gave up. A takeover keeps it (the same request resumes); a
    /// new claim starts it again from [`Redrives::default`]. Meaningful only in flight.
    pub redrives: Redrives,
}

/// The completer's bookkeeping on one abandoned in-flight record, kept in the store so that it
/// survives a restart of the process that runs the completer (written by
/// [`Maintenance::note_redrive`](crate::Maintenance::note_redrive)).
///
/// Records written before this existed decode as [`Redrives::default`]: no attempts, no
/// backoff, not marked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Redrives {
    /// How many times the completer re-drove the request (0: never).
    pub attempts: u32,
    /// The completer does not re-drive the record again before this time (epoch
    /// milliseconds); `None` before its first attempt.
    pub next_attempt_at: Option<UnixMillis>,
    /// When the completer gave up and marked the record for a person (epoch milliseconds);
    /// `None` while it still tries. A marked record is never re-driven, never taken over, and
    /// every request with its key and fingerprint is answered
    /// [`ClaimOutcome::NeedsAttention`](crate::ClaimOutcome::NeedsAttention) until the reaper
    /// deletes it at the end of its retention.
    pub marked_at: Option<UnixMillis>,
}

impl Redrives {
    /// The bookkeeping as a store reads it back: `attempts` re-drives so far, the earliest next
    /// attempt and the time of the mark (epoch milliseconds, `None` when unset).
    pub fn new(
        attempts: u32,
        next_attempt_at: Option<UnixMillis>,
        marked_at: Option<UnixMillis>,
    ) -> Self {
        Self {
            attempts,
            next_attempt_at,
            marked_at,
        }
    }

    /// Whether the completer gave up on the record.
    pub fn is_marked(&self) -> bool {
        self.marked_at.is_some()
    }
}

impl Record {
    /// A record of `(scope, key)` claimed by the request with `fingerprint`, holding `token`,
    /// in `state`; `created_at` is the time of the current claim and `expires_at` the time the
    /// reaper may delete it (both epoch milliseconds). It keeps no stored request and fresh
    /// [`Redrives`]; set them with [`Record::with_request`] and [`Record::with_redrives`].
    pub fn new(
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        token: FencingToken,
        state: RecordState,
        created_at: UnixMillis,
        expires_at: UnixMillis,
    ) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            token,
            state,
            created_at,
            expires_at,
            request: None,
            redrives: Redrives::default(),
        }
    }

    /// Sets the stored request (default `None`; only an in-flight record keeps one).
    pub fn with_request(mut self, request: Option<StoredRequest>) -> Self {
        self.request = request;
        self
    }

    /// Sets the completer's bookkeeping (default [`Redrives::default`]).
    pub fn with_redrives(mut self, redrives: Redrives) -> Self {
        self.redrives = redrives;
        self
    }

    /// The state's name as used in stores and APIs: `in_flight`, `complete` or `released`.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            RecordState::InFlight { .. } => "in_flight",
            RecordState::Complete { .. } => "complete",
            RecordState::Released => "released",
        }
    }

    /// Whether the record is in flight and marked for a person (the completer gave up on it).
    pub fn is_marked(&self) -> bool {
        matches!(self.state, RecordState::InFlight { .. }) && self.redrives.is_marked()
    }

    /// The recovery point, when in flight.
    pub fn recovery_point(&self) -> Option<&str> {
        match &self.state {
            RecordState::InFlight { recovery_point, .. } => recovery_point.as_deref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("location".into(), b"/v1/orders/ord_0195".to_vec()),
                ("x-quote".into(), br#"a "b" \ c"#.to_vec()),
                ("x-raw".into(), vec![0xff, 0x00, b'a']),
            ],
            body: b"{}".to_vec(),
            body_retained: true,
            trailers: Vec::new(),
        }
    }

    #[test]
    fn constructors_set_the_documented_defaults() {
        let r = StoredResponse::new(201, vec![("a".into(), b"1".to_vec())], b"{}".to_vec());
        assert_eq!((r.status, r.body_retained), (201, true));
        assert_eq!(r.body, b"{}".to_vec());
        assert!(r.trailers.is_empty());
        // Not retained keeps no body.
        let n = r.clone().with_body_retained(false);
        assert_eq!((n.body_retained, n.body.len()), (false, 0));
        assert_eq!(n.headers, r.headers);
        let t = r.with_trailers(vec![("grpc-status".into(), b"0".to_vec())]);
        assert_eq!(t.trailers.len(), 1);

        let rec = Record::new(
            Scope::new("s"),
            IdempotencyKey::new("k").unwrap(),
            Fingerprint::from_parts(1, [0; 32]),
            FencingToken(3),
            RecordState::Released,
            10,
            20,
        );
        assert_eq!(
            (rec.created_at, rec.expires_at, rec.token),
            (10, 20, FencingToken(3))
        );
        assert_eq!((&rec.request, rec.redrives), (&None, Redrives::default()));
        let req = StoredRequest::new("POST", "/v1/x", vec![], b"b".to_vec());
        let rec = rec
            .with_request(Some(req.clone()))
            .with_redrives(Redrives::new(2, Some(5), None));
        assert_eq!(rec.request, Some(req));
        assert_eq!(rec.redrives.attempts, 2);
        assert!(!rec.redrives.is_marked());
    }

    #[test]
    fn headers_are_text_when_utf8_and_round_trip_exactly() {
        let r = response();
        let enc = r.encode_headers();
        assert_eq!(
            String::from_utf8(enc.clone()).unwrap(),
            r#"[["content-type","application/json"],["location","/v1/orders/ord_0195"],["x-quote","a \"b\" \\ c"],["x-raw",[255,0,97]]]"#
        );
        assert_eq!(StoredResponse::decode_headers(&enc).unwrap(), r.headers);
        // The earlier form, as existing records hold it.
        let old = serde_json::to_vec(&r.headers).unwrap();
        assert!(old.starts_with(br#"[["content-type",[97,112,112"#));
        assert_eq!(StoredResponse::decode_headers(&old).unwrap(), r.headers);
        assert!(StoredResponse::decode_headers(b"[[\"a\",1]]").is_err());
        assert!(StoredResponse::decode_headers(b"{").is_err());
    }

    #[test]
    fn trailers_are_an_additive_form_of_the_headers_column() {
        // Without trailers, the column is byte for byte what it was before trailers existed.
        let r = response();
        assert!(r.encode_headers().starts_with(b"[[\"content-type\""));
        assert_eq!(
            StoredResponse::decode_header_fields(&r.encode_headers()).unwrap(),
            (r.headers.clone(), vec![])
        );
        // With trailers, an object holding both lists.
        let g = StoredResponse {
            trailers: vec![
                ("grpc-status".into(), b"5".to_vec()),
                ("grpc-message".into(), b"not%20found".to_vec()),
            ],
            ..r.clone()
        };
        let enc = g.encode_headers();
        assert!(enc.starts_with(br#"{"headers":[["content-type","application/json"]"#));
        assert!(
            enc.ends_with(br#""trailers":[["grpc-status","5"],["grpc-message","not%20found"]]}"#)
        );
        assert_eq!(
            StoredResponse::decode_header_fields(&enc).unwrap(),
            (g.headers.clone(), g.trailers.clone())
        );
        // `decode_headers` reads both forms (its callers only want the headers).
        assert_eq!(StoredResponse::decode_headers(&enc).unwrap(), g.headers);
        // The serde form (used by JSON views of a record) omits empty trailers, and reads a
        // response written without the field.
        let json = serde_json::to_value(&r).unwrap();
        assert!(json.get("trailers").is_none());
        let back: StoredResponse = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
        let back: StoredResponse =
            serde_json::from_value(serde_json::to_value(&g).unwrap()).unwrap();
        assert_eq!(back, g);
        assert!(StoredResponse::decode_header_fields(br#"{"headers":[]}"#).is_err());
    }

    #[test]
    fn requests_are_compact_and_old_records_still_decode() {
        let req = StoredRequest {
            method: "POST".into(),
            uri: "/v1/orders?x=1".into(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: br#"{"items":[{"sku":"bench-sku","quantity":2}]}"#.to_vec(),
        };
        let enc = req.encode();
        assert_eq!(
            String::from_utf8(enc.clone()).unwrap(),
            r#"{"method":"POST","uri":"/v1/orders?x=1","headers":[["content-type","application/json"]],"body":"{\"items\":[{\"sku\":\"bench-sku\",\"quantity\":2}]}"}"#
        );
        assert_eq!(StoredRequest::decode(&enc).unwrap(), req);
        // The form written before: every byte string an array of decimal byte values.
        let old = format!(
            r#"{{"method":"POST","uri":"/v1/orders?x=1","headers":[["content-type",{:?}]],"body":{:?}}}"#,
            b"application/json".to_vec(),
            req.body
        )
        .replace(' ', "");
        assert_eq!((old.len(), enc.len()), (297, 150));
        assert_eq!(StoredRequest::decode(old.as_bytes()).unwrap(), req);
        // A body that is not UTF-8 keeps its bytes.
        let bin = StoredRequest {
            body: vec![0xc3, 0x28],
            ..req
        };
        assert!(bin.encode().ends_with(br#""body":[195,40]}"#));
        assert_eq!(StoredRequest::decode(&bin.encode()).unwrap(), bin);
    }
}
