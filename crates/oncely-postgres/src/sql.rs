//! Every statement the store runs, as `&'static str` constants. Parameters are numbered; all
//! times are epoch milliseconds from the store's clock.

/// The columns a [`Record`](oncely_core::Record) is read from, in the order
/// `record_from_row` expects them.
macro_rules! record_columns {
    () => {
        "scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, \
         recovery_point, completed_at, response_status, response_headers, response_body, \
         response_body_retained, request, created_at, expires_at, redrive_attempts, \
         redrive_next_at, marked_at"
    };
}

/// sqlx's bookkeeping table for this crate's migrations. Not the default `_sqlx_migrations`,
/// so that an application that runs its own sqlx migrations against the same database keeps
/// its own history (sqlx refuses to run when its table lists versions it does not know).
pub(crate) const MIGRATIONS_TABLE: &str = "_oncely_migrations";

/// Reads one record: `$1` scope, `$2` key. A plain MVCC read: it never waits for a lock, so a
/// claim against a key whose owner has a phase transaction open answers at once.
pub(crate) const SELECT_RECORD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE scope = $1 AND key = $2"
);

/// [`INSERT_CLAIM`]'s text (a macro, so that [`INSERT_CLAIM_RESTORING`] can include it).
macro_rules! insert_claim {
    () => {
        "INSERT INTO oncely_idempotency_keys \
         (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, request, \
          created_at, expires_at) \
         VALUES ($1, $2, $3, $4, 1, 'in_flight', $5, $6, $7, $8) \
         ON CONFLICT (scope, key) DO NOTHING"
    };
}

/// A first claim: `$1` scope, `$2` key, `$3` fingerprint version, `$4` digest, `$5` lease
/// expiry, `$6` request, `$7` now, `$8` expires_at. The primary key arbitrates: exactly one of
/// any number of concurrent inserts returns a row; the others do nothing (no unique violation
/// ever surfaces: docs/DESIGN.md, "Unique violation surfaced as 500") and read the winner's
/// record.
///
/// Also the claim inside the caller's transaction (`claim_in`), where an existing record is
/// then read by [`SELECT_RECORD`], a statement of its own: measured with `pgbench` at 8
/// clients, a claim transaction whose claim read the record in the same statement (a `WITH`
/// of this insert, then a `LEFT JOIN` or `UNION ALL` of the record's read) ran at 0.85 to 0.93
/// of the same transaction with this bare insert, because the server sets the read up on
/// every execution, even when it does not run it. A replay thus costs two statements, a first
/// execution one (measured: layer / floor 0.86 with the join, 0.90 to 0.93 with the bare
/// insert, at concurrency 16; replays still ran at about 3 times the first executions' rate).
pub(crate) const INSERT_CLAIM: &str = concat!(insert_claim!(), " RETURNING token");

/// [`INSERT_CLAIM`] for the claimer's transaction, which began with the short
/// [`BEGIN_CLAIM`] lock wait: the row it inserts also restores the transaction's `lock_timeout`
/// to `$9` (the phase's bound) for the handler's statements, in the same statement (a
/// `RETURNING` expression is evaluated only for an inserted row: a claim that inserted nothing
/// restores it with [`RESTORE_LOCK_TIMEOUT`] if it claims at all).
pub(crate) const INSERT_CLAIM_RESTORING: &str = concat!(
    insert_claim!(),
    " RETURNING token, set_config('lock_timeout', $9, true)"
);

/// The claimer's transaction (`PostgresStore::claim_tx`): a claim's wait for a key that another
/// open transaction holds is one try of at most 10 milliseconds
/// (`PostgresStore::CLAIM_TRY_LOCK_TIMEOUT`); between tries the claim holds no connection.
pub(crate) const BEGIN_CLAIM: &str = "BEGIN; SET LOCAL lock_timeout = '10ms'";

/// Restores the transaction's `lock_timeout` to `$1` after a claim of an existing record (a
/// takeover, a claim anew) in the claimer's transaction.
pub(crate) const RESTORE_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

/// The guard every claim `UPDATE` carries: the row must still be exactly the version
/// `decide()` looked at. `$3` token, `$4` state, `$5` lease expiry, `$6` completion time, `$7`
/// recovery point, as read. Every write to a record changes at least one of them (a claim the
/// token; complete and release the state; renew and checkpoint the lease or the recovery
/// point), so a write that slipped in between our read and our update makes the update match
/// 0 rows, and the claim reads again. A guard on the token alone would let a takeover
/// overwrite a record that its owner completed or renewed in the meantime.
macro_rules! claim_guard {
    () => {
        " WHERE scope = $1 AND key = $2 AND token = $3 AND state = $4 \
          AND lease_expires_at IS NOT DISTINCT FROM $5 \
          AND completed_at IS NOT DISTINCT FROM $6 \
          AND recovery_point IS NOT DISTINCT FROM $7"
    };
}

/// A takeover of a lapsed lease: a new token and lease; the fingerprint, recovery point,
/// `created_at`, the original request and the completer's attempts are kept (the same request
/// resumes). `$8` new token, `$9` lease expiry, `$10` request (kept only if the record has
/// none), `$11` expires_at. Never over a record the completer marked for a person meanwhile.
pub(crate) const CLAIM_TAKEOVER: &str = concat!(
    "UPDATE oncely_idempotency_keys SET token = $8, lease_expires_at = $9, \
     request = COALESCE(request, $10), expires_at = $11",
    claim_guard!(),
    " AND marked_at IS NULL"
);

/// A brand-new claim over a released record or one past its replay window: every column is
/// rewritten. `$8` new token, `$9` fingerprint version, `$10` digest, `$11` lease expiry, `$12`
/// request, `$13` now, `$14` expires_at.
pub(crate) const CLAIM_ANEW: &str = concat!(
    "UPDATE oncely_idempotency_keys SET token = $8, fingerprint_version = $9, \
     fingerprint = $10, state = 'in_flight', lease_expires_at = $11, recovery_point = NULL, \
     completed_at = NULL, response_status = NULL, response_headers = NULL, \
     response_body = NULL, response_body_retained = NULL, request = $12, created_at = $13, \
     expires_at = $14, redrive_attempts = 0, redrive_next_at = NULL, marked_at = NULL",
    claim_guard!()
);

/// The owner-write guard: `$1` scope, `$2` key, `$3` token. 0 rows means fenced.
macro_rules! owner_guard {
    () => {
        " WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'"
    };
}

/// Renews the lease (also the fencing write that opens a phase): `$4` the new lease expiry.
pub(crate) const RENEW: &str = concat!(
    "UPDATE oncely_idempotency_keys SET lease_expires_at = $4",
    owner_guard!()
);

/// Records a committed phase: `$4` recovery point, `$5` lease expiry.
pub(crate) const CHECKPOINT: &str = concat!(
    "UPDATE oncely_idempotency_keys SET recovery_point = $4, lease_expires_at = $5",
    owner_guard!()
);

/// [`CHECKPOINT`] that also stores the request deferred from a claim inside the caller's
/// transaction: `$6` the encoded request (a stored one is kept).
pub(crate) const CHECKPOINT_WITH_REQUEST: &str = concat!(
    "UPDATE oncely_idempotency_keys SET recovery_point = $4, lease_expires_at = $5, \
     request = COALESCE(request, $6)",
    owner_guard!()
);

/// Stores the response: `$4` now, `$5` status, `$6` encoded headers, `$7` body, `$8` body
/// retained, `$9` expires_at. The recovery point is cleared (it only means something in flight),
/// and so is the stored request (only the completer reads it, and only from in-flight records).
pub(crate) const COMPLETE: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'complete', lease_expires_at = NULL, \
     recovery_point = NULL, request = NULL, \
     completed_at = $4, response_status = $5, response_headers = $6, response_body = $7, \
     response_body_retained = $8, expires_at = $9",
    owner_guard!()
);

/// Releases the claim: the record behaves as absent, its token stays so tokens keep growing;
/// the stored request is dropped, as on completion.
pub(crate) const RELEASE: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'released', lease_expires_at = NULL, \
     recovery_point = NULL, request = NULL",
    owner_guard!()
);

/// One reaper batch: `$1` now, `$2` batch size. The inner select walks the `expires_at` index
/// from the oldest row and stops after `$2` rows; `FOR UPDATE SKIP LOCKED` passes over rows a
/// claim or a phase is writing right now (they are reaped by a later batch, after their
/// `expires_at` is re-checked), so the reaper never waits for a claim and a claim waits for
/// the reaper at most one batch. Rows are deleted by primary key (not `ctid`), which also works
/// on Postgres-compatible distributed databases.
pub(crate) const REAP: &str = "WITH doomed AS ( \
        SELECT scope, key FROM oncely_idempotency_keys \
        WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED \
    ) \
    DELETE FROM oncely_idempotency_keys t USING doomed \
    WHERE t.scope = doomed.scope AND t.key = doomed.key \
    RETURNING t.scope, t.key, t.state";

/// Abandoned in-flight records: `$1` cutoff (now minus grace), `$2` limit, `$3` now; served by
/// the partial index on in-flight leases of unmarked records, skipping those inside the
/// completer's backoff.
pub(crate) const LIST_ABANDONED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state = 'in_flight' AND marked_at IS NULL \
     AND lease_expires_at <= $1 AND (redrive_next_at IS NULL OR redrive_next_at <= $3) \
     ORDER BY lease_expires_at, scope, key LIMIT $2"
);

/// The guard of the completer's notes: in flight with the token, lease lapsed, not marked, the
/// attempts the completer saw. `$1` scope, `$2` key, `$3` token, `$4` now, `$5` attempts seen.
macro_rules! redrive_guard {
    () => {
        " WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight' \
          AND lease_expires_at <= $4 AND marked_at IS NULL AND redrive_attempts = $5 \
          RETURNING redrive_attempts, redrive_next_at, marked_at"
    };
}

/// Counts one re-drive attempt: `$6` the next attempt time (now plus the backoff).
pub(crate) const NOTE_ATTEMPT: &str = concat!(
    "UPDATE oncely_idempotency_keys SET redrive_attempts = redrive_attempts + 1, \
     redrive_next_at = $6",
    redrive_guard!()
);

/// Marks the record for a person: `$6` now.
pub(crate) const NOTE_MARK: &str = concat!(
    "UPDATE oncely_idempotency_keys SET marked_at = $6",
    redrive_guard!()
);

/// In-flight records marked for a person, oldest mark first, through their partial index.
/// `$1` limit.
pub(crate) const LIST_MARKED: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state = 'in_flight' AND marked_at IS NOT NULL \
     ORDER BY marked_at, scope, key LIMIT $1"
);

/// One page of the operator's listing ([`oncely_core::Operator::list_records`]), in primary
/// key order from the cursor (a row comparison the primary key index serves), with every filter
/// but the route (applied to the page read): `$1` scope or NULL, `$2` and `$3` the cursor's
/// scope and key (`''` and `''`: the start), `$4` in flight only, `$5` marked only, `$6`
/// abandoned only, `$7` now, `$8` the latest creation time or NULL, `$9` the limit. Released
/// records are never listed.
pub(crate) const LIST_RECORDS: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM oncely_idempotency_keys WHERE state <> 'released' \
     AND ($1::text IS NULL OR scope = $1) AND (scope, key) > ($2, $3) \
     AND (NOT $4 OR state = 'in_flight') \
     AND (NOT $5 OR (state = 'in_flight' AND marked_at IS NOT NULL)) \
     AND (NOT $6 OR (state = 'in_flight' AND marked_at IS NULL AND lease_expires_at <= $7)) \
     AND ($8::bigint IS NULL OR created_at <= $8) \
     ORDER BY scope, key LIMIT $9"
);

/// The guard of every operator change: the record is still the version read. `$1` scope,
/// `$2` key, `$3` the token read, `$4` the state read.
macro_rules! operator_guard {
    () => {
        " WHERE scope = $1 AND key = $2 AND token = $3 AND state = $4"
    };
}

/// The operator's release: released, the token raised, everything of the request dropped.
/// `$5` the new token, `$6` force (a live lease too), `$7` now.
pub(crate) const RELEASE_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'released', token = $5, \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = NULL, \
     response_headers = NULL, response_body = NULL, response_body_retained = NULL, \
     completed_at = NULL, redrive_attempts = 0, redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state <> 'released' \
     AND ($6 OR state <> 'in_flight' OR lease_expires_at <= $7) RETURNING ",
    record_columns!()
);

/// The operator's resolve: complete with the decided response, the token raised. `$5` the new
/// token, `$6` force, `$7` now (the completion time), `$8` status, `$9` headers, `$10` body,
/// `$11` body retained, `$12` expires at.
pub(crate) const RESOLVE_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET state = 'complete', token = $5, \
     lease_expires_at = NULL, recovery_point = NULL, request = NULL, response_status = $8, \
     response_headers = $9, response_body = $10, response_body_retained = $11, \
     completed_at = $7, expires_at = $12, redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state = 'in_flight' AND ($6 OR lease_expires_at <= $7) RETURNING ",
    record_columns!()
);

/// The operator's retry: the mark lifted, the attempts set, no backoff, the token raised.
/// `$5` the new token, `$6` the attempts.
pub(crate) const RETRY_RECORD: &str = concat!(
    "UPDATE oncely_idempotency_keys SET token = $5, redrive_attempts = $6, \
     redrive_next_at = NULL, marked_at = NULL",
    operator_guard!(),
    " AND state = 'in_flight' AND marked_at IS NOT NULL AND request IS NOT NULL RETURNING ",
    record_columns!()
);

/// A text value as a constant the planner can match against an index: an escape string
/// constant `E'…'` (PostgreSQL documentation, "String Constants with C-Style Escapes"), which
/// reads backslash escapes whatever the session's `standard_conforming_strings`, with `\`
/// doubled, `'` doubled (never `\'`, which `backslash_quote` may refuse) and a NUL character
/// written `\000` (a simple-query message is NUL-terminated; the server refuses the zero byte
/// in text, as it refuses a bound one). Every other character, multi-byte UTF-8 included,
/// stands for itself: no byte of a multi-byte UTF-8 sequence is `'` or `\`, and sqlx's
/// connections use `client_encoding` UTF8. A function of the value (`convert_from(decode(..))`,
/// the form before) is no index condition: the completion then read the whole table
/// (docs/DESIGN.md, "The completion goes out with the commit").
pub(crate) fn text_literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            '\0' => out.push_str("\\000"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A `bytea` value as a literal: `decode('…', 'hex')`, the quoted part only `0-9a-f` (a
/// value of a column no statement looks up by, so being an expression costs no index).
pub(crate) fn bytea_literal(value: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(value.len() * 2 + 20);
    out.push_str("decode('");
    for b in value {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out.push_str("', 'hex')");
    out
}

/// The value the fenced completion of [`complete_and_commit`] fails on: casting it to
/// `integer` fails with SQLSTATE `22P02` and a message that quotes it.
pub(crate) const FENCED_MARK: &str = "oncely_fenced";

/// As [`FENCED_MARK`], the value [`FAIL_UNLESS_OPEN`] fails on.
pub(crate) const ENDED_MARK: &str = "oncely_transaction_ended";

/// The statement that fails, in the middle of a simple-query message, when the transaction is
/// no longer the phase's: in a transaction block `transaction_timestamp()` is its `BEGIN`'s
/// time, earlier than this message's `statement_timestamp()`; after a `COMMIT` or `ROLLBACK`
/// behind the phase's back the message runs as an implicit transaction of its own, whose two
/// times are the same value. The `CASE` is not a constant (both functions are stable), so the
/// failing cast is evaluated at run time only, never folded by the planner.
pub(crate) const FAIL_UNLESS_OPEN: &str = "SELECT CAST(CASE WHEN transaction_timestamp() <> \
     statement_timestamp() THEN '1' ELSE 'oncely_transaction_ended' END AS integer)";

/// The completion and the commit of a phase as one simple-query message
/// ([`crate::PostgresStore::complete_and_commit_in`]): [`COMPLETE`]'s write with every value a
/// literal (integers formatted, text an escape-string constant, `bytea` hex-encoded: [`text_literal`],
/// [`bytea_literal`]), made to fail when it matched no row (fenced: the cast of
/// [`FENCED_MARK`]), so that the `COMMIT` after it never runs for a fenced phase (a failed
/// statement skips the rest of the message and leaves the transaction aborted); then `COMMIT`,
/// then `BEGIN`, an empty transaction that keeps sqlx's own account (the `Transaction` value
/// still open) true, rolled back by sqlx's queued `ROLLBACK` on the pool's release ping at no
/// round trip of its own. `check_open` puts [`FAIL_UNLESS_OPEN`] first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn complete_and_commit(
    scope: &str,
    key: &str,
    token: i64,
    now: i64,
    status: i32,
    headers: &[u8],
    body: &[u8],
    body_retained: bool,
    expires_at: i64,
    check_open: bool,
) -> String {
    let check = if check_open { FAIL_UNLESS_OPEN } else { "" };
    let sep = if check_open { "; " } else { "" };
    format!(
        "{check}{sep}WITH done AS (UPDATE oncely_idempotency_keys SET state = 'complete', \
         lease_expires_at = NULL, recovery_point = NULL, request = NULL, \
         completed_at = CAST({now} AS bigint), response_status = CAST({status} AS integer), \
         response_headers = {headers}, response_body = {body}, \
         response_body_retained = {body_retained}, expires_at = CAST({expires_at} AS bigint) \
         WHERE scope = {scope} AND key = {key} AND token = CAST({token} AS bigint) \
         AND state = 'in_flight' RETURNING 1) \
         SELECT CAST(CASE WHEN EXISTS (SELECT FROM done) THEN '1' ELSE '{FENCED_MARK}' END \
         AS integer); COMMIT; BEGIN",
        headers = bytea_literal(headers),
        body = bytea_literal(body),
        scope = text_literal(scope),
        key = text_literal(key),
    )
}

/// The claim of a new key and the `BEGIN` of its transaction as one simple-query message
/// ([`crate::PostgresStore::with_claim_sent_with_begin`]; docs/DESIGN.md, "The claim goes out
/// with the begin"): the try's short `lock_timeout` (`try_lock_ms` milliseconds), the claim's
/// `INSERT` with every value a literal ([`text_literal`], [`bytea_literal`], integers
/// formatted) and no `ON CONFLICT`, the phase's `lock_timeout` (`phase_lock_ms`) restored, then
/// `BEGIN`.
///
/// The statements before `BEGIN` run in the message's implicit transaction block, which the
/// `BEGIN` turns into a regular one (PostgreSQL documentation, "Multiple Statements in a
/// Simple Query"): the claim's row and both `set_config(.., true)` settings belong to the
/// transaction the handler goes on in. A key that exists fails the insert with `23505
/// unique_violation`, a wait past `try_lock_ms` for a key another open transaction holds with
/// `55P03 lock_not_available`; either failure skips the rest of the message and rolls the
/// implicit transaction back, leaving the connection idle, outside any transaction. The
/// columns and values are [`INSERT_CLAIM`]'s (token 1, state `in_flight`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn begin_with_claim(
    scope: &str,
    key: &str,
    fingerprint_version: i32,
    digest: &[u8],
    lease_expires_at: i64,
    request: Option<&[u8]>,
    now: i64,
    expires_at: i64,
    try_lock_ms: u64,
    phase_lock_ms: u64,
) -> String {
    let request = request.map_or_else(|| "NULL".to_owned(), bytea_literal);
    format!(
        "SELECT set_config('lock_timeout', '{try_lock_ms}ms', true); \
         INSERT INTO oncely_idempotency_keys \
         (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, request, \
          created_at, expires_at) \
         VALUES ({scope}, {key}, CAST({fingerprint_version} AS integer), {digest}, 1, \
         'in_flight', CAST({lease_expires_at} AS bigint), {request}, CAST({now} AS bigint), \
         CAST({expires_at} AS bigint)); \
         SELECT set_config('lock_timeout', '{phase_lock_ms}ms', true); BEGIN",
        scope = text_literal(scope),
        key = text_literal(key),
        digest = bytea_literal(digest),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_cannot_end_early() {
        let evil = r"k'); DROP TABLE oncely_idempotency_keys; --\'";
        assert_eq!(
            text_literal(evil),
            r"E'k''); DROP TABLE oncely_idempotency_keys; --\\'''"
        );
        assert_eq!(text_literal("a\0b"), r"E'a\000b'");
        assert_eq!(text_literal("ключ-✓"), "E'ключ-✓'");
        assert_eq!(bytea_literal(&[0, 0xff, 0x27]), "decode('00ff27', 'hex')");
        assert_eq!(bytea_literal(&[]), "decode('', 'hex')");
    }

    #[test]
    fn the_open_check_fails_on_its_mark() {
        assert!(FAIL_UNLESS_OPEN.contains(&format!("'{ENDED_MARK}'")));
        let msg = complete_and_commit("s", "k", 1, 2, 201, b"", b"", true, 3, true);
        assert!(msg.starts_with(FAIL_UNLESS_OPEN));
        assert!(msg.ends_with("; COMMIT; BEGIN"));
        assert!(msg.contains(&format!("'{FENCED_MARK}'")));
    }

    /// The completion sent with the commit finds its record by an index on scope and key, never
    /// by reading the table: its `EXPLAIN` over 20,000 records of one scope (in a transaction
    /// rolled back, so the shared test table keeps nothing) shows an index scan. With the
    /// scope and key as functions of constants (`convert_from(decode(..))`) this was a
    /// sequential scan per completion.
    #[tokio::test]
    async fn the_completion_with_the_commit_finds_its_record_by_an_index() {
        let Ok(url) = std::env::var("ONCELY_TEST_POSTGRES_URL") else {
            eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
            return;
        };
        let store = crate::PostgresStore::connect(&url).await.expect("connect");
        store.migrate().await.expect("migrate");
        let mut tx = store.pool().begin().await.expect("begin");
        let scope = format!("plan-{}", std::process::id());
        sqlx::query(
            "INSERT INTO oncely_idempotency_keys (scope, key, fingerprint_version, fingerprint, \
             token, state, lease_expires_at, created_at, expires_at) \
             SELECT $1, 'k' || g, 1, '\\x00', 1, 'in_flight', 1, 1, 9999999999999 \
             FROM generate_series(1, 20000) g",
        )
        .bind(&scope)
        .execute(&mut *tx)
        .await
        .expect("fill");
        sqlx::query("ANALYZE oncely_idempotency_keys")
            .execute(&mut *tx)
            .await
            .expect("analyze");
        for check_open in [false, true] {
            let msg = complete_and_commit(
                &scope, r"k1'\", 1, 2, 201, b"{}", b"{}", true, 3, check_open,
            );
            let update = msg
                .strip_suffix("; COMMIT; BEGIN")
                .expect("the message ends with its commit")
                .rsplit("; ")
                .next()
                .expect("the update");
            let plan: Vec<String> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {update}")))
                    .fetch_all(&mut *tx)
                    .await
                    .expect("explain");
            let plan = plan.join("\n");
            // The primary key, or the partial index on in-flight records (a later migration):
            // either finds the one row by scope and key.
            assert!(
                plan.contains("Index Scan using oncely_idempotency_keys_pkey")
                    || plan.contains("Index Scan using oncely_idempotency_keys_in_flight"),
                "{plan}"
            );
            assert!(!plan.contains("Seq Scan"), "{plan}");
        }
        tx.rollback().await.expect("rollback");
    }
}
