-- The whole schema of the mission (seed 002 §11.6, seed 004), even where later stages fill it.
-- Invariants live in constraints: uniqueness is the last line of defence.

CREATE TABLE tenants (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    tenant_id    bigint NOT NULL REFERENCES tenants (id),
    prefix       text NOT NULL UNIQUE,          -- shown to operators; the key itself never stored
    key_hash     bytea NOT NULL,                -- SHA-256 of the full key
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

CREATE TABLE generation_tasks (
    id                uuid PRIMARY KEY,
    tenant_id         bigint NOT NULL REFERENCES tenants (id),
    provider          text NOT NULL,
    provider_task_id  text NOT NULL,
    provider_status   text NOT NULL,
    output_asset_id   uuid,
    watch             boolean NOT NULL DEFAULT false,
    cancel_version    bigint NOT NULL DEFAULT 0,
    version           bigint NOT NULL DEFAULT 1,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_task_id)
);

CREATE TABLE provider_outputs (
    id                       uuid PRIMARY KEY,
    tenant_id                bigint NOT NULL REFERENCES tenants (id),
    generation_task_id       uuid NOT NULL REFERENCES generation_tasks (id),
    provider                 text NOT NULL,
    provider_task_id         text NOT NULL,
    output_index             smallint NOT NULL,
    output_revision          integer NOT NULL DEFAULT 1,
    source_url_ciphertext    bytea NOT NULL,    -- AES-GCM; nonce || ciphertext
    source_url_key_id        text NOT NULL,     -- which key encrypted it, for rotation
    source_url_expires_at    timestamptz,
    provider_etag            text,
    expected_size_bytes      bigint,
    expected_checksum_alg    text,
    expected_checksum        text,
    content_type             text,
    fetch_status             text NOT NULL,
    descriptor_version       bigint NOT NULL DEFAULT 1,
    version                  bigint NOT NULL DEFAULT 1,
    last_error_class         text,
    last_error_detail        text,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_task_id, output_index, output_revision)
);
CREATE INDEX provider_outputs_expiring ON provider_outputs (source_url_expires_at)
    WHERE fetch_status NOT IN ('STORED', 'OUTPUT_LOST', 'INVALID_RESPONSE');

CREATE TABLE fetch_attempts (
    id                   bigserial PRIMARY KEY,
    provider_output_id   uuid NOT NULL REFERENCES provider_outputs (id),
    job_id               bigint NOT NULL,
    attempt              integer NOT NULL,
    started_at           timestamptz NOT NULL DEFAULT now(),
    finished_at          timestamptz,
    outcome              text,
    error_class          text,
    error_detail         text,            -- never a URL: scheme, host and a path hash only
    http_status          integer,
    bytes                bigint,
    sha256               text,
    object_key           text
);
CREATE INDEX fetch_attempts_output ON fetch_attempts (provider_output_id);

CREATE TABLE assets (
    id                         uuid PRIMARY KEY,
    tenant_id                  bigint NOT NULL REFERENCES tenants (id),
    source_type                text NOT NULL CHECK (source_type IN ('PROVIDER_OUTPUT', 'UPLOAD')),
    source_provider_output_id  uuid UNIQUE REFERENCES provider_outputs (id),
    status                     text NOT NULL,
    current_revision           integer,
    source_object_key          text,
    source_version             integer NOT NULL DEFAULT 1,
    media_type                 text,
    duration_us                bigint,
    width                      integer,
    height                     integer,
    video_codec                text,
    audio_codec                text,
    frame_rate_num             integer,
    frame_rate_den             integer,
    source_size_bytes          bigint,
    source_sha256              text,
    probe                      jsonb,
    moderation_status          text NOT NULL DEFAULT 'PENDING',
    delete_version             bigint NOT NULL DEFAULT 0,
    cancel_version             bigint NOT NULL DEFAULT 0,
    version                    bigint NOT NULL DEFAULT 1,
    last_error_class           text,
    last_error_detail          text,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    CHECK ((source_type = 'PROVIDER_OUTPUT') = (source_provider_output_id IS NOT NULL))
);
CREATE INDEX assets_tenant ON assets (tenant_id, created_at);

CREATE TABLE asset_revisions (
    asset_id                uuid NOT NULL REFERENCES assets (id),
    revision                integer NOT NULL,
    pipeline_version        integer NOT NULL,
    status                  text NOT NULL,
    required_outputs        text[] NOT NULL DEFAULT '{}',
    optional_outputs        text[] NOT NULL DEFAULT '{}',
    plan                    jsonb,
    moderation_verdict      text,
    moderation_version      text,
    moderation_reasons      jsonb,
    delete_version_at_start bigint NOT NULL DEFAULT 0,
    version                 bigint NOT NULL DEFAULT 1,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    published_at            timestamptz,
    PRIMARY KEY (asset_id, revision)
);

CREATE TABLE asset_variants (
    id              uuid PRIMARY KEY,
    asset_id        uuid NOT NULL,
    revision        integer NOT NULL,
    variant_type    text NOT NULL,
    object_key      text NOT NULL,
    mime_type       text NOT NULL,
    size_bytes      bigint NOT NULL,
    checksum_alg    text NOT NULL,
    checksum        text NOT NULL,
    width           integer,
    height          integer,
    bitrate         bigint,
    codec           text,
    status          text NOT NULL,
    extra           jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (asset_id, revision, variant_type),
    FOREIGN KEY (asset_id, revision) REFERENCES asset_revisions (asset_id, revision)
);

-- Seed 004: one row per published version; the pointer moves by a conditional update.
CREATE TABLE releases (
    asset_id          uuid NOT NULL REFERENCES assets (id),
    revision          integer NOT NULL,
    previous_revision integer,
    published_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (asset_id, revision)
);

-- Events for consumers outside the system, delivered at least once by the relay.
CREATE TABLE outbox_events (
    id             bigserial PRIMARY KEY,
    event_id       uuid NOT NULL UNIQUE,
    event_type     text NOT NULL,
    tenant_id      bigint,
    aggregate_id   uuid,
    payload        jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    delivered_at   timestamptz,
    attempts       integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_undelivered ON outbox_events (next_attempt_at, id) WHERE delivered_at IS NULL;

-- Callback replay protection: an event id is accepted once per provider.
CREATE TABLE callback_receipts (
    provider     text NOT NULL,
    event_id     text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);

-- The job queue. Only live jobs (queued, waiting for a retry, running) stay in `jobs`, so
-- the hot table and its indexes stay small; finished jobs move to `job_history` in the same
-- statement that finishes them. `job_keys` owns the stage idempotency keys across both, so a
-- duplicate enqueue after completion is still a no-op.
CREATE TABLE job_keys (
    idempotency_key  text PRIMARY KEY,
    job_id           bigint NOT NULL UNIQUE,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE jobs_id_seq;

CREATE TABLE jobs (
    id                 bigint PRIMARY KEY,
    kind               text NOT NULL,
    lane               text NOT NULL,
    idempotency_key    text NOT NULL,
    tenant_id          bigint NOT NULL DEFAULT 0,
    payload            jsonb NOT NULL DEFAULT '{}',
    status             text NOT NULL CHECK (status IN ('queued', 'waiting', 'running')),
    priority           integer NOT NULL DEFAULT 0,
    expires_at         timestamptz,
    estimated_seconds  double precision NOT NULL DEFAULT 0,
    -- Precomputed claim order: the latest time this job should start (expiry minus the
    -- estimated run time, or enqueue time plus the default start window), plus retry
    -- penalties. Claims walk it in a partial index; nothing sorts all ready rows.
    sort_at            timestamptz NOT NULL,
    run_after          timestamptz NOT NULL DEFAULT now(),
    attempts           integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL,
    timeout_seconds    double precision NOT NULL,
    lease_owner        text,
    lease_token        bigint NOT NULL DEFAULT 0,
    lease_until        timestamptz,
    last_error_class   text,
    last_error_detail  text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 200, autovacuum_analyze_scale_factor = 0.05);

CREATE INDEX jobs_claim ON jobs (lane, tenant_id, sort_at, priority DESC, id)
    WHERE status = 'queued';
CREATE INDEX jobs_waiting ON jobs (run_after) WHERE status = 'waiting';
CREATE INDEX jobs_leases ON jobs (lease_until) WHERE status = 'running';
CREATE INDEX jobs_kind ON jobs (kind, status);

CREATE TABLE job_history (
    id                 bigint PRIMARY KEY,
    kind               text NOT NULL,
    lane               text NOT NULL,
    idempotency_key    text NOT NULL,
    tenant_id          bigint NOT NULL,
    payload            jsonb NOT NULL,
    status             text NOT NULL CHECK (status IN ('succeeded', 'dead', 'cancelled')),
    priority           integer NOT NULL,
    expires_at         timestamptz,
    attempts           integer NOT NULL,
    max_attempts       integer NOT NULL,
    timeout_seconds    double precision NOT NULL,
    lease_owner        text,
    lease_token        bigint NOT NULL,
    last_error_class   text,
    last_error_detail  text,
    result             jsonb,
    created_at         timestamptz NOT NULL,
    started_at         timestamptz,
    finished_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_history_status ON job_history (status, kind, finished_at);
