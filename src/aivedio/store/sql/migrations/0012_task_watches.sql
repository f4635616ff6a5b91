-- Watched generation tasks (seed 002 §11.3, Provider Webhook / Poller): a task submitted
-- elsewhere, registered by POST /v1/generation-tasks, `aivedio watch` or a callback that is
-- only a hint, polled by one control-lane job until the provider says it is terminal.
-- One row per task: watching is idempotent per (provider, provider task id), which the
-- generation task's own uniqueness already gives.
CREATE TABLE task_watches (
    generation_task_id    uuid PRIMARY KEY REFERENCES generation_tasks (id),
    tenant_id             bigint NOT NULL REFERENCES tenants (id),
    provider              text NOT NULL,
    provider_task_id      text NOT NULL,
    status                text NOT NULL DEFAULT 'WATCHING'
                          CHECK (status IN ('WATCHING', 'SUCCEEDED', 'FAILED', 'GAVE_UP')),
    -- Registering a GAVE_UP watch again starts a new round (and a new poll job).
    round                 integer NOT NULL DEFAULT 1,
    polls                 integer NOT NULL DEFAULT 0,
    -- Failed polls in a row (429, 5xx, network): the backoff's exponent, reset by an answer.
    consecutive_failures  integer NOT NULL DEFAULT 0,
    last_provider_status  text,
    last_error_class      text,
    last_error_detail     text,
    last_polled_at        timestamptz,
    give_up_at            timestamptz NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, provider_task_id)
);
