-- Every stored time is finite and sane: in [1970-01-01, 2500-01-01).
--
-- A signed callback with "expires_at": "0001-01-01T00:00:00Z" was stored as -infinity; the
-- driver reads that back as a datetime without a zone, and every scan that compared it with
-- now() crashed (the sweeper died, the fetch job died as "internal"). The edge refuses such
-- values now (untrusted.py), and this makes the schema refuse them too, so no path (a
-- future one, a script, psql) can store one: a CHECK constraint on every timestamptz column,
-- named <table>_<column>_sane. A migration that adds a timestamptz column adds its own
-- (tests/integration/store/test_migrations_and_records.py checks that every one has it).
--
-- A database that already holds such a row is repaired rather than left unable to upgrade:
-- each time below the range (-infinity included) becomes 1970-01-01 (for an expiry: long
-- expired, so the URL is refreshed or the output is lost, as it should be), each one above
-- it (infinity included) 2499-12-31. Each repaired column is reported as a WARNING in the
-- server's log with its row count; docs/operations.md has the query that lists such rows
-- before an upgrade. The ledger is append-only and refuses the repair: a bad ledger row
-- (none can exist: created_at is always now()) stops the migration with that error.
--
-- One scan per column to look for bad rows, one to validate its constraint, under the
-- migration's lock: on a database with large history tables, expect it to take a while.
DO $$
DECLARE
    col record;
    bad bigint;
    low constant timestamptz := '1970-01-01 00:00:00+00';
    high constant timestamptz := '2500-01-01 00:00:00+00';
    top constant timestamptz := '2499-12-31 00:00:00+00';
BEGIN
    FOR col IN
        SELECT c.table_name, c.column_name
        FROM information_schema.columns c
        JOIN information_schema.tables t USING (table_schema, table_name)
        WHERE c.table_schema = current_schema()
          AND t.table_type = 'BASE TABLE'
          AND c.data_type = 'timestamp with time zone'
        ORDER BY c.table_name, c.ordinal_position
    LOOP
        EXECUTE format(
            'SELECT count(*) FROM %I WHERE NOT (%I >= $1 AND %I < $2)',
            col.table_name, col.column_name, col.column_name
        ) INTO bad USING low, high;
        IF bad > 0 THEN
            RAISE WARNING 'migration 0016: % row(s) of %.% held a time outside '
                '[1970-01-01, 2500-01-01); clamped into it', bad, col.table_name, col.column_name;
            EXECUTE format(
                'UPDATE %I SET %I = CASE WHEN %I < $1 THEN $1 ELSE $3 END'
                ' WHERE NOT (%I >= $1 AND %I < $2)',
                col.table_name, col.column_name, col.column_name, col.column_name,
                col.column_name
            ) USING low, high, top;
        END IF;
        EXECUTE format(
            'ALTER TABLE %I ADD CONSTRAINT %I CHECK (%I >= %L AND %I < %L)',
            col.table_name, col.table_name || '_' || col.column_name || '_sane',
            col.column_name, low, col.column_name, high
        );
    END LOOP;
END
$$;
