-- The outbox relay keeps the tenants' receivers it read between its passes (it wakes at
-- every outbox event; reading them each time was a statement per event per worker, most of
-- them finding nothing new). Any change to a receiver (created, rotated, deleted, or edited
-- by hand) tells it to read them again: a NOTIFY at commit, none on rollback. A relay that
-- missed one (its LISTEN connection was down) reads them at every pass until it listens
-- again (pipeline/upkeep/webhook_targets.py, ``ReceiverCache``).
CREATE FUNCTION webhook_receivers_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aivedio_receivers', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_receivers_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON webhook_receivers
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_receivers_notify();

-- A job inserted held back for the job whose work it stands for (store/job_types.py
-- ``held_by``: a fast-path probe makes the enrichment its revision's render job would make,
-- pipeline/inline_enrichment.py). Should that job's lease expire (its worker died) or be
-- given back (a drain), the held job is due at once (the ``reap`` and ``release``
-- statements) instead of when its hold ends.
ALTER TABLE jobs ADD COLUMN held_by bigint;
CREATE INDEX jobs_held_by ON jobs (held_by) WHERE held_by IS NOT NULL AND status = 'waiting';
