//! Every SQL statement the store runs, as `&'static str` constants (no statement is built at run
//! time). Parameters are numbered (`?1`); all times are integer epoch milliseconds.

/// The record columns, in the order [`crate::row::decode_record`] reads them.
macro_rules! record_columns {
    () => {
        "scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, \
         recovery_point, response_status, response_headers, response_body, \
         response_body_retained, completed_at, created_at, expires_at, request, \
         redrive_attempts, redrive_next_at, marked_at"
    };
}

/// One record by `(scope, key)`. `?1` scope, `?2` key.
pub(crate) const SELECT_ONE: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE scope = ?1 AND key = ?2"
);

/// [`INSERT_CLAIM`]'s text (a macro, so that [`READ_THEN_CLAIM`] can include it).
macro_rules! insert_claim {
    () => {
        "INSERT INTO oncely_idempotency_keys \
         (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, \
          recovery_point, created_at, expires_at, request) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'in_flight', ?6, NULL, ?7, ?8, ?9) \
         ON CONFLICT (scope, key) DO NOTHING"
    };
}
/// The claim of an absent key: the primary key arbitrates, a conflict inserts nothing (and is the
/// normal "record exists" path, never an error). `?1` scope, `?2` key, `?3` fingerprint version,
/// `?4` digest, `?5` token, `?6` lease expiry, `?7` created at, `?8` expires at, `?9` request.
pub(crate) const INSERT_CLAIM: &str = insert_claim!();

/// The first hop of a transactional claim ([`crate::SqliteStore::claim_tx`]), three statements
/// sent to the connection's worker thread at once: the plain read of the record ([`SELECT_ONE`],
/// in autocommit: it takes no lock), then `BEGIN IMMEDIATE` and the claim's insert
/// ([`INSERT_CLAIM`], returning the token it wrote). Run with `fetch_optional`, which stops at
/// the first row: when the record exists its row is that first row and neither `BEGIN
/// IMMEDIATE` nor the insert runs, so a replay never queues for the write lock. The parameters
/// are [`INSERT_CLAIM`]'s (the read uses `?1` scope and `?2` key).
pub(crate) const READ_THEN_CLAIM: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE scope = ?1 AND key = ?2; BEGIN IMMEDIATE; ",
    insert_claim!(),
    " RETURNING token"
);

/// Hands a transaction that [`READ_THEN_CLAIM`] opened to sqlx's transaction bookkeeping (sqlx
/// runs a custom begin statement and checks that a transaction is then open; this one opens
/// nothing new). sqlx's commit and rollback then end the whole transaction.
/// The savepoint is also the transaction's guard (`oncely_sqlx`'s phase writes check it: a `COMMIT` run
/// behind the phase's back removes it), the one [`BEGIN_GUARDED`] opens.
pub(crate) const ADOPT_TRANSACTION: &str = "SAVEPOINT oncely_tx";

/// The claim of an existing key that [`oncely_core::decide`] granted (takeover, released, or past
/// the replay window), conditional on the token that was read. `?1` fingerprint version, `?2`
/// digest, `?3` new token, `?4` lease expiry, `?5` recovery point, `?6` created at, `?7` expires
/// at, `?8` request, `?9` scope, `?10` key, `?11` the token read, `?12` the completer's attempts
/// and `?13` its next attempt time (kept by a takeover, 0 and NULL otherwise).
pub(crate) const UPDATE_CLAIM: &str = "UPDATE oncely_idempotency_keys SET \
     fingerprint_version = ?1, fingerprint = ?2, token = ?3, state = 'in_flight', \
     lease_expires_at = ?4, recovery_point = ?5, response_status = NULL, \
     response_headers = NULL, response_body = NULL, response_body_retained = NULL, \
     completed_at = NULL, created_at = ?6, expires_at = ?7, request = ?8, \
     redrive_attempts = ?12, redrive_next_at = ?13, marked_at = NULL \
     WHERE scope = ?9 AND key = ?10 AND token = ?11";

/// Renew a lease. `?1` lease expiry, `?2` scope, `?3` key, `?4` token.
pub(crate) const RENEW: &str = "UPDATE oncely_idempotency_keys SET lease_expires_at = ?1 \
     WHERE scope = ?2 AND key = ?3 AND token = ?4 AND state = 'in_flight'";

/// Record a recovery point and renew the lease. `?1` recovery point, `?2` lease expiry, `?3`
/// scope, `?4` key, `?5` token.
macro_rules! checkpoint {
    () => {
        "UPDATE oncely_idempotency_keys \
         SET recovery_point = ?1, lease_expires_at = ?2 \
         WHERE scope = ?3 AND key = ?4 AND token = ?5 AND state = 'in_flight'"
    };
}
pub(crate) const CHECKPOINT: &str = checkpoint!();

/// [`CHECKPOINT`] that also stores the request deferred from a claim inside the caller's
/// transaction: `?6` the encoded request (a stored one is kept).
macro_rules! checkpoint_with_request {
    () => {
        "UPDATE oncely_idempotency_keys \
         SET recovery_point = ?1, lease_expires_at = ?2, request = COALESCE(request, ?6) \
         WHERE scope = ?3 AND key = ?4 AND token = ?5 AND state = 'in_flight'"
    };
}
pub(crate) const CHECKPOINT_WITH_REQUEST: &str = checkpoint_with_request!();
/// [`CHECKPOINT_WITH_REQUEST`] (`?6` may be NULL: no deferred request) in the transaction of a
/// phase, after releasing the savepoint the transaction opened with (`oncely_tx`, see
/// [`BEGIN_GUARDED`]): "no such savepoint" means the transaction ended behind the phase's back;
/// one hop for both. It returns the token of the row it changed (`fetch_optional`: a
/// multi-statement query's rows-affected count would also count the transaction's earlier
/// changes, which SQLite reports again after the `RELEASE`).
pub(crate) const CHECKPOINT_GUARDED: &str = concat!(
    "RELEASE SAVEPOINT oncely_tx; ",
    checkpoint_with_request!(),
    " RETURNING token"
);

/// Store the response. `?1` status, `?2` headers, `?3` body, `?4` body retained (0/1), `?5`
/// completed at, `?6` expires at, `?7` scope, `?8` key, `?9` token. The stored request is
/// dropped: only the completer reads it, and only from in-flight records.
macro_rules! complete {
    () => {
        "UPDATE oncely_idempotency_keys SET state = 'complete', \
         lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = ?1, \
         response_headers = ?2, response_body = ?3, response_body_retained = ?4, \
         completed_at = ?5, expires_at = ?6 \
         WHERE scope = ?7 AND key = ?8 AND token = ?9 AND state = 'in_flight'"
    };
}
pub(crate) const COMPLETE: &str = complete!();
/// [`COMPLETE`] in the transaction of a phase, guarded as [`CHECKPOINT_GUARDED`].
pub(crate) const COMPLETE_GUARDED: &str = concat!(
    "RELEASE SAVEPOINT oncely_tx; ",
    complete!(),
    " RETURNING token"
);

/// Release the key (a tombstone that keeps the token; the stored request is dropped, as on
/// completion). `?1` scope, `?2` key, `?3` token.
pub(crate) const RELEASE: &str = "UPDATE oncely_idempotency_keys SET state = 'released', \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL \
     WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_flight'";

/// One bounded reaper batch, oldest expiry first, through the `expires_at` index; returns the
/// deleted rows' states to count in-flight orphans. `?1` now, `?2` batch size.
pub(crate) const REAP_BATCH: &str = "DELETE FROM oncely_idempotency_keys WHERE rowid IN \
     (SELECT rowid FROM oncely_idempotency_keys WHERE expires_at <= ?1 \
      ORDER BY expires_at LIMIT ?2) \
     RETURNING state";

/// Abandoned in-flight records, oldest lease first, through the partial index on in-flight
/// leases of unmarked records, skipping those inside the completer's backoff. `?1` cutoff (now
/// minus grace), `?2` limit, `?3` now.
pub(crate) const LIST_ABANDONED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state = 'in_flight' AND marked_at IS NULL \
     AND lease_expires_at <= ?1 AND (redrive_next_at IS NULL OR redrive_next_at <= ?3) \
     ORDER BY lease_expires_at LIMIT ?2"
);

/// The guard of the completer's notes: in flight with the token, lease lapsed, not marked, the
/// attempts the completer saw. `?2` scope, `?3` key, `?4` token, `?5` now, `?6` attempts seen.
macro_rules! redrive_guard {
    () => {
        " WHERE scope = ?2 AND key = ?3 AND token = ?4 AND state = 'in_flight' \
          AND lease_expires_at <= ?5 AND marked_at IS NULL AND redrive_attempts = ?6 \
          RETURNING redrive_attempts, redrive_next_at, marked_at"
    };
}

/// Counts one re-drive attempt: `?1` the next attempt time (now plus the backoff).
pub(crate) const NOTE_ATTEMPT: &str = concat!(
    "UPDATE oncely_idempotency_keys SET redrive_attempts = redrive_attempts + 1, \
     redrive_next_at = ?1",
    redrive_guard!()
);

/// Marks the record for a person: `?1` now.
pub(crate) const NOTE_MARK: &str = concat!(
    "UPDATE oncely_idempotency_keys SET marked_at = ?1",
    redrive_guard!()
);

/// In-flight records marked for a person, oldest mark first, through their partial index.
/// `?1` limit.
pub(crate) const LIST_MARKED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state = 'in_flight' AND marked_at IS NOT NULL \
     ORDER BY marked_at, scope, key LIMIT ?1"
);

/// A write transaction of the store (a claim, a phase): `BEGIN IMMEDIATE` takes SQLite's write
/// lock at once (waiting up to the busy timeout), so no other writer can interleave between its
/// reads and writes, and a deferred transaction's read-to-write upgrade (which fails at once
/// with `SQLITE_BUSY_SNAPSHOT` in WAL mode) never happens; and the savepoint `oncely_tx` tells
/// later whether the transaction is still this one (see [`ADOPT_TRANSACTION`]). One statement,
/// one hop to the connection's thread.
pub(crate) const BEGIN_GUARDED: &str = "BEGIN IMMEDIATE; SAVEPOINT oncely_tx";

/// One page of the operator's listing ([`oncely_core::Operator::list_records`]), in primary
/// key order from the cursor, with every filter but the route (applied to the page read):
/// `?1` scope or NULL, `?2` and `?3` the cursor's scope and key (`''` and `''`: the start),
/// `?4` in flight only (0/1), `?5` marked only, `?6` abandoned only, `?7` now, `?8` the latest
/// creation time or NULL, `?9` the limit. Released records are never listed.
pub(crate) const LIST_RECORDS: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state <> 'released' \
     AND (?1 IS NULL OR scope = ?1) AND (scope > ?2 OR (scope = ?2 AND key > ?3)) \
     AND (?4 = 0 OR state = 'in_flight') \
     AND (?5 = 0 OR (state = 'in_flight' AND marked_at IS NOT NULL)) \
     AND (?6 = 0 OR (state = 'in_flight' AND marked_at IS NULL AND lease_expires_at <= ?7)) \
     AND (?8 IS NULL OR created_at <= ?8) \
     ORDER BY scope, key LIMIT ?9"
);

/// The guard of every operator change: the record is still the version read. `?1` scope,
/// `?2` key, `?3` the token read, `?4` the state read.
macro_rules! operator_guard {
    () => {
        " WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = ?4"
    };
}

/// The operator's release: released, the token raised, everything of the request dropped.
/// `?5` the new token, `?6` force (0/1: a live lease too), `?7` now.
pub(crate) const RELEASE_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'released', token = ?5, \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = NULL, \
     response_headers = NULL, response_body = NULL, response_body_retained = NULL, \
     completed_at = NULL, redrive_attempts = 0, redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state <> 'released' \
     AND (?6 = 1 OR state <> 'in_flight' OR lease_expires_at <= ?7) RETURNING ",
    record_columns!()
);

/// The operator's resolve: complete with the decided response, the token raised. `?5` the new
/// token, `?6` force, `?7` now (the completion time), `?8` status, `?9` headers, `?10` body,
/// `?11` body retained (0/1), `?12` expires at.
pub(crate) const RESOLVE_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'complete', token = ?5, \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = ?8, \
     response_headers = ?9, response_body = ?10, response_body_retained = ?11, \
     completed_at = ?7, expires_at = ?12, redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state = 'in_flight' AND (?6 = 1 OR lease_expires_at <= ?7) RETURNING ",
    record_columns!()
);

/// The operator's retry: the mark lifted, the attempts set, no backoff, the token raised.
/// `?5` the new token, `?6` the attempts.
pub(crate) const RETRY_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET token = ?5, redrive_attempts = ?6, \
     redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state = 'in_flight' AND marked_at IS NOT NULL AND request IS NOT NULL RETURNING ",
    record_columns!()
);
