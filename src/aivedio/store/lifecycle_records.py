"""The records behind deletion and cancellation: the rows they lock, the versions they bump.

Deleting or cancelling bumps ``delete_version`` or ``cancel_version`` in the transaction
that records the decision; the publish transaction compares them with the ones its revision
started with. Status changes go through ``store.records.transition``, not here. Every
statement runs under ``map_db_errors``; the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from aivedio.store.database import Connection, map_db_errors

ASSET_FOR_UPDATE = "SELECT status, tenant_id, version FROM assets WHERE id = $1 FOR UPDATE"
TASK_FOR_UPDATE = (
    "SELECT id, provider_status FROM generation_tasks WHERE provider = $1"
    " AND provider_task_id = $2 FOR UPDATE"
)
BUMP_TASK_CANCEL_VERSION = (
    "UPDATE generation_tasks SET cancel_version = cancel_version + 1 WHERE id = $1"
)
TASK_ASSETS_FOR_UPDATE = (
    "SELECT a.id, a.status, a.tenant_id, a.version FROM assets a"
    " JOIN provider_outputs o ON a.source_provider_output_id = o.id"
    " WHERE o.generation_task_id = $1 FOR UPDATE OF a"
)
BUMP_ASSET_CANCEL_VERSION = (
    "UPDATE assets SET cancel_version = cancel_version + 1,"
    " source_retain_until = greatest(source_retain_until, $2) WHERE id = $1"
)
TASK_STATUS_OF_ASSET = (
    "SELECT g.provider_status FROM assets a JOIN provider_outputs o"
    " ON a.source_provider_output_id = o.id JOIN generation_tasks g"
    " ON g.id = o.generation_task_id WHERE a.id = $1"
)
BUMP_DELETE_VERSION = (
    "UPDATE assets SET delete_version = delete_version + 1, deleted_at = now() WHERE id = $1"
)
BUILDING_REVISIONS = (
    "SELECT revision FROM asset_revisions WHERE asset_id = $1 AND status = 'BUILDING'"
)
SET_SOURCE_RETAIN_UNTIL = "UPDATE assets SET source_retain_until = $2 WHERE id = $1"


async def lock_asset(conn: Connection, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The asset's status, tenant and version, its row locked; None when there is none."""
    with map_db_errors("locking the asset"):
        return await conn.fetchrow(ASSET_FOR_UPDATE, asset_id)


async def lock_task(
    conn: Connection, provider: str, provider_task_id: str
) -> asyncpg.Record | None:
    """The generation task's id and status, its row locked; None when there is none."""
    with map_db_errors("locking the generation task"):
        return await conn.fetchrow(TASK_FOR_UPDATE, provider, provider_task_id)


async def bump_task_cancel_version(conn: Connection, task_id: uuid.UUID) -> None:
    with map_db_errors("recording the cancellation"):
        await conn.execute(BUMP_TASK_CANCEL_VERSION, task_id)


async def lock_task_assets(conn: Connection, task_id: uuid.UUID) -> list[asyncpg.Record]:
    """Every asset made from the task's outputs (id, status, tenant, version), locked."""
    with map_db_errors("locking the task's assets"):
        return await conn.fetch(TASK_ASSETS_FOR_UPDATE, task_id)


async def bump_asset_cancel_version(
    conn: Connection, asset_id: uuid.UUID, retain_until: datetime
) -> None:
    """The asset's ``cancel_version`` moves; its source is kept at least until
    ``retain_until``."""
    with map_db_errors("recording the cancellation"):
        await conn.execute(BUMP_ASSET_CANCEL_VERSION, asset_id, retain_until)


async def task_status_of_asset(conn: Connection, asset_id: uuid.UUID) -> str | None:
    """The status of the generation task the asset came from (None for an upload)."""
    with map_db_errors("reading the asset's generation task"):
        status = await conn.fetchval(TASK_STATUS_OF_ASSET, asset_id)
    return None if status is None else str(status)


async def bump_delete_version(conn: Connection, asset_id: uuid.UUID) -> None:
    with map_db_errors("recording the deletion"):
        await conn.execute(BUMP_DELETE_VERSION, asset_id)


async def building_revisions(conn: Connection, asset_id: uuid.UUID) -> list[int]:
    """The numbers of the asset's BUILDING revisions."""
    with map_db_errors("reading the building revisions"):
        rows = await conn.fetch(BUILDING_REVISIONS, asset_id)
    return [row["revision"] for row in rows]


async def set_source_retain_until(
    conn: Connection, asset_id: uuid.UUID, retain_until: datetime
) -> None:
    with map_db_errors("keeping the source"):
        await conn.execute(SET_SOURCE_RETAIN_UNTIL, asset_id, retain_until)
