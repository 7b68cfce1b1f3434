-- The operator's listing of in-flight records (`oncely records list --in-flight`,
-- `Operator::list_records` with `in_flight`) reads `WHERE state = 'in_flight' ... ORDER BY scope,
-- key LIMIT n` from a cursor. In-flight rows are a tiny fraction of the table, so without this
-- index PostgreSQL scans the whole table for them and sorts (measured at 1,000,000 completed
-- records: a parallel sequential scan, 286 ms); with it the listing reads the in-flight rows in
-- primary key order from the cursor and stops at the page's end. A partial index, like the
-- completer's: it holds only in-flight rows, so it stays small and cheap to maintain.
--
-- Building it reads the table once and holds writes for that long (about a second per million
-- rows); the index itself holds only the in-flight rows.
CREATE INDEX IF NOT EXISTS oncely_idempotency_keys_in_flight
    ON oncely_idempotency_keys (scope, key)
    WHERE state = 'in_flight';
