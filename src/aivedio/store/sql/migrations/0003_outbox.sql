-- Outbox delivery: per-endpoint delivery rows, a gap-safe cursor per endpoint, NOTIFY at commit.
--
-- Why a cursor on (xid, id) and not on id. outbox_events.id comes from a sequence when the
-- row is inserted, but rows become visible when their transaction commits: id 10 can commit
-- after id 11. A relay that remembered "done up to 11" would skip 10 forever. So every event
-- also records its transaction id (xid8, 64-bit, never wraps), and the relay only consumes
-- events whose transaction is older than the horizon: the oldest transaction of THIS
-- database that was still running when its snapshot was taken (outbox_horizon below).
-- Every event from an older transaction is already visible or never will be (rolled back),
-- and every event not yet visible has an xid at or above the horizon, so it sorts after the
-- cursor. Nothing is skipped; a transaction left open only delays delivery.
--
-- Ordering per aggregate is by id (the order producers serialised on the aggregate's row
-- inserted their events), and is enforced when deliveries are claimed, not here.

ALTER TABLE outbox_events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX outbox_events_position ON outbox_events (xid, id);
CREATE INDEX outbox_events_aggregate ON outbox_events (aggregate_id, id)
    WHERE aggregate_id IS NOT NULL;

-- Delivery state lives in outbox_deliveries, one row per (endpoint, event); the per-event
-- columns of 0001 are not used, and their index would cover every event forever.
DROP INDEX outbox_undelivered;
COMMENT ON COLUMN outbox_events.delivered_at IS 'unused: see outbox_deliveries';
COMMENT ON COLUMN outbox_events.attempts IS 'unused: see outbox_deliveries';
COMMENT ON COLUMN outbox_events.next_attempt_at IS 'unused: see outbox_deliveries';

-- One row per configured webhook name, created when a relay first sees the name, with the
-- cursor at the horizon of that moment: a webhook gets events from its creation onward, not
-- the whole history. (xid, id) of the last event the relay turned into deliveries (or
-- skipped because its type did not match).
CREATE TABLE outbox_endpoints (
    name          text PRIMARY KEY,
    cursor_xid    xid8 NOT NULL,
    cursor_id     bigint NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    advanced_at   timestamptz
);

-- One delivery of one event to one endpoint. next_attempt_at doubles as the lease: a claim
-- sets it to now() + lease and sets lease_token, so a crashed sender's delivery comes due
-- again when the lease runs out, and a late result of a lapsed lease is refused (CAS on
-- the token). attempts counts claims, so a sender that crashes on a poison event still
-- spends the budget.
CREATE TABLE outbox_deliveries (
    endpoint         text NOT NULL REFERENCES outbox_endpoints (name) ON DELETE CASCADE,
    outbox_event_id  bigint NOT NULL REFERENCES outbox_events (id) ON DELETE CASCADE,
    aggregate_id     uuid,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_token      uuid,
    delivered_at     timestamptz,
    dead_at          timestamptz,
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint, outbox_event_id),
    CHECK (delivered_at IS NULL OR dead_at IS NULL)
);
CREATE INDEX outbox_deliveries_due ON outbox_deliveries (next_attempt_at, outbox_event_id)
    WHERE delivered_at IS NULL AND dead_at IS NULL;
-- "Is an earlier event of this aggregate still open for this endpoint?"
CREATE INDEX outbox_deliveries_open_aggregate
    ON outbox_deliveries (endpoint, aggregate_id, outbox_event_id)
    WHERE delivered_at IS NULL AND dead_at IS NULL AND aggregate_id IS NOT NULL;
CREATE INDEX outbox_deliveries_event ON outbox_deliveries (outbox_event_id);

-- The oldest transaction that may still add events to this database: the snapshot's xmin,
-- except that transactions positively seen running in another database are ignored (they
-- cannot write our tables, and on a shared cluster they would otherwise hold every webhook
-- back). A transaction we cannot place (finished since the snapshot, prepared, or hidden
-- from this role) counts as ours: at worst a delay, never a skipped event. STABLE, so it
-- reads the calling statement's snapshot, the one that statement reads events with.
CREATE FUNCTION outbox_horizon() RETURNS xid8 LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(x)
           FROM pg_snapshot_xip(pg_current_snapshot()) AS x
          WHERE NOT EXISTS (
                SELECT 1 FROM pg_stat_activity a
                 WHERE a.backend_xid = xid(x)
                   AND a.datid IS NOT NULL
                   AND a.datid <> (SELECT oid FROM pg_database
                                    WHERE datname = current_database()))),
        pg_snapshot_xmax(pg_current_snapshot()))
$$;

-- NOTIFY is sent at commit and never on rollback, because the event row is: a listener
-- hears only events that exist. It is at most once (nobody listening, nobody hears it);
-- consumers that must not miss one take a webhook.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'aivedio_events',
        json_build_object(
            'event_id', NEW.event_id,
            'event_type', NEW.event_type,
            'aggregate_id', NEW.aggregate_id,
            'tenant_id', NEW.tenant_id
        )::text
    );
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_events_notify AFTER INSERT ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION outbox_notify();
