-- The ledger (seed 002 §11.9.5, follow-up question 10): money facts, appended, never changed.
--
-- A retry of any stage must never bill twice, and a refund must never rewrite the charge it
-- refunds: the charge and its compensation are two rows, both kept forever. Each row's
-- ``entry_key`` names the fact it records (``generation:{provider}:{provider_task_id}``,
-- ``processing:{asset_id}:{revision}``, ``compensation:{provider}:{provider_task_id}``), so
-- writers insert with ON CONFLICT (entry_key) DO NOTHING and a duplicate is a no-op.
--
-- Sign convention: amounts are from the tenant's side, in millionths of the currency unit.
-- Positive is owed by the tenant (generation and processing charges, never negative);
-- negative is credited back to the tenant (a compensation refunding a charge). The sum of a
-- tenant's rows in one currency is what the tenant owes in it.

CREATE TABLE ledger_entries (
    id                  bigserial PRIMARY KEY,
    entry_key           text NOT NULL UNIQUE,      -- the idempotency key: one row per fact
    tenant_id           bigint NOT NULL REFERENCES tenants (id),
    kind                text NOT NULL
                        CHECK (kind IN ('generation_charge', 'processing_charge', 'compensation')),
    provider            text,
    provider_task_id    text,
    -- No foreign keys to tasks or assets: a money fact outlives the records it is about.
    generation_task_id  uuid,
    asset_id            uuid,
    revision            integer,
    amount_micros       bigint NOT NULL,
    currency            text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    policy              text NOT NULL,             -- the rule that produced the amount
    detail              jsonb NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (kind = 'compensation' OR amount_micros >= 0),
    CHECK (kind <> 'generation_charge' OR (provider IS NOT NULL AND provider_task_id IS NOT NULL)),
    CHECK (kind <> 'processing_charge' OR (asset_id IS NOT NULL AND revision IS NOT NULL))
);
CREATE INDEX ledger_entries_tenant ON ledger_entries (tenant_id, created_at, id);
CREATE INDEX ledger_entries_task ON ledger_entries (provider_task_id, provider)
    WHERE provider_task_id IS NOT NULL;

-- Append-only, enforced here rather than trusted to the code: any UPDATE, DELETE or TRUNCATE
-- of the table fails, whoever runs it. Statement-level, so even a statement that would touch
-- no row is refused. ENABLE ALWAYS keeps the trigger firing under
-- session_replication_role = replica, the usual way to skip ordinary triggers.
CREATE FUNCTION ledger_entries_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries is append-only: % refused', TG_OP
        USING HINT = 'record a compensation entry instead of changing history';
END
$$;

CREATE TRIGGER ledger_entries_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_refuse_change();
ALTER TABLE ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_append_only;
