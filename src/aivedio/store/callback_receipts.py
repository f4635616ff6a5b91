"""The statements of a provider callback's own bookkeeping: the receipt of its event id (an
event is accepted once per provider) and the lock on the task whose progress it reports."""

from __future__ import annotations

import asyncpg

from aivedio.store.database import Connection, map_db_errors
from aivedio.store.together import Part

RECEIPT_SQL = (
    "INSERT INTO callback_receipts (provider, event_id) VALUES ($1, $2)"
    " ON CONFLICT DO NOTHING RETURNING 1"
)
LOCK_TASK_SQL = (
    "SELECT id, provider_status, version FROM generation_tasks"
    " WHERE provider = $1 AND provider_task_id = $2 FOR UPDATE"
)


def receipt_part(provider: str, event_id: str) -> Part:
    """The statement that records a callback's event id: a row when it is new, none when it
    was seen before (a replay or a duplicate)."""
    return Part(RECEIPT_SQL, (provider, event_id))


async def lock_task_by_provider_id(
    conn: Connection, provider: str, provider_task_id: str
) -> asyncpg.Record | None:
    """The provider's task (``id``, ``provider_status``, ``version``), locked for the rest of
    the caller's transaction; None when there is no such task."""
    with map_db_errors("recording the task's progress"):
        return await conn.fetchrow(LOCK_TASK_SQL, provider, provider_task_id)
