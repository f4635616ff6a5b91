-- passthrough: a client's own string (at most 255 characters, as Mux's) on a video (its
-- upload session) or a generation task, echoed in status, lists and every webhook.
--
-- aivedio_passthrough(id) is the one rule for whose passthrough a row carries: a video's
-- (upload session, same id as its asset), or the generation task's that an asset or a
-- provider output came from, or the task's own. Outbox events store it when emitted, so a
-- webhook's body is the same on every attempt.
ALTER TABLE upload_sessions ADD COLUMN passthrough text
    CONSTRAINT upload_sessions_passthrough_length CHECK (length(passthrough) <= 255);
ALTER TABLE generation_tasks ADD COLUMN passthrough text
    CONSTRAINT generation_tasks_passthrough_length CHECK (length(passthrough) <= 255);
ALTER TABLE outbox_events ADD COLUMN passthrough text;

CREATE FUNCTION aivedio_passthrough(target uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT s.passthrough FROM upload_sessions s WHERE s.id = target),
        (SELECT t.passthrough FROM assets a
           JOIN provider_outputs o ON o.id = a.source_provider_output_id
           JOIN generation_tasks t ON t.id = o.generation_task_id
          WHERE a.id = target),
        (SELECT t.passthrough FROM provider_outputs o
           JOIN generation_tasks t ON t.id = o.generation_task_id
          WHERE o.id = target),
        (SELECT t.passthrough FROM generation_tasks t WHERE t.id = target))
$$;
