-- Oncely's key store: one row per (scope, key). Shipped with the oncely-sqlite crate and run by
-- `SqliteStore::migrate` (its own migration table, `_oncely_sqlite_migrations`, so that it never
-- collides with the application's own sqlx migrations in the same database file).
--
-- All timestamps are integer epoch milliseconds (UTC) from the store's clock.
CREATE TABLE IF NOT EXISTS oncely_idempotency_keys (
    -- The authenticated caller: records are unique on (scope, key), never on the key alone.
    scope                  TEXT    NOT NULL,
    -- The client's Idempotency-Key, unquoted.
    key                    TEXT    NOT NULL,
    -- The fingerprint algorithm version and its 32-byte SHA-256 digest, stored together so a
    -- cold process compares with the same function (case S2).
    fingerprint_version    INTEGER NOT NULL,
    fingerprint            BLOB    NOT NULL,
    -- The fencing token: +1 on every claim or takeover of this (scope, key).
    token                  INTEGER NOT NULL,
    state                  TEXT    NOT NULL CHECK (state IN ('in_flight', 'complete', 'released')),
    -- In flight only: when the lease lapses unless renewed, and the last committed phase.
    lease_expires_at       INTEGER,
    recovery_point         TEXT,
    -- Complete only: the stored response (headers as StoredResponse::encode_headers JSON).
    response_status        INTEGER,
    response_headers       BLOB,
    response_body          BLOB,
    response_body_retained INTEGER,
    completed_at           INTEGER,
    -- When the current claim was made (a takeover keeps the original time).
    created_at             INTEGER NOT NULL,
    -- When the reaper may delete the row: claim or completion time plus the retention.
    expires_at             INTEGER NOT NULL,
    -- The claiming request (StoredRequest::encode JSON), for the completer; NULL keeps nothing.
    request                BLOB,
    -- The claim is arbitrated here: an INSERT either creates the row or conflicts, never both.
    PRIMARY KEY (scope, key)
);

-- The reaper deletes `WHERE expires_at <= now ORDER BY expires_at LIMIT batch`: without this
-- index every batch would scan the whole table (and hold the write lock while it does).
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_expires_at
    ON oncely_idempotency_keys (expires_at);

-- The completer lists `WHERE state = 'in_flight' AND lease_expires_at <= cutoff ORDER BY
-- lease_expires_at`. A partial index holds only the in-flight rows (a small fraction of the
-- table: complete rows stay for the whole retention), so it stays small and the query reads it in
-- order instead of scanning and sorting.
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_abandoned
    ON oncely_idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';
