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

-- A tenant's own webhook receivers (POST /v1/webhooks), delivered by the same relay as the
-- configured ones: each has an outbox endpoint named "receiver:<id>" (a name no configured
-- webhook can take: those are [a-z0-9_-]) whose cursor starts at the receiver's creation,
-- and whose deliveries carry only the tenant's own events. Deleting the receiver deletes its
-- endpoint, and that its deliveries; the receiver's row stays as a tombstone (deleted_at, its
-- secrets wiped) so that deleting it again answers as the first time did.
--
-- Secrets are sealed like provider URLs (AES-GCM under [security] url_encryption_key, bound
-- to the receiver's id): a JSON list, the current secret first, then the one a rotation
-- replaced, which keeps signing until previous_secret_expires_at.
CREATE TABLE webhook_receivers (
    id                          uuid PRIMARY KEY,
    tenant_id                   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url                         text NOT NULL CHECK (length(url) <= 2048),
    event_types                 text[] NOT NULL DEFAULT '{}',
    description                 text CHECK (length(description) <= 255),
    secrets_ciphertext          bytea NOT NULL,
    secrets_key_id              text NOT NULL,
    previous_secret_expires_at  timestamptz
        CONSTRAINT webhook_receivers_previous_secret_expires_at_sane
        CHECK (previous_secret_expires_at >= '1970-01-01 00:00:00+00'
               AND previous_secret_expires_at < '2500-01-01 00:00:00+00'),
    created_at                  timestamptz NOT NULL DEFAULT now()
        CONSTRAINT webhook_receivers_created_at_sane
        CHECK (created_at >= '1970-01-01 00:00:00+00' AND created_at < '2500-01-01 00:00:00+00'),
    deleted_at                  timestamptz
        CONSTRAINT webhook_receivers_deleted_at_sane
        CHECK (deleted_at >= '1970-01-01 00:00:00+00' AND deleted_at < '2500-01-01 00:00:00+00')
);
CREATE INDEX webhook_receivers_tenant ON webhook_receivers (tenant_id, created_at DESC, id)
    WHERE deleted_at IS NULL;

ALTER TABLE outbox_endpoints
    ADD COLUMN receiver_id uuid UNIQUE REFERENCES webhook_receivers (id) ON DELETE CASCADE;
