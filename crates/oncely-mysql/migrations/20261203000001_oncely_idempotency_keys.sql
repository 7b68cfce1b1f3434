-- The Oncely key store on MySQL 8 / MariaDB 10.6+ (InnoDB): one row per (scope, key). All
-- timestamps are integer epoch milliseconds written from the application's clock (see the crate
-- docs, "Clocks").
--
-- One statement per index is not possible here: MySQL has no `CREATE INDEX IF NOT EXISTS` (MariaDB
-- has), so the indexes are declared inside `CREATE TABLE IF NOT EXISTS`, and a later migration
-- that adds one uses `ALTER TABLE` (never an edit of this file).
CREATE TABLE IF NOT EXISTS oncely_idempotency_keys (
    -- The authenticated caller and the client's Idempotency-Key, as bytes: a binary column
    -- compares byte for byte, while every text collation of MySQL and MariaDB either folds case
    -- or accents (`_ci`, `_ai`) or ignores trailing spaces (`PAD SPACE`, among them
    -- `utf8mb4_bin`), any of which would let two different keys share one record. The primary
    -- key arbitrates every claim (INSERT ... ON DUPLICATE KEY UPDATE); 1024 + 255 bytes stay
    -- inside InnoDB's 3072-byte index key limit.
    scope                   VARBINARY(1024) NOT NULL,
    `key`                   VARBINARY(255)  NOT NULL,
    -- The request fingerprint: algorithm version and SHA-256 digest (32 bytes).
    fingerprint_version     INT             NOT NULL,
    fingerprint             VARBINARY(64)   NOT NULL,
    -- The fencing token of the current claim; every owner write is conditional on it.
    token                   BIGINT          NOT NULL,
    state                   VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- In flight only: when the lease lapses unless renewed, and the last committed phase (a
    -- JSON step, any Unicode: utf8mb4).
    lease_expires_at        BIGINT          NULL,
    recovery_point          LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    -- Complete only: the stored response (bytes, never text: a body need not be UTF-8).
    completed_at            BIGINT          NULL,
    response_status         INT             NULL,
    response_headers        LONGBLOB        NULL,
    response_body           LONGBLOB        NULL,
    response_body_retained  BOOLEAN         NULL,
    -- The request that made the claim (StoredRequest::encode), for the completer.
    request                 LONGBLOB        NULL,
    created_at              BIGINT          NOT NULL,
    -- When the reaper may delete the row: claim or completion time plus the retention.
    expires_at              BIGINT          NOT NULL,
    -- The completer's bookkeeping: re-drives made, when it may try again, when it gave up and
    -- marked the record for a person.
    redrive_attempts        INT             NOT NULL DEFAULT 0,
    redrive_next_at         BIGINT          NULL,
    marked_at               BIGINT          NULL,
    PRIMARY KEY (scope, `key`),
    -- The reaper deletes `WHERE expires_at <= now ORDER BY expires_at LIMIT n`: a short range
    -- scan of the oldest rows, locking only the rows it deletes.
    INDEX oncely_idempotency_keys_expires_at (expires_at),
    -- MySQL has no partial indexes. Only in-flight rows have a lease (the CHECK below), so the
    -- completer's `marked_at IS NULL AND lease_expires_at <= cutoff ORDER BY lease_expires_at`
    -- reads only lapsed in-flight rows through this index, and the reaper's listing of marked
    -- records, `marked_at IS NOT NULL ORDER BY marked_at`, its first column.
    INDEX oncely_idempotency_keys_leases (marked_at, lease_expires_at),
    CONSTRAINT oncely_idempotency_keys_state CHECK (
        (state = 'in_flight' AND lease_expires_at IS NOT NULL)
        OR (state = 'complete' AND completed_at IS NOT NULL AND response_status IS NOT NULL
            AND response_headers IS NOT NULL AND response_body IS NOT NULL
            AND response_body_retained IS NOT NULL AND lease_expires_at IS NULL)
        OR (state = 'released' AND lease_expires_at IS NULL)
    )
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;
