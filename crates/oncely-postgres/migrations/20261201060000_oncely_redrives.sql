-- The completer's bookkeeping on abandoned in-flight records (issue 14): how many times it
-- re-drove the request, when it may try again, and when it gave up and marked the record for a
-- person. Added columns only: existing rows keep every value and read as "never re-driven, not
-- marked". A takeover keeps them (the same request resumes); a new claim resets them.
--
-- Adding a column with a constant default only changes the catalog (PostgreSQL 11 and later):
-- no table rewrite. Rebuilding the abandoned index reads the table once and holds writes for
-- that long; the index itself only holds in-flight rows.
ALTER TABLE oncely_idempotency_keys ADD COLUMN IF NOT EXISTS redrive_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE oncely_idempotency_keys ADD COLUMN IF NOT EXISTS redrive_next_at BIGINT;
ALTER TABLE oncely_idempotency_keys ADD COLUMN IF NOT EXISTS marked_at BIGINT;

-- Marked records stay in flight until their retention ends but are no longer the completer's
-- work: the abandoned index leaves them out, so the listing never walks past them.
DROP INDEX IF EXISTS oncely_idempotency_keys_abandoned;
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_abandoned
    ON oncely_idempotency_keys (lease_expires_at)
    WHERE state = 'in_flight' AND marked_at IS NULL;

-- The reaper lists the marked records on every pass (oldest mark first).
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_marked
    ON oncely_idempotency_keys (marked_at)
    WHERE state = 'in_flight' AND marked_at IS NOT NULL;
