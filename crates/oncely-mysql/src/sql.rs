//! Every statement the store runs, as `&'static str` constants, except the reaper's `DELETE`
//! (its list of primary keys is as long as the batch it locked, see [`REAP_DELETE_HEAD`]).
//! Parameters are positional (`?`, bound in the order the docs list them); all times are epoch
//! milliseconds from the store's clock. `key` is a reserved word in MySQL, hence `` `key` ``.
//!
//! Row counts: sqlx connects with `CLIENT_FOUND_ROWS`, so an `UPDATE` reports the rows its
//! `WHERE` matched, also those it left unchanged (a renewal to the same millisecond). 0 rows is
//! thus "no such row in that state", which the owner writes read as fenced.

/// The columns a [`Record`](oncely_core::Record) is read from (by name, see
/// `crate::row::record_from_row`).
macro_rules! record_columns {
    () => {
        "scope, `key`, fingerprint_version, fingerprint, token, state, lease_expires_at, \
         recovery_point, completed_at, response_status, response_headers, response_body, \
         response_body_retained, request, created_at, expires_at, redrive_attempts, \
         redrive_next_at, marked_at"
    };
}

/// sqlx's bookkeeping table for this crate's migrations. Not the default `_sqlx_migrations`, so
/// that an application that runs its own sqlx migrations against the same database keeps its
/// own history (sqlx refuses to run when its table lists versions it does not know).
pub(crate) const MIGRATIONS_TABLE: &str = "_oncely_migrations";

/// Takes the migration runs' named lock of this database, waiting up to the bound number of
/// seconds: 1 when taken, 0 after the wait, NULL on an error. The name is at most 64 characters
/// (MySQL's limit) whatever the database's name.
pub(crate) const MIGRATE_LOCK: &str =
    "SELECT GET_LOCK(CONCAT('oncely_migrate_', MD5(DATABASE())), ?)";

/// Releases [`MIGRATE_LOCK`]'s lock.
pub(crate) const MIGRATE_UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT('oncely_migrate_', MD5(DATABASE())))";

/// What begins every claim and phase transaction, in one message (the text protocol runs the
/// three statements in one round trip):
///
/// - `innodb_lock_wait_timeout = 4`: the bound of a lock wait, in seconds (InnoDB's unit), for
///   this transaction and the session after it, never the server's 50-second default; a
///   duplicate that waits for the first request's open transaction is answered in flight after
///   it (see `MySqlStore::TX_LOCK_TIMEOUT`);
/// - `BEGIN`, at the session's isolation level (InnoDB's default is `REPEATABLE READ`; the claim
///   reads with a locking read, which sees the latest committed version at any level);
/// - `SAVEPOINT oncely_tx`: the transaction's marker. A `COMMIT` or `ROLLBACK` that the handler
///   runs through its `Tx`, or a rollback by the server (a deadlock), removes it, so that
///   [`GUARD`] fails with error 1305 once the transaction is no longer this one.
pub(crate) const BEGIN: &str =
    "SET SESSION innodb_lock_wait_timeout = 4; BEGIN; SAVEPOINT oncely_tx";

/// Whether the transaction that [`BEGIN`] opened is still open: fails with 1305 ("SAVEPOINT
/// oncely_tx does not exist") when it ended; else releases the marker and sets it again (the
/// second statement runs only if the first succeeded), one round trip.
pub(crate) const GUARD: &str = "RELEASE SAVEPOINT oncely_tx; SAVEPOINT oncely_tx";

/// The errors of the statement before, without clearing them (a diagnostic statement): tells a
/// transaction the server rolled back (a deadlock, 1213) from one the handler ended itself.
pub(crate) const LAST_ERRORS: &str = "SHOW ERRORS";

/// The session settings [`crate::MySqlStore::connect`] gives every connection of its pools: the
/// lock-wait bound of [`BEGIN`] (for statements outside a claim or phase transaction, such as the
/// pool-level renewal), and a strict `sql_mode` (a value too long for its column is an error, not
/// silently cut; `STRICT_TRANS_TABLES` is added when neither strict mode is set).
pub(crate) const SESSION_SETTINGS: &str = "SET SESSION innodb_lock_wait_timeout = 4, \
    sql_mode = IF(FIND_IN_SET('STRICT_TRANS_TABLES', @@SESSION.sql_mode) > 0 \
                  OR FIND_IN_SET('STRICT_ALL_TABLES', @@SESSION.sql_mode) > 0, \
                  @@SESSION.sql_mode, \
                  CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_TRANS_TABLES'))";

/// Reads one record: scope, key. A consistent (non-locking) read: it never waits for a lock.
pub(crate) const SELECT_RECORD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE scope = ? AND `key` = ?"
);

/// The record the claim's insert found, read with the exclusive lock that insert already took
/// (scope, key): a locking read sees the latest committed version, whatever the isolation level
/// and whatever the transaction read before, so a claim that waited for another transaction's
/// claim decides on what that transaction committed.
pub(crate) const SELECT_RECORD_LOCKED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE scope = ? AND `key` = ? FOR UPDATE"
);

/// [`INSERT_CLAIM`]'s text (a macro, so that [`INSERT_CLAIM_TRY`] can include it).
macro_rules! insert_claim {
    () => {
        "INSERT INTO oncely_idempotency_keys \
         (scope, `key`, fingerprint_version, fingerprint, token, state, lease_expires_at, \
          request, created_at, expires_at) \
         VALUES (?, ?, ?, ?, 1, 'in_flight', ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token)"
    };
}

/// A first claim: scope, key, fingerprint version, digest, lease expiry, request, now,
/// expires_at. The primary key arbitrates: of any number of concurrent inserts, one inserts the
/// row (token 1); the others find it (after waiting for its transaction, if that is still open)
/// and do nothing, never a duplicate-key error (see "Unique violation surfaced as 500" in
/// docs/DESIGN.md).
///
/// `ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token)` changes nothing, and tells the two
/// apart without a `RETURNING` (which MariaDB has and MySQL has not): the table has no
/// `AUTO_INCREMENT` column, so an insert reports a last insert id of 0, and a duplicate reports
/// the existing row's token (at least 1), the documented `LAST_INSERT_ID(expr)` idiom. The row
/// count cannot tell them apart: with `CLIENT_FOUND_ROWS` both are 1. On a duplicate the
/// statement takes an exclusive lock on that index record (a record lock, no gap lock: it is the
/// primary key), so [`SELECT_RECORD_LOCKED`] after it waits for nothing more.
pub(crate) const INSERT_CLAIM: &str = insert_claim!();

/// [`INSERT_CLAIM`] as one try of `MySqlStore::claim_tx` (docs/DESIGN.md, "Duplicates while
/// the first transaction is open"): on MariaDB it does not wait at all for a key that another
/// open transaction holds, and fails at once with error 1205 (the lock wait timeout), for the
/// claim to give its connection back and try again later. The bound rides in the statement:
/// `SET STATEMENT innodb_lock_wait_timeout = 0 FOR` sets the variable for this statement only
/// (MariaDB 10.1.2; 0, "no wait", from 10.3), so the handler's statements after the claim keep
/// the transaction's 4 seconds with no statement to put them back, and a new key's claim stays
/// one statement. It sits in a MariaDB executable comment (`/*M!100600 ... */`, run by MariaDB
/// 10.6 and later, a comment to MySQL). MySQL 8 has no `SET STATEMENT`; its `SET_VAR` hint
/// takes no InnoDB variable (Percona Server documents adding that as its own extension); and
/// its `innodb_lock_wait_timeout` is at least 1 second: there a try waits for the key with the
/// transaction's bound (4 seconds), as before, holding its connection (not run on MySQL here).
/// Verified on MariaDB 10.11 only: prepared with its placeholders, error 1205 at once on a held
/// key, the session's value unchanged after it.
pub(crate) const INSERT_CLAIM_TRY: &str = concat!(
    "/*M!100600 SET STATEMENT innodb_lock_wait_timeout = 0 FOR */ ",
    insert_claim!()
);

/// A takeover of a lapsed lease: a new token and lease; the fingerprint, recovery point,
/// `created_at`, the original request and the completer's attempts are kept (the same request
/// resumes). New token, lease expiry, request (kept only if the record has none), expires_at;
/// then scope, key and the token that was read. The claim holds the row's lock since its insert
/// found it, so the row is still what `decide` looked at; the token guard says so in the
/// statement.
pub(crate) const CLAIM_TAKEOVER: &str = "UPDATE oncely_idempotency_keys SET token = ?, \
    lease_expires_at = ?, request = COALESCE(request, ?), expires_at = ? \
    WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_flight' AND marked_at IS NULL";

/// A brand-new claim over a released record or one past its replay window: every column is
/// rewritten. New token, fingerprint version, digest, lease expiry, request, now, expires_at;
/// then scope, key and the token that was read.
pub(crate) const CLAIM_ANEW: &str = "UPDATE oncely_idempotency_keys SET token = ?, \
    fingerprint_version = ?, fingerprint = ?, state = 'in_flight', lease_expires_at = ?, \
    recovery_point = NULL, completed_at = NULL, response_status = NULL, \
    response_headers = NULL, response_body = NULL, response_body_retained = NULL, \
    request = ?, created_at = ?, expires_at = ?, redrive_attempts = 0, \
    redrive_next_at = NULL, marked_at = NULL \
    WHERE scope = ? AND `key` = ? AND token = ?";

/// The owner-write guard, bound last: scope, key, token. 0 rows means fenced.
macro_rules! owner_guard {
    () => {
        " WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_flight'"
    };
}

/// Renews the lease: the new lease expiry, then the owner guard.
pub(crate) const RENEW: &str = concat!(
    "UPDATE oncely_idempotency_keys SET lease_expires_at = ?",
    owner_guard!()
);

/// Records a committed phase: recovery point, lease expiry, the request deferred from a claim
/// inside the caller's transaction (NULL for none; a stored one is kept), then the owner guard.
pub(crate) const CHECKPOINT: &str = concat!(
    "UPDATE oncely_idempotency_keys SET recovery_point = ?, lease_expires_at = ?, \
     request = COALESCE(request, ?)",
    owner_guard!()
);

/// Stores the response: now, status, encoded headers, body, body retained, expires_at, then the
/// owner guard. The recovery point is cleared (it only means something in flight), and so is the
/// stored request (only the completer reads it, and only from in-flight records).
pub(crate) const COMPLETE: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'complete', lease_expires_at = NULL, \
     recovery_point = NULL, request = NULL, completed_at = ?, response_status = ?, \
     response_headers = ?, response_body = ?, response_body_retained = ?, expires_at = ?",
    owner_guard!()
);

/// Releases the claim (the owner guard only): the record behaves as absent, its token stays so
/// tokens keep growing; the stored request is dropped, as on completion.
pub(crate) const RELEASE: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'released', lease_expires_at = NULL, \
     recovery_point = NULL, request = NULL",
    owner_guard!()
);

/// One reaper batch, first step: now, batch size. Walks the `expires_at` index from the oldest
/// row, stops after the batch, and locks the rows it returns; `SKIP LOCKED` (MySQL 8.0.1,
/// MariaDB 10.6) passes over rows a claim or a phase is writing right now (a later batch reaps
/// them, after re-checking their `expires_at`), so the reaper never waits for a claim and a
/// claim waits for the reaper at most one batch.
pub(crate) const REAP_SELECT: &str = "SELECT scope, `key`, state FROM oncely_idempotency_keys \
    WHERE expires_at <= ? ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED";

/// The second step, built per batch: this head, then one `(?, ?)` per row [`REAP_SELECT`]
/// locked, joined by commas, then `)`. The rows are held by that lock, so the `DELETE` deletes
/// exactly them (MariaDB's `DELETE ... RETURNING` would do it in one statement, MySQL has none).
pub(crate) const REAP_DELETE_HEAD: &str =
    "DELETE FROM oncely_idempotency_keys WHERE (scope, `key`) IN (";

/// Abandoned in-flight records: cutoff (now minus grace), now, limit; through the index on
/// `(marked_at, lease_expires_at)`, skipping those inside the completer's backoff.
pub(crate) const LIST_ABANDONED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE marked_at IS NULL AND lease_expires_at <= ? \
     AND state = 'in_flight' AND (redrive_next_at IS NULL OR redrive_next_at <= ?) \
     ORDER BY lease_expires_at, scope, `key` LIMIT ?"
);

/// The guard of the completer's notes, bound after the new value: scope, key, token, now,
/// attempts seen (in flight with the token, lease lapsed, not marked, the attempts the
/// completer saw).
macro_rules! redrive_guard {
    () => {
        " WHERE scope = ? AND `key` = ? AND token = ? AND state = 'in_flight' \
          AND lease_expires_at <= ? AND marked_at IS NULL AND redrive_attempts = ?"
    };
}

/// Counts one re-drive attempt: the next attempt time (now plus the backoff), then the guard.
pub(crate) const NOTE_ATTEMPT: &str = concat!(
    "UPDATE oncely_idempotency_keys SET redrive_attempts = redrive_attempts + 1, \
     redrive_next_at = ?",
    redrive_guard!()
);

/// Marks the record for a person: now, then the guard.
pub(crate) const NOTE_MARK: &str = concat!(
    "UPDATE oncely_idempotency_keys SET marked_at = ?",
    redrive_guard!()
);

/// The completer's columns after a note (scope, key), read in the note's transaction, which
/// holds the row's lock since its `UPDATE` (no `RETURNING` on MySQL).
pub(crate) const SELECT_REDRIVES: &str = "SELECT redrive_attempts, redrive_next_at, marked_at \
    FROM oncely_idempotency_keys WHERE scope = ? AND `key` = ?";

/// In-flight records marked for a person, oldest mark first, through the leases index: limit.
pub(crate) const LIST_MARKED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE marked_at IS NOT NULL AND state = 'in_flight' \
     ORDER BY marked_at, scope, `key` LIMIT ?"
);

/// One page of the operator's listing ([`oncely_core::Operator::list_records`]), in primary
/// key order from the cursor, with every filter but the route (applied to the page read). Bound
/// in order: scope or NULL (twice), the cursor's scope, scope and key (`''`: the start), in
/// flight only (0/1), marked only, abandoned only, now, the latest creation time or NULL
/// (twice), the limit. Released records are never listed.
pub(crate) const LIST_RECORDS: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state <> 'released' \
     AND (? IS NULL OR scope = ?) AND (scope > ? OR (scope = ? AND `key` > ?)) \
     AND (? = 0 OR state = 'in_flight') \
     AND (? = 0 OR (state = 'in_flight' AND marked_at IS NOT NULL)) \
     AND (? = 0 OR (state = 'in_flight' AND marked_at IS NULL AND lease_expires_at <= ?)) \
     AND (? IS NULL OR created_at <= ?) \
     ORDER BY scope, `key` LIMIT ?"
);

/// The guard of every operator change: the record is still the version read. Bound: scope,
/// key, the token read, the state read.
macro_rules! operator_guard {
    () => {
        " WHERE scope = ? AND `key` = ? AND token = ? AND state = ?"
    };
}

/// The operator's release: released, the token raised, everything of the request dropped.
/// Bound: the new token, the guard, force (0/1: a live lease too), now.
pub(crate) const RELEASE_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'released', token = ?, \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = NULL, \
     response_headers = NULL, response_body = NULL, response_body_retained = NULL, \
     completed_at = NULL, redrive_attempts = 0, redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state <> 'released' AND (? = 1 OR state <> 'in_flight' OR lease_expires_at <= ?)"
);

/// The operator's resolve: complete with the decided response, the token raised. Bound: the
/// new token, status, headers, body, body retained, now (the completion time), expires at, the
/// guard, force, now.
pub(crate) const RESOLVE_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'complete', token = ?, \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = ?, \
     response_headers = ?, response_body = ?, response_body_retained = ?, \
     completed_at = ?, expires_at = ?, redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state = 'in_flight' AND (? = 1 OR lease_expires_at <= ?)"
);

/// The operator's retry: the mark lifted, the attempts set, no backoff, the token raised.
/// Bound: the new token, the attempts, the guard.
pub(crate) const RETRY_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET token = ?, redrive_attempts = ?, \
     redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state = 'in_flight' AND marked_at IS NOT NULL AND request IS NOT NULL"
);
