-- Stage events: every status change of a generation task, a provider output and an asset, in
-- one append-only log that the API streams (GET /v1/assets/{id}/events, Server-Sent Events).
-- Triggers write it, so no code path that changes a status can forget to, and an event exists
-- exactly when the change it reports committed. The id is the stream's event id.
--
-- Why readers take a lock before they read. ids come from a sequence when the row is written,
-- but rows become visible when their transaction commits: an output's event 10 can commit
-- after its asset's event 11, and a reader that delivered 11 and remembered "up to 11" would
-- skip 10 forever. (Changes of one row cannot reorder: the row lock serialises them. Changes
-- of the rows of one stream can: a task, its output and the output's asset.) So the function
-- that writes an event first takes a transaction-level SHARED advisory lock on the changed
-- row's key (writers never wait for each other on it), and a reader, in one short
-- transaction, tries to take the same keys EXCLUSIVELY without waiting, then reads in a new
-- statement: if it got them, no transaction holding an uncommitted event of those rows is
-- running, writers that come later wait for the reader's commit (a millisecond), and what
-- the reader sees is final. If it did not, a writer is mid-transaction and the reader tries
-- again shortly. Keys live in the two-int4 advisory space under STAGE_LOCK_SPACE, apart from
-- the bigint keys the queue, sweeper and migrations use; a hash collision only delays a read.
-- One lock per changed row: a single transaction changing many thousands of statuses would
-- need max_locks_per_transaction raised (status changes are one row at a time today).

CREATE TABLE stage_events (
    id                  bigserial PRIMARY KEY,
    tenant_id           bigint NOT NULL,
    entity              text NOT NULL
                        CHECK (entity IN ('generation_task', 'provider_output', 'asset')),
    state               text NOT NULL,
    -- The changed row's id in its own column, and the parents the row itself names (an
    -- output's task, an asset's source output): readers select by entity and that column.
    asset_id            uuid,
    provider_output_id  uuid,
    generation_task_id  uuid,
    -- The row's last_error_class at the change; the API shows it for failure states only.
    error_class         text,
    at                  timestamptz NOT NULL DEFAULT now(),
    CHECK (CASE entity WHEN 'asset' THEN asset_id IS NOT NULL
                       WHEN 'provider_output' THEN provider_output_id IS NOT NULL
                       ELSE generation_task_id IS NOT NULL END)
);
-- One asset's stream: its own events, its source output's and that output's task's, after an id.
CREATE INDEX stage_events_asset ON stage_events (asset_id, id) WHERE entity = 'asset';
CREATE INDEX stage_events_output ON stage_events (provider_output_id, id)
    WHERE entity = 'provider_output';
CREATE INDEX stage_events_task ON stage_events (generation_task_id, id)
    WHERE entity = 'generation_task';

-- 0x53544745, "STGE": the classid of the advisory keys above (aivedio.store.stage_events).
CREATE FUNCTION stage_event_append(
    p_tenant bigint, p_entity text, p_state text, p_key uuid,
    p_asset uuid, p_output uuid, p_task uuid, p_error_class text
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1398032197, hashtext(p_key::text));
    INSERT INTO stage_events (tenant_id, entity, state, asset_id, provider_output_id,
                              generation_task_id, error_class)
    VALUES (p_tenant, p_entity, p_state, p_asset, p_output, p_task, p_error_class);
    -- Sent at commit, never on rollback. It only wakes readers (at most once, nobody listening
    -- nobody hears it): they re-read by id, and also on a timer. The payload is the changed
    -- row's id, which is what a stream subscribes to.
    PERFORM pg_notify('aivedio_stage_events', p_key::text);
END
$$;

CREATE FUNCTION stage_events_of_task() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stage_event_append(NEW.tenant_id, 'generation_task', NEW.provider_status, NEW.id,
                               NULL, NULL, NEW.id, NULL);
    RETURN NULL;
END
$$;

CREATE FUNCTION stage_events_of_output() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stage_event_append(NEW.tenant_id, 'provider_output', NEW.fetch_status, NEW.id,
                               NULL, NEW.id, NEW.generation_task_id, NEW.last_error_class);
    RETURN NULL;
END
$$;

CREATE FUNCTION stage_events_of_asset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM stage_event_append(NEW.tenant_id, 'asset', NEW.status, NEW.id,
                               NEW.id, NEW.source_provider_output_id, NULL, NEW.last_error_class);
    RETURN NULL;
END
$$;

CREATE TRIGGER generation_tasks_stage_inserted AFTER INSERT ON generation_tasks
    FOR EACH ROW EXECUTE FUNCTION stage_events_of_task();
CREATE TRIGGER generation_tasks_stage_changed AFTER UPDATE OF provider_status ON generation_tasks
    FOR EACH ROW WHEN (OLD.provider_status IS DISTINCT FROM NEW.provider_status)
    EXECUTE FUNCTION stage_events_of_task();

CREATE TRIGGER provider_outputs_stage_inserted AFTER INSERT ON provider_outputs
    FOR EACH ROW EXECUTE FUNCTION stage_events_of_output();
CREATE TRIGGER provider_outputs_stage_changed AFTER UPDATE OF fetch_status ON provider_outputs
    FOR EACH ROW WHEN (OLD.fetch_status IS DISTINCT FROM NEW.fetch_status)
    EXECUTE FUNCTION stage_events_of_output();

CREATE TRIGGER assets_stage_inserted AFTER INSERT ON assets
    FOR EACH ROW EXECUTE FUNCTION stage_events_of_asset();
CREATE TRIGGER assets_stage_changed AFTER UPDATE OF status ON assets
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION stage_events_of_asset();

-- Rows that exist already start the log with the state they are in, at their last update:
-- tasks, then outputs, then assets, so ids follow the order a stream shows them in.
INSERT INTO stage_events (tenant_id, entity, state, generation_task_id, at)
SELECT tenant_id, 'generation_task', provider_status, id, updated_at
  FROM generation_tasks ORDER BY updated_at, id;
INSERT INTO stage_events (tenant_id, entity, state, provider_output_id, generation_task_id,
                          error_class, at)
SELECT tenant_id, 'provider_output', fetch_status, id, generation_task_id, last_error_class,
       updated_at
  FROM provider_outputs ORDER BY updated_at, id;
INSERT INTO stage_events (tenant_id, entity, state, asset_id, provider_output_id, error_class,
                          at)
SELECT tenant_id, 'asset', status, id, source_provider_output_id, last_error_class, updated_at
  FROM assets ORDER BY updated_at, id;
