-- Idempotency-Key on the POSTs that create something (api/idempotency.py): the same key
-- with the same request within the key's lifetime answers what the first one answered; the
-- same key with another request is refused (422). Per tenant: one tenant's keys never meet
-- another's.
--
-- A row is taken (status NULL, locked_until in the future, a holder id of its own) before
-- the first request runs, its lock renewed while it runs, and completed with its answer
-- after by that holder only; a request that died in between leaves a lock that lapses, so
-- the key can be tried again. Expired rows are deleted by the sweeper.
CREATE TABLE idempotency_keys (
    tenant_id bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_sha256 bytea NOT NULL CHECK (length(request_sha256) = 32),
    holder uuid NOT NULL,
    status integer CHECK (status BETWEEN 200 AND 499),
    response bytea,
    content_type text,
    location text,
    locked_until timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key),
    CHECK ((status IS NULL) = (response IS NULL)),
    CONSTRAINT idempotency_keys_locked_until_sane
        CHECK (locked_until >= '1970-01-01 00:00:00+00' AND locked_until < '2500-01-01 00:00:00+00'),
    CONSTRAINT idempotency_keys_created_at_sane
        CHECK (created_at >= '1970-01-01 00:00:00+00' AND created_at < '2500-01-01 00:00:00+00'),
    CONSTRAINT idempotency_keys_expires_at_sane
        CHECK (expires_at >= '1970-01-01 00:00:00+00' AND expires_at < '2500-01-01 00:00:00+00')
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
