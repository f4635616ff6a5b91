"""The stage event log (``stage_events``, migration 0007): reading one asset's stream.

Triggers on the three status columns write the log, so nothing here writes to it. An asset's
stream is the events of three rows, its *scope*: the asset itself, the provider output it was
fetched from and that output's generation task (an upload has only the asset). ``read_after``
returns them in id order after a cursor, and only once they are final: it first tries, without
waiting, to take the scope's advisory keys exclusively (writers hold them shared until they
commit, see the migration), so an event with a smaller id can never appear behind one already
returned. When a writer is mid-transaction it returns ``None``: try again shortly.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from aivedio.store.database import Pool, map_db_errors

# The channel stage_event_append() notifies, with the changed row's id as the payload.
NOTIFY_CHANNEL = "aivedio_stage_events"
# The classid of the stage-event advisory keys ("STGE"), fixed in 0007_stage_events.sql.
STAGE_LOCK_SPACE = 0x53544745
MAX_EVENT_ID = 2**63 - 1

SCOPE_SQL = """
SELECT a.id, a.source_provider_output_id, o.generation_task_id
  FROM assets a LEFT JOIN provider_outputs o ON o.id = a.source_provider_output_id
 WHERE a.id = $1 AND a.tenant_id = $2
"""

# Every key or none: bool_and evaluates each row, and a key taken stays held until commit.
TRY_KEYS_SQL = """
SELECT bool_and(pg_try_advisory_xact_lock($1, hashtext(k::text))) FROM unnest($2::uuid[]) AS k
"""

READ_SQL = """
SELECT id, entity, state, asset_id, provider_output_id, generation_task_id, error_class, at
  FROM stage_events
 WHERE tenant_id = $1 AND id > $2
   AND ((entity = 'asset' AND asset_id = $3)
        OR (entity = 'provider_output' AND provider_output_id = $4)
        OR (entity = 'generation_task' AND generation_task_id = $5))
 ORDER BY id
 LIMIT $6
"""


@dataclass(frozen=True, slots=True)
class Scope:
    """The rows whose events make up one asset's stream."""

    tenant_id: int
    asset_id: uuid.UUID
    provider_output_id: uuid.UUID | None
    generation_task_id: uuid.UUID | None

    @property
    def keys(self) -> tuple[uuid.UUID, ...]:
        """The ids a stage event of this scope notifies with (and is locked under)."""
        ids = (self.asset_id, self.provider_output_id, self.generation_task_id)
        return tuple(i for i in ids if i is not None)


@dataclass(frozen=True, slots=True)
class StageRow:
    id: int
    entity: str
    state: str
    asset_id: uuid.UUID | None
    provider_output_id: uuid.UUID | None
    generation_task_id: uuid.UUID | None
    error_class: str | None
    at: datetime


async def scope_of(pool: Pool, tenant_id: int, asset_id: uuid.UUID) -> Scope | None:
    """The asset's scope, or None when the tenant has no such asset."""
    with map_db_errors("reading the asset"):
        row = await pool.fetchrow(SCOPE_SQL, asset_id, tenant_id)
    if row is None:
        return None
    return Scope(tenant_id, row["id"], row["source_provider_output_id"], row["generation_task_id"])


async def read_after(
    pool: Pool, scope: Scope, after_id: int, *, limit: int = 500
) -> list[StageRow] | None:
    """Up to ``limit`` events of the scope with ids above ``after_id``, in id order; None when
    a transaction that may hold an earlier event of the scope is still running."""
    with map_db_errors("reading stage events"):
        async with pool.acquire() as conn, conn.transaction(isolation="read_committed"):
            if not await conn.fetchval(TRY_KEYS_SQL, STAGE_LOCK_SPACE, list(scope.keys)):
                return None
            # A statement of its own, so its snapshot is taken after the keys are held.
            rows = await conn.fetch(
                READ_SQL,
                scope.tenant_id,
                after_id,
                scope.asset_id,
                scope.provider_output_id,
                scope.generation_task_id,
                limit,
            )
    return [
        StageRow(
            id=r["id"],
            entity=r["entity"],
            state=r["state"],
            asset_id=r["asset_id"],
            provider_output_id=r["provider_output_id"],
            generation_task_id=r["generation_task_id"],
            error_class=r["error_class"],
            at=r["at"],
        )
        for r in rows
    ]
