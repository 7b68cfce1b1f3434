//! The anti-patterns a FAIL can name ([`CheckResult::anti_pattern`](super::CheckResult::anti_pattern)):
//! stable strings, safe to match on.

/// Duplicates sent together executed more than once: the server looks the key up, then
/// inserts it, and both requests passed the look-up in between. The claim must be one
/// atomic operation arbitrated by the store's primary key.
pub const CHECK_THEN_INSERT_RACE: &str = "check-then-insert race";
/// A duplicate sent while the first request was still running executed again (or got an
/// empty or partial "replay"): the key is recorded only when the request completes, so there
/// is no in-flight state, and a retry sent while the first runs (after a proxy or client
/// timeout) executes again.
pub const BINARY_KEY_STATE: &str = "binary key state (no in-flight state)";
/// A `409` for an in-flight duplicate without a valid `Retry-After` or without a
/// machine-readable code: clients cannot tell it from a mismatch or know when to retry
/// (`Retry-After`, RFC 9110 section 10.2.3).
pub const UNHELPFUL_IN_FLIGHT: &str = "in-flight conflict without Retry-After or code";
/// A different body under a used key got the stored response: the request was not
/// fingerprinted, so the caller is told a request it never made succeeded.
pub const SILENT_MISMATCH_REPLAY: &str = "silent replay of a different payload";
/// A different body under a used key was executed as a new request.
pub const MISMATCH_EXECUTED: &str = "different payload executed under a reused key";
/// The same JSON with keys reordered or other whitespace was rejected as a mismatch: the
/// fingerprint hashes bytes, not the canonical JSON (RFC 8785).
pub const FALSE_MISMATCH: &str = "byte-level fingerprint (false mismatch)";
/// The same JSON with keys reordered or other whitespace executed again: the body bytes are
/// part of the key, not its canonical JSON (RFC 8785).
pub const BYTE_LEVEL_KEYING: &str = "byte-level fingerprint (executed again)";
/// A retry after completion executed again: the key is ignored.
pub const KEY_IGNORED: &str = "key ignored (request executed again)";
/// A replay's status or body differs from the original response.
pub const REPLAY_DIFFERS: &str = "replay differs from original";
/// A replay lacks (or changes) headers the original carried (`Location`, `Content-Type`,
/// custom `x-` headers).
pub const REPLAY_DROPS_HEADERS: &str = "replay drops headers";
/// The same key on another endpoint replayed the first endpoint's response: the key is not
/// bound to the request it was first used for.
pub const CROSS_ENDPOINT_REPLAY: &str = "key not bound to the endpoint (cross-endpoint replay)";
/// Another caller's request with the same key got the first caller's response, or a
/// conflict that reveals the key was used: keys are looked up without the caller's scope.
pub const GLOBAL_KEY_SCOPE: &str = "global key scope";
/// A malformed key (empty, over 255 characters, non-ASCII, repeated header) was accepted
/// and executed.
pub const NO_KEY_VALIDATION: &str = "no key validation";
/// A `POST`/`PATCH` without a key was executed: keyless retries of it are unprotected.
pub const KEY_OPTIONAL: &str = "key optional on a state-changing endpoint";
/// A duplicate or a key error was answered with a 5xx (e.g. a unique violation surfaced as
/// `500`): a generic client retries a 5xx, so the error invites more duplicates.
pub const DUPLICATE_AS_SERVER_ERROR: &str = "duplicate surfaced as a server error";
/// An idempotency error was answered with an unexpected status (e.g. `422` for an in-flight
/// duplicate, `428` for a missing key).
pub const WRONG_ERROR_STATUS: &str = "wrong error status";
/// The key still replayed after the replay window had passed.
pub const NEVER_EXPIRES: &str = "replay window not enforced (key never expires)";
/// The key, reused after the replay window, was rejected instead of executing as new.
pub const EXPIRED_KEY_ERROR: &str = "expired key rejected instead of executed";
/// The key, reused after the replay window, got a success naming a new resource (a new
/// `id`), but the count URL did not grow: the response describes a resource that was never
/// stored. Typically the business row is keyed by the idempotency key alone, so the new
/// execution's insert hits the old row's unique constraint and silently does nothing
/// (`ON CONFLICT DO NOTHING`) while the handler answers as if it had created it.
pub const PHANTOM_EXECUTION: &str = "success for a resource that was not stored";
/// A retry under another token of the same account (a refreshed credential) executed
/// again or was refused: the `Authorization` header, or a hash of it, is part of the key or
/// its fingerprint, so a token refresh between two attempts charges twice.
pub const CREDENTIAL_IN_KEY: &str =
    "credential hashed into the key (a refreshed token executes again)";
/// Another caller presenting the first caller's session cookie got the first caller's
/// stored response: the records live in (or are looked up by) the session, not the
/// authenticated caller.
pub const SESSION_SCOPED_RECORDS: &str =
    "idempotency records scoped by the session cookie, not the caller";
/// A request header the client controls (a replay marker such as `Idempotent-Replayed` or
/// `X-Idempotency-Replay`, or `Cache-Control: no-cache`) changed the outcome: a replay was
/// skipped, or the key was wedged in flight for ever.
pub const CLIENT_CONTROLLED_BYPASS: &str =
    "client-controlled bypass (a request header changes deduplication)";
/// A `PUT` or `DELETE` sent twice without a key changed the state twice (a `PUT` that
/// appends, a `DELETE` that decrements): the method is idempotent by RFC 9110 section
/// 9.2.2, so clients and proxies retry it without a key, and every retry is a duplicate.
pub const METHOD_NOT_IDEMPOTENT: &str = "the method promises idempotency; this endpoint is not";
