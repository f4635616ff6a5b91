-- Webhooks retried for a time, not a count: a receiver down for an hour (a deploy gone
-- wrong, a weekend) must still get its events without an operator's replay, so a delivery
-- is retried until retry_for_seconds (24 h by default) after its first attempt.
-- first_attempt_at is set by the claim that makes the first attempt (and cleared by an
-- operator's replay, which grants a fresh window).
ALTER TABLE outbox_deliveries ADD COLUMN first_attempt_at timestamptz
    CONSTRAINT outbox_deliveries_first_attempt_at_sane
    CHECK (first_attempt_at >= '1970-01-01 00:00:00+00'
           AND first_attempt_at < '2500-01-01 00:00:00+00');

-- "aivedio webhooks deliveries list --state dead": the dead, newest first.
CREATE INDEX outbox_deliveries_dead ON outbox_deliveries (dead_at DESC, outbox_event_id)
    WHERE dead_at IS NOT NULL;
