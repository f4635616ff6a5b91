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
