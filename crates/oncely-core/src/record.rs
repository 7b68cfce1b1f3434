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
/// entries) and the whole body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The HTTP status code, e.g. `201`.
    pub status: u16,
    /// Header `(lower-case name, value bytes)` pairs, in the order they were sent.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes; when [`StoredResponse::body_retained`] is `false`, empty.
    pub body: Vec<u8>,
    /// `false` when the body was over the size limit or was a stream that exceeded it: the
    /// response was delivered to the first caller but cannot be replayed. A replay then answers
    /// the `idempotency_response_not_retained` problem, never a partial body.
    pub body_retained: bool,
}

impl StoredResponse {
    /// Encodes the headers for a store column (JSON; value bytes kept exactly).
    pub fn encode_headers(&self) -> Vec<u8> {
        serde_json::to_vec(&self.headers).unwrap_or_default()
    }

    /// Decodes headers written by [`StoredResponse::encode_headers`].
    ///
    /// # Errors
    ///
    /// The bytes are not an encoded header list (a corrupt record).
    pub fn decode_headers(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// The request that made a claim, kept so that the completer can re-drive an abandoned request
/// through the service with the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRequest {
    /// The method, e.g. `POST`.
    pub method: String,
    /// The path and query, e.g. `/v1/payments?expand=charge`.
    pub uri: String,
    /// Header `(lower-case name, value bytes)` pairs needed to re-drive it (never credentials:
    /// the completer re-authenticates as the scope).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl StoredRequest {
    /// Encodes the request for a store column (JSON).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a request written by [`StoredRequest::encode`].
    ///
    /// # Errors
    ///
    /// The bytes are not an encoded request (a corrupt record).
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// Where a record is in the key state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// One record of the key store.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The request that claimed it, for the completer.
    pub request: Option<StoredRequest>,
}

impl Record {
    /// The state's name as used in stores and APIs: `in_flight`, `complete` or `released`.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            RecordState::InFlight { .. } => "in_flight",
            RecordState::Complete { .. } => "complete",
            RecordState::Released => "released",
        }
    }

    /// The recovery point, when in flight.
    pub fn recovery_point(&self) -> Option<&str> {
        match &self.state {
            RecordState::InFlight { recovery_point, .. } => recovery_point.as_deref(),
            _ => None,
        }
    }
}
