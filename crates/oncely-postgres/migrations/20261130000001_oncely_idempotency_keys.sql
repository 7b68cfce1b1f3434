-- The Oncely key store: one row per (scope, key). All timestamps are integer epoch milliseconds
-- written from the application's clock (see the crate docs, "Clocks").
CREATE TABLE IF NOT EXISTS oncely_idempotency_keys (
    -- The authenticated caller and the client's Idempotency-Key. The primary key arbitrates
    -- every claim (INSERT ... ON CONFLICT), and on a Postgres-compatible distributed SQL
    -- database it is a natural distribution key: every statement touches one (scope, key).
    scope                   TEXT    NOT NULL,
    key                     TEXT    NOT NULL,
    -- The request fingerprint: algorithm version and 32-byte SHA-256 digest.
    fingerprint_version     INTEGER NOT NULL,
    fingerprint             BYTEA   NOT NULL,
    -- The fencing token of the current claim; every owner write is conditional on it.
    token                   BIGINT  NOT NULL,
    state                   TEXT    NOT NULL,
    -- In flight only: when the lease lapses unless renewed, and the last committed phase.
    lease_expires_at        BIGINT,
    recovery_point          TEXT,
    -- Complete only: the stored response.
    completed_at            BIGINT,
    response_status         INTEGER,
    response_headers        BYTEA,
    response_body           BYTEA,
    response_body_retained  BOOLEAN,
    -- The request that made the claim (StoredRequest::encode), for the completer.
    request                 BYTEA,
    created_at              BIGINT  NOT NULL,
    -- When the reaper may delete the row: claim or completion time plus the retention.
    expires_at              BIGINT  NOT NULL,
    PRIMARY KEY (scope, key),
    CONSTRAINT oncely_idempotency_keys_state CHECK (
        (state = 'in_flight' AND lease_expires_at IS NOT NULL)
        OR (state = 'complete' AND completed_at IS NOT NULL AND response_status IS NOT NULL
            AND response_headers IS NOT NULL AND response_body IS NOT NULL
            AND response_body_retained IS NOT NULL)
        OR state = 'released'
    )
);

-- The reaper deletes `WHERE expires_at <= now ORDER BY expires_at LIMIT n`: this index turns
-- each batch into a short range scan of the oldest rows instead of a scan of the whole table,
-- so a batch touches (and locks) only the rows it deletes.
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_expires_at
    ON oncely_idempotency_keys (expires_at);

-- The completer lists `WHERE state = 'in_flight' AND lease_expires_at <= cutoff ORDER BY
-- lease_expires_at`. In-flight rows are a tiny fraction of the table (most are complete), so a
-- partial index stays small and cheap to maintain, and the listing never scans complete rows.
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_abandoned
    ON oncely_idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight';
