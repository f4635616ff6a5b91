"""The read-only queries behind ``aivedio status``: the generation tasks an id names, the
provider outputs (with their assets) a target covers, the tasks' states, and the stage
events of everything followed. Each names its action the way the command's errors read."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import asyncpg

from aivedio.store.database import Pool, map_db_errors

TASKS_NAMED_SQL = (
    "SELECT id, provider, provider_task_id FROM generation_tasks"
    " WHERE provider_task_id = $1 OR id = $2 ORDER BY provider, id"
)
_OUTPUT_WITH_ASSET = (
    "SELECT o.id, a.id AS asset_id FROM provider_outputs o"
    " LEFT JOIN assets a ON a.source_provider_output_id = o.id"
)
OUTPUT_WITH_ASSET_SQL = f"{_OUTPUT_WITH_ASSET} WHERE o.id = $1"
TASK_OUTPUTS_WITH_ASSETS_SQL = (
    f"{_OUTPUT_WITH_ASSET} WHERE o.provider = $1 AND o.provider_task_id = $2"
    " ORDER BY o.output_index, o.output_revision"
)
TASK_STATES_SQL = "SELECT id, provider_status FROM generation_tasks WHERE id = ANY($1::uuid[])"
TASK_STATES_OF_OUTPUTS_SQL = (
    "SELECT t.id, t.provider_status FROM generation_tasks t"
    " JOIN provider_outputs o ON o.generation_task_id = t.id"
    " WHERE o.id = ANY($1::uuid[])"
)
STAGE_EVENTS_SQL = (
    "SELECT id, entity, state, asset_id, provider_output_id, generation_task_id,"
    " error_class, at FROM stage_events"
    " WHERE (entity = 'asset' AND asset_id = ANY($1::uuid[]))"
    " OR (entity = 'provider_output' AND provider_output_id = ANY($2::uuid[]))"
    " OR (entity = 'generation_task' AND generation_task_id = ANY($3::uuid[]))"
    " ORDER BY id"
)


async def tasks_named(pool: Pool, task_id: str, as_uuid: uuid.UUID | None) -> list[asyncpg.Record]:
    """The generation tasks whose provider task id is ``task_id``, or whose own id is
    ``as_uuid``: ``id``, ``provider``, ``provider_task_id``."""
    with map_db_errors("reading the generation task"):
        return await pool.fetch(TASKS_NAMED_SQL, task_id, as_uuid)


async def output_with_asset(pool: Pool, output_id: uuid.UUID) -> list[asyncpg.Record]:
    """The provider output (``id``) and its asset's id (``asset_id``, or None)."""
    with map_db_errors("reading the status"):
        return await pool.fetch(OUTPUT_WITH_ASSET_SQL, output_id)


async def task_outputs_with_assets(
    pool: Pool, provider: str, provider_task_id: str
) -> list[asyncpg.Record]:
    """The provider task's outputs (``id``) with their assets' ids, in output order."""
    with map_db_errors("reading the status"):
        return await pool.fetch(TASK_OUTPUTS_WITH_ASSETS_SQL, provider, provider_task_id)


async def task_states(pool: Pool, task_ids: Sequence[uuid.UUID]) -> list[asyncpg.Record]:
    """``id`` and ``provider_status`` of each generation task named."""
    with map_db_errors("reading the status"):
        return await pool.fetch(TASK_STATES_SQL, list(task_ids))


async def task_states_of_outputs(
    pool: Pool, output_ids: Sequence[uuid.UUID]
) -> list[asyncpg.Record]:
    """``id`` and ``provider_status`` of the generation task of each provider output named."""
    with map_db_errors("reading the status"):
        return await pool.fetch(TASK_STATES_OF_OUTPUTS_SQL, list(output_ids))


async def stage_events_of(
    pool: Pool,
    asset_ids: Sequence[uuid.UUID],
    output_ids: Sequence[uuid.UUID],
    task_ids: Sequence[uuid.UUID],
) -> list[asyncpg.Record]:
    """Every stage event of the assets, provider outputs and generation tasks named, in id
    order."""
    with map_db_errors("reading stage events"):
        return await pool.fetch(STAGE_EVENTS_SQL, list(asset_ids), list(output_ids), list(task_ids))
