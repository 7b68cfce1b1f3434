//! The checks' stable names, and what they share.
//!
//! | name | what is checked | FAIL names |
//! |---|---|---|
//! | [`CONCURRENCY`] | `trials` bursts, one after the other, each of `concurrency` identical requests with its own fresh key, fired at once: in every burst at most one execution (distinct `id`s in the 2xx bodies, and the count URL's growth), all 2xx bodies identical, the others `409`; a PASS states its confidence, `1 - 2^-trials` for a race present in half of the bursts | [`CHECK_THEN_INSERT_RACE`](super::anti_patterns::CHECK_THEN_INSERT_RACE), [`DUPLICATE_AS_SERVER_ERROR`](super::anti_patterns::DUPLICATE_AS_SERVER_ERROR), [`REPLAY_DIFFERS`](super::anti_patterns::REPLAY_DIFFERS), [`WRONG_ERROR_STATUS`](super::anti_patterns::WRONG_ERROR_STATUS) |
//! | [`REPLAY_FIDELITY`] | the same request again after it completed: same status, byte-identical body, same significant headers | [`KEY_IGNORED`](super::anti_patterns::KEY_IGNORED), [`REPLAY_DIFFERS`](super::anti_patterns::REPLAY_DIFFERS), [`REPLAY_DROPS_HEADERS`](super::anti_patterns::REPLAY_DROPS_HEADERS) |
//! | [`PAYLOAD_MISMATCH`] | the same key with one value of the body changed: a 4xx, never a replay, never an execution | [`SILENT_MISMATCH_REPLAY`](super::anti_patterns::SILENT_MISMATCH_REPLAY), [`MISMATCH_EXECUTED`](super::anti_patterns::MISMATCH_EXECUTED), [`DUPLICATE_AS_SERVER_ERROR`](super::anti_patterns::DUPLICATE_AS_SERVER_ERROR) |
//! | [`CANONICAL_JSON`] | the same key with the same JSON, keys reordered and whitespace added: a replay | [`FALSE_MISMATCH`](super::anti_patterns::FALSE_MISMATCH), [`BYTE_LEVEL_KEYING`](super::anti_patterns::BYTE_LEVEL_KEYING), [`REPLAY_DIFFERS`](super::anti_patterns::REPLAY_DIFFERS) |
//! | [`CROSS_ENDPOINT`] | the other endpoint with its own body and a fresh key must succeed (else N/A: a refusal would prove nothing); then the first endpoint's key on it: anything but a replay of the first endpoint's response (`422`/`409`, or an independent execution) | [`CROSS_ENDPOINT_REPLAY`](super::anti_patterns::CROSS_ENDPOINT_REPLAY) |
//! | [`CROSS_SCOPE`] | the same key and body under the second credential: an independent execution. A replay is a FAIL unless the second credential can read the first caller's resource (count URL listing, `GET` of the `Location`): then it looks like the same account, the check is INCONCLUSIVE and the report warns | [`GLOBAL_KEY_SCOPE`](super::anti_patterns::GLOBAL_KEY_SCOPE) |
//! | [`REFRESHED_CREDENTIAL`] | the same key and body under another token of the first caller's account: a replay | [`CREDENTIAL_IN_KEY`](super::anti_patterns::CREDENTIAL_IN_KEY) |
//! | [`SESSION_SCOPE`] | with cookies on: a fresh key used by the first caller, then by the second credential presenting the first one's cookies: not the first caller's response | [`SESSION_SCOPED_RECORDS`](super::anti_patterns::SESSION_SCOPED_RECORDS) |
//! | [`CLIENT_BYPASS`] | a new key carrying the candidate headers, then the same key without them; the completed baseline key carrying them: the contract's behaviour (an execution and its replay, the stored response). The candidates: seven replay and cache headers (`Idempotent-Replayed`, `Idempotency-Replayed`, `X-Idempotent-Replayed`, `X-Idempotency-Replayed`, `X-Idempotency-Replay`: `true`; `Cache-Control`, `Pragma`: `no-cache`) and up to four the server's own replay announced (a header the baseline's replay adds, or carries with another value, such as `X-From-Cache: 1` or `X-Cache: HIT`), sent back with the server's value; after the in-flight check, a second round with up to four more that only the concurrency check's in-flight `409`s announced (on a new key and a fresh completed key). On a change, the control (the same requests without the headers) must show the contract's behaviour before anything is blamed on them; when both the probe's and the control's retry found the key still in flight, both keys are sent again after the `Retry-After` (at most 2 s). A change the headers make is named by halving them down to one | [`CLIENT_CONTROLLED_BYPASS`](super::anti_patterns::CLIENT_CONTROLLED_BYPASS) |
//! | [`MALFORMED_KEYS`] | an empty key, a 256-character key, a non-ASCII key (raw UTF-8 bytes), the header twice: `400` each | [`NO_KEY_VALIDATION`](super::anti_patterns::NO_KEY_VALIDATION), [`WRONG_ERROR_STATUS`](super::anti_patterns::WRONG_ERROR_STATUS) |
//! | [`MISSING_KEY`] | no key on the endpoint: `400` (with a problem body, else a note) | [`KEY_OPTIONAL`](super::anti_patterns::KEY_OPTIONAL), [`WRONG_ERROR_STATUS`](super::anti_patterns::WRONG_ERROR_STATUS) |
//! | [`IN_FLIGHT`] | a duplicate sent while the first is still running (half the baseline latency later; when it gets the original response or is sent too late, up to two more pairs with half the delay each): `409` with a valid `Retry-After` and a machine-readable code, or, when every pair got the original response, a wait and a replay; every `409` of the concurrency check must carry both too | [`BINARY_KEY_STATE`](super::anti_patterns::BINARY_KEY_STATE), [`UNHELPFUL_IN_FLIGHT`](super::anti_patterns::UNHELPFUL_IN_FLIGHT), [`DUPLICATE_AS_SERVER_ERROR`](super::anti_patterns::DUPLICATE_AS_SERVER_ERROR), [`WRONG_ERROR_STATUS`](super::anti_patterns::WRONG_ERROR_STATUS) |
//! | [`METHOD_IDEMPOTENCY`] | for a `PUT`, `PATCH` or `DELETE` endpoint: the same request twice without a key, the state (count URL, `GET` of the endpoint's URL) read before, after the first and after the repeat: the repeat changes nothing (a `400` for the keyless request passes too); N/A for other methods or when nothing shows the state | [`METHOD_NOT_IDEMPOTENT`](super::anti_patterns::METHOD_NOT_IDEMPOTENT) (`PUT`/`DELETE`), [`KEY_OPTIONAL`](super::anti_patterns::KEY_OPTIONAL) (`PATCH`) |
//! | [`EXPIRY`] | after `window` plus a margin, the first key again: a new execution | [`NEVER_EXPIRES`](super::anti_patterns::NEVER_EXPIRES), [`EXPIRED_KEY_ERROR`](super::anti_patterns::EXPIRED_KEY_ERROR), [`PHANTOM_EXECUTION`](super::anti_patterns::PHANTOM_EXECUTION) (a new `id` while the count URL did not grow) |
//!
//! ## Decisions worth knowing
//!
//! - **N/A, never a vacuous PASS.** A check that cannot observe what it looks for says N/A and
//!   why: the cross-endpoint, cross-scope, refreshed-credential, session-scope and client-bypass
//!   checks are N/A when a completed request's retry executes again (there is no replay to see
//!   or miss); cross-endpoint is N/A when the other endpoint refuses its own request.
//! - **One cause, one finding.** When replay-fidelity shows the key ignored, that is the
//!   report's root cause; the race, the executed mismatch, the byte-level keying, the accepted
//!   malformed or missing keys and the missing in-flight state it also causes are FAILs marked
//!   as its consequences, without an anti-pattern of their own. A global key scope makes the
//!   session-scope check N/A.
//! - **Replay markers.** `Idempotent-Replayed`, `Idempotency-Replayed`, `X-Idempotent-Replayed`,
//!   `X-Idempotency-Replayed` and `X-Idempotency-Replay` with the value `true` (or `1`) mark a
//!   replay; they are not compared as significant headers.
//! - **The `Idempotent-Replayed: true` marker.** A replay that is otherwise faithful but
//!   unmarked is a PASS with a note, not a FAIL: the marker is Stripe's convention and Oncely's
//!   contract, but the IETF draft does not require it, and an unmarked faithful replay breaks no
//!   client. A replay that differs from the original is a FAIL whether marked or not.
//! - **Mismatch status.** `422` passes (the IETF draft's choice). `400` (Stripe) and `409`
//!   (Resend) pass with a note: a `409` is retried by many generic retry loops, and a `400` cannot
//!   be told from a validation error without its code. Any other 4xx passes with a note.
//! - **Significant headers** compared in a replay: `Location`, `Content-Type`,
//!   `Content-Location`, `ETag`, `Link` and every `x-*` header except per-exchange ones
//!   (`x-request-id`, `x-ratelimit-*`, timing and cache diagnostics). `Date` is ignored.
//! - **Counting executions.** Distinct `id` (or `data.id`) values in the 2xx bodies; without
//!   ids, distinct 2xx bodies; with a count URL, also its growth (which counts other traffic on a
//!   shared deployment too: audit a quiet one).
//! - **A missing key on `PUT`/`DELETE`** is a PASS with a note when accepted: those methods are
//!   idempotent by RFC 9110 section 9.2.2, and Oncely accepts but does not require a key on them.
//!   Whether the endpoint really is idempotent is [`METHOD_IDEMPOTENCY`]'s question.
//! - **A control for every header probe.** A change seen with client-controlled headers is
//!   compared with the same requests without them before it is blamed on them: a middleware
//!   whose record completes just after its response answers an immediate retry with a correct
//!   in-flight `409`, headers or not, and replays once the record is complete. Only a change
//!   the control does not show is a FAIL; a change the control shows too, and no wait
//!   resolves, leaves the check INCONCLUSIVE.
//! - **Webhook receivers** are audited like any API: the key goes where the receiver reads it
//!   ([`AuditConfig::key_placement`](super::AuditConfig::key_placement): a header such as
//!   `webhook-id`, or a JSON Pointer such as `/id`), and with a webhook secret every request is
//!   signed afresh as a Standard Webhooks sender signs it, so the checks see what a real
//!   sender's redeliveries would see. The second caller is another sender (its own secret).

pub(crate) mod bypass;
pub(crate) mod concurrency;
pub(crate) mod credentials;
pub(crate) mod expiry;
pub(crate) mod in_flight;
pub(crate) mod keys;
pub(crate) mod method;
pub(crate) mod replay;
pub(crate) mod variants;

use super::probe::{Counted, Exchange, Probe, ProbeError, Prober};
use super::report::{CheckResult, Status};
use http::HeaderValue;

/// N identical requests with one key, fired at once.
pub const CONCURRENCY: &str = "concurrency";
/// The same request again after completion.
pub const REPLAY_FIDELITY: &str = "replay-fidelity";
/// The same key with a different body.
pub const PAYLOAD_MISMATCH: &str = "payload-mismatch";
/// The same JSON reordered, with other whitespace.
pub const CANONICAL_JSON: &str = "canonical-json";
/// The same key on another endpoint.
pub const CROSS_ENDPOINT: &str = "cross-endpoint";
/// The same key under another credential.
pub const CROSS_SCOPE: &str = "cross-scope";
/// Empty, too long, non-ASCII and repeated keys.
pub const MALFORMED_KEYS: &str = "malformed-keys";
/// No key at all.
pub const MISSING_KEY: &str = "missing-key";
/// A duplicate of a request still being processed.
pub const IN_FLIGHT: &str = "in-flight";
/// The same key and body under another token of the same account.
pub const REFRESHED_CREDENTIAL: &str = "refreshed-credential";
/// The same key and body under another credential presenting the first one's session cookies.
pub const SESSION_SCOPE: &str = "session-scope";
/// Requests carrying the replay and cache headers some middlewares trust.
pub const CLIENT_BYPASS: &str = "client-bypass";
/// A `PUT`, `PATCH` or `DELETE` sent twice without a key.
pub const METHOD_IDEMPOTENCY: &str = "method-idempotency";
/// The same key after the replay window.
pub const EXPIRY: &str = "expiry";
/// The pseudo-check reported (as INCONCLUSIVE) when the configuration is invalid or the HTTP
/// client cannot be built: nothing was sent.
pub const CONFIGURATION: &str = "configuration";

/// Every check, in report order.
pub const ALL: [&str; 14] = [
    CONCURRENCY,
    REPLAY_FIDELITY,
    PAYLOAD_MISMATCH,
    CANONICAL_JSON,
    CROSS_ENDPOINT,
    CROSS_SCOPE,
    REFRESHED_CREDENTIAL,
    SESSION_SCOPE,
    CLIENT_BYPASS,
    MALFORMED_KEYS,
    MISSING_KEY,
    IN_FLIGHT,
    METHOD_IDEMPOTENCY,
    EXPIRY,
];

/// The first successful request and its key, which the replay, mismatch, canonical-JSON,
/// scope and expiry checks reuse.
#[derive(Clone)]
pub(crate) struct Baseline {
    pub(crate) key: HeaderValue,
    pub(crate) original: Exchange,
    /// The answer to its retry (replay-fidelity's second request), when there was one: the
    /// client-bypass check learns from it which headers the server adds to a replay.
    pub(crate) replay: Option<Exchange>,
    /// Whether a retry of it got a replay (not a new execution): replay-fidelity neither found
    /// the key ignored nor was inconclusive. The checks that look for a replay where there
    /// must be none (another endpoint, another caller) or where there must be one (a refreshed
    /// token, a bypass header) are N/A without it: their verdict would say nothing.
    pub(crate) replays: bool,
}

/// The N/A reason of a check that needs working replays.
pub(crate) const NO_REPLAYS: &str = "a retry of the baseline request after it completed executed again (see replay-fidelity), so there is no replay whose presence or absence this check could observe";

/// One check being recorded: its evidence so far, then its verdict.
pub(crate) struct Rec {
    name: &'static str,
    title: &'static str,
    pub(crate) evidence: Vec<String>,
}

impl Rec {
    pub(crate) fn new(name: &'static str, title: &'static str) -> Self {
        Self {
            name,
            title,
            evidence: Vec::new(),
        }
    }

    /// Sends `probe`, recording the request and the response (or the failure).
    pub(crate) async fn send(&mut self, p: &Prober, probe: &Probe) -> Result<Exchange, ProbeError> {
        let res = p.send(probe).await;
        self.record(p, probe, &res);
        res
    }

    /// Records a request and what came back.
    pub(crate) fn record(&mut self, p: &Prober, probe: &Probe, res: &Result<Exchange, ProbeError>) {
        match res {
            Ok(ex) => {
                self.evidence.push(ex.request.clone());
                self.evidence.push(ex.response_line());
            }
            Err(e) => {
                self.evidence.push(p.describe(probe));
                self.evidence.push(format!("< no response: {e}"));
            }
        }
    }

    /// Reads the count URL (if configured), recording the reading.
    pub(crate) async fn count(&mut self, p: &Prober) -> Option<u64> {
        match p.count().await? {
            Ok(Counted { n, evidence }) => {
                self.evidence.push(evidence);
                Some(n)
            }
            Err(e) => {
                self.evidence.push(e);
                None
            }
        }
    }

    pub(crate) fn note(&mut self, line: impl Into<String>) {
        self.evidence.push(line.into());
    }

    fn finish(
        self,
        status: Status,
        anti_pattern: Option<&'static str>,
        detail: String,
    ) -> CheckResult {
        CheckResult {
            name: self.name,
            title: self.title,
            status,
            anti_pattern,
            consequence_of: None,
            evidence: self.evidence,
            detail,
        }
    }

    pub(crate) fn pass(self, detail: impl Into<String>) -> CheckResult {
        self.finish(Status::Pass, None, detail.into())
    }

    pub(crate) fn fail(self, anti_pattern: &'static str, detail: impl Into<String>) -> CheckResult {
        self.finish(Status::Fail, Some(anti_pattern), detail.into())
    }

    pub(crate) fn not_applicable(self, detail: impl Into<String>) -> CheckResult {
        self.finish(Status::NotApplicable, None, detail.into())
    }

    pub(crate) fn inconclusive(self, detail: impl Into<String>) -> CheckResult {
        self.finish(Status::Inconclusive, None, detail.into())
    }
}

/// `after - before` when both readings exist.
pub(crate) fn delta(before: Option<u64>, after: Option<u64>) -> Option<i64> {
    Some(after? as i64 - before? as i64)
}

/// Whether `later` (sent with `original`'s key) evidently ran the request again.
///
/// `Some(true)`: the count URL grew, or the ids differ, or (no ids, no count, no marker) the
/// bodies differ. `Some(false)`: the response is marked as a replay, or carries the same id, or
/// the count did not grow. `None`: nothing tells (no count URL, no ids, no marker, same body).
pub(crate) fn executed_again(
    original: &Exchange,
    later: &Exchange,
    delta: Option<i64>,
) -> Option<bool> {
    if delta.is_some_and(|d| d > 0) {
        return Some(true);
    }
    if later.marked_replay() {
        return Some(false);
    }
    if let (Some(a), Some(b)) = (original.id(), later.id()) {
        return Some(a != b);
    }
    if delta == Some(0) {
        return Some(false);
    }
    if original.body != later.body {
        return Some(true);
    }
    None
}

/// "`id` pay_1" or "the body" — how a response is identified in details.
pub(crate) fn ident(ex: &Exchange) -> String {
    match ex.id() {
        Some(id) => format!("id {id}"),
        None => format!("a {}-byte body", ex.body.len()),
    }
}

/// Whether the body of a 2xx duplicate is byte-identical to the original's, status included.
pub(crate) fn same_response(a: &Exchange, b: &Exchange) -> bool {
    a.status == b.status && a.body == b.body
}
