"""Generation tasks and their watches: the rows intake and the poller keep of a provider task.

A task is known by ``(provider, provider_task_id)``; intake records it SUCCEEDED (made if we
never saw it), the poller registers it SUBMITTED with a ``task_watches`` row and reads it
until it ends. Every call here runs inside ``map_db_errors`` under the caller's wording.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from aivedio.store.database import Connection, map_db_errors
from aivedio.store.together import Part

# A task first heard of as SUCCEEDED (a callback, a poll, ``aivedio ingest``): nothing when
# the provider's task is known already.
INSERT_SUCCEEDED_TASK = (
    "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
    " provider_status) VALUES ($1, $2, $3, $4, 'PROVIDER_SUCCEEDED')"
    " ON CONFLICT (provider, provider_task_id) DO NOTHING RETURNING id"
)


def new_succeeded_task_part(
    task_id: uuid.UUID, tenant_id: int, provider: str, provider_task_id: str
) -> Part:
    """The insert of a task first heard of as SUCCEEDED; answers its id (None: known)."""
    return Part(INSERT_SUCCEEDED_TASK, (task_id, tenant_id, provider, provider_task_id), value="id")


async def insert_succeeded_task(
    conn: Connection,
    task_id: uuid.UUID,
    tenant_id: int,
    provider: str,
    provider_task_id: str,
    *,
    doing: str,
) -> Any:
    """The id of the task made SUCCEEDED, or None when the provider's task is known."""
    with map_db_errors(doing):
        return await conn.fetchval(
            INSERT_SUCCEEDED_TASK, task_id, tenant_id, provider, provider_task_id
        )


async def lock_task_by_provider_id(
    conn: Connection, provider: str, provider_task_id: str, *, doing: str
) -> asyncpg.Record | None:
    """The task's id, tenant, state and version, locked for the caller's transaction."""
    with map_db_errors(doing):
        return await conn.fetchrow(
            "SELECT id, tenant_id, provider_status, version FROM generation_tasks"
            " WHERE provider = $1 AND provider_task_id = $2 FOR UPDATE",
            provider,
            provider_task_id,
        )


async def lock_task(conn: Connection, task_id: uuid.UUID) -> asyncpg.Record | None:
    """A task's state and version, locked for the caller's transaction."""
    with map_db_errors("moving a generation task"):
        return await conn.fetchrow(
            "SELECT provider_status, version FROM generation_tasks WHERE id = $1 FOR UPDATE",
            task_id,
        )


# -- callbacks: whose task it is --------------------------------------------------------------


def task_tenant_part(provider: str, provider_task_id: str) -> Part:
    """The tenant of a known task (None: we never saw it)."""
    return Part(
        "SELECT tenant_id FROM generation_tasks WHERE provider = $1 AND provider_task_id = $2",
        (provider, provider_task_id),
        value="tenant_id",
    )


def tenant_named_part(name: str | None) -> Part:
    """The id of the tenant called ``name`` (None: no such tenant)."""
    return Part("SELECT id FROM tenants WHERE name = $1", (name,), value="id")


async def tenant_exists(conn: Connection, tenant_id: int) -> bool:
    with map_db_errors("looking up a tenant"):
        return bool(await conn.fetchval("SELECT 1 FROM tenants WHERE id = $1", tenant_id))


# -- watches ----------------------------------------------------------------------------------


async def tenant_id_named(conn: Connection, name: str, *, doing: str) -> Any:
    """The id of the tenant called ``name``, or None."""
    with map_db_errors(doing):
        return await conn.fetchval("SELECT id FROM tenants WHERE name = $1", name)


async def insert_watched_task(
    conn: Connection,
    task_id: uuid.UUID,
    tenant_id: int,
    provider: str,
    provider_task_id: str,
    *,
    doing: str,
) -> Any:
    """A task first heard of by a watch, SUBMITTED and watched; None when it is known."""
    with map_db_errors(doing):
        return await conn.fetchval(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status, watch) VALUES ($1, $2, $3, $4, 'SUBMITTED', true)"
            " ON CONFLICT (provider, provider_task_id) DO NOTHING RETURNING id",
            task_id,
            tenant_id,
            provider,
            provider_task_id,
        )


async def keep_passthrough(conn: Connection, task_id: Any, passthrough: str, *, doing: str) -> None:
    """The task's passthrough, unless it has one already (the first one given stays)."""
    with map_db_errors(doing):
        await conn.execute(
            "UPDATE generation_tasks SET passthrough = $2 WHERE id = $1 AND passthrough IS NULL",
            task_id,
            passthrough,
        )


async def lock_watched_task(
    conn: Connection, provider: str, provider_task_id: str, *, doing: str
) -> asyncpg.Record | None:
    """The task's id, tenant and state, locked for the caller's transaction."""
    with map_db_errors(doing):
        return await conn.fetchrow(
            "SELECT id, tenant_id, provider_status FROM generation_tasks"
            " WHERE provider = $1 AND provider_task_id = $2 FOR UPDATE",
            provider,
            provider_task_id,
        )


async def insert_watch(
    conn: Connection,
    task_id: Any,
    tenant_id: int,
    provider: str,
    provider_task_id: str,
    status: str,
    watch_max_seconds: float,
    *,
    doing: str,
) -> Any:
    """The task's watch row, given up after ``watch_max_seconds``; None when it has one."""
    with map_db_errors(doing):
        return await conn.fetchval(
            "INSERT INTO task_watches (generation_task_id, tenant_id, provider,"
            " provider_task_id, status, give_up_at) VALUES ($1, $2, $3, $4, $5,"
            " now() + make_interval(secs => $6)) ON CONFLICT DO NOTHING RETURNING 1",
            task_id,
            tenant_id,
            provider,
            provider_task_id,
            status,
            watch_max_seconds,
        )


async def watch_status(conn: Connection, task_id: Any, *, doing: str) -> asyncpg.Record | None:
    """The watch's status and round."""
    with map_db_errors(doing):
        return await conn.fetchrow(
            "SELECT status, round FROM task_watches WHERE generation_task_id = $1", task_id
        )


async def restart_watch(
    conn: Connection, task_id: Any, watch_max_seconds: float, *, doing: str
) -> Any:
    """A watch given up, WATCHING again in a new round (answered) with a fresh budget."""
    with map_db_errors(doing):
        return await conn.fetchval(
            "UPDATE task_watches SET status = 'WATCHING', round = round + 1,"
            " consecutive_failures = 0, updated_at = now(),"
            " give_up_at = now() + make_interval(secs => $2)"
            " WHERE generation_task_id = $1 RETURNING round",
            task_id,
            watch_max_seconds,
        )


async def mark_task_watched(conn: Connection, task_id: Any, *, doing: str) -> None:
    with map_db_errors(doing):
        await conn.execute(
            "UPDATE generation_tasks SET watch = true WHERE id = $1 AND NOT watch", task_id
        )


async def load_watch(conn: Any, task_id: uuid.UUID) -> asyncpg.Record | None:
    """A watch with its task's state and version (``task_version``). ``conn``: a
    connection or a pool."""
    with map_db_errors("reading a watched task"):
        row: asyncpg.Record | None = await conn.fetchrow(
            "SELECT w.*, t.provider_status, t.version AS task_version FROM task_watches w"
            " JOIN generation_tasks t ON t.id = w.generation_task_id"
            " WHERE w.generation_task_id = $1",
            task_id,
        )
    return row


async def record_poll(conn: Connection, task_id: uuid.UUID, provider_status: str) -> None:
    """A poll that found the task still running."""
    with map_db_errors("recording a poll"):
        await conn.execute(
            "UPDATE task_watches SET polls = polls + 1, consecutive_failures = 0,"
            " last_provider_status = $2, last_polled_at = now(), updated_at = now()"
            " WHERE generation_task_id = $1",
            task_id,
            provider_status,
        )


async def record_failed_poll(
    conn: Any, task_id: uuid.UUID, failures: int, error_class: str, detail: str
) -> None:
    """A poll that failed, the ``failures``-th in a row. ``conn``: a connection or a pool."""
    with map_db_errors("recording a poll"):
        await conn.execute(
            "UPDATE task_watches SET polls = polls + 1, consecutive_failures = $2,"
            " last_error_class = $3, last_error_detail = $4, last_polled_at = now(),"
            " updated_at = now() WHERE generation_task_id = $1",
            task_id,
            failures,
            error_class,
            detail,
        )


async def end_watch(
    conn: Any,
    task_uuid: uuid.UUID,
    status: str,
    *,
    provider_status: str | None = None,
    error: tuple[str, str] | None = None,
) -> None:
    """A WATCHING watch ends in ``status`` (with the provider's last answer, or the error it
    gave up on), and the task is no longer watched. ``conn``: a connection or a pool."""
    with map_db_errors("ending a watch"):
        await conn.execute(
            "UPDATE task_watches SET status = $2, polls = polls + $3,"
            " last_provider_status = coalesce($4, last_provider_status),"
            " last_error_class = coalesce($5, last_error_class),"
            " last_error_detail = coalesce($6, last_error_detail),"
            " last_polled_at = now(), updated_at = now()"
            " WHERE generation_task_id = $1 AND status = 'WATCHING'",
            task_uuid,
            status,
            1 if provider_status else 0,
            provider_status,
            error[0] if error else None,
            error[1][:2000] if error else None,
        )
        await conn.execute("UPDATE generation_tasks SET watch = false WHERE id = $1", task_uuid)
