"""The tenant's lists, a page at a time: assets, videos (assets and the upload sessions that
have none yet) and generation tasks (``api/listings.py`` serves them).

Every list is newest first by ``(created_at, id)`` and pages by keyset: a page after
``(created_at, id)`` holds the rows strictly before it in that order, so rows inserted while
a client pages (they are newer) never shift a later page, and no row is shown twice. A row
whose transaction commits after the client fetched the page it would have fallen in is not
shown in that walk (its ``created_at`` is its transaction's start); the next walk has it.
Filters are plain columns; every statement is scoped to the tenant and bounded by ``limit``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from aivedio.store.database import Pool, map_db_errors


@dataclass(frozen=True, slots=True)
class After:
    """The last row of the page before: where this page starts (exclusive)."""

    created_at: datetime
    id: uuid.UUID


@dataclass(slots=True)
class Query:
    """One page's question. ``states``: any of them (empty: all but DELETED)."""

    tenant_id: int
    limit: int
    after: After | None = None
    states: list[str] = field(default_factory=list)
    source_type: str | None = None
    provider: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


class _Where:
    """A WHERE clause built from parameters, numbered as they are added."""

    def __init__(self, args: list[Any] | None = None) -> None:
        self.parts: list[str] = []
        # Shared by the clauses of one statement (a UNION numbers its parameters once).
        self.args: list[Any] = [] if args is None else args

    def add(self, template: str, *values: Any) -> None:
        numbers = [f"${len(self.args) + i + 1}" for i in range(len(values))]
        self.parts.append(template.format(*numbers))
        self.args.extend(values)

    def common(self, q: Query, alias: str, created: str = "created_at") -> None:
        """The tenant, the created range and the page's start; ``created``: the column a
        row is listed by."""
        at = f"{alias}.{created}"
        self.add(f"{alias}.tenant_id = {{}}", q.tenant_id)
        if q.created_after is not None:
            self.add(f"{at} > {{}}", q.created_after)
        if q.created_before is not None:
            self.add(f"{at} < {{}}", q.created_before)
        if q.after is not None:
            self.add(f"({at}, {alias}.id) < ({{}}, {{}})", q.after.created_at, q.after.id)

    def sql(self) -> str:
        return " AND ".join(self.parts) if self.parts else "true"


def _order(alias: str = "", created: str = "created_at") -> str:
    dot = f"{alias}." if alias else ""
    return f" ORDER BY {dot}{created} DESC, {dot}id DESC"


def _limit(q: Query) -> str:
    # One more than asked: whether there is a next page.
    return f" LIMIT {int(q.limit) + 1}"


async def assets(pool: Pool, q: Query) -> list[asyncpg.Record]:
    where = _Where()
    where.common(q, "a")
    _states(where, q, "a.status")
    if q.source_type is not None:
        where.add("a.source_type = {}", q.source_type)
    if q.provider is not None:
        where.add("t.provider = {}", q.provider)
    # The page first (on the tenant's index), then the passthrough of its rows only.
    sql = (
        "SELECT page.*, aivedio_passthrough(page.id) AS passthrough FROM ("
        "SELECT a.id, a.created_at, a.updated_at, a.status, a.source_type,"
        " a.current_revision, a.moderation_status, a.duration_us, a.width, a.height,"
        " o.generation_task_id, t.provider"
        " FROM assets a"
        " LEFT JOIN provider_outputs o ON o.id = a.source_provider_output_id"
        " LEFT JOIN generation_tasks t ON t.id = o.generation_task_id"
        f" WHERE {where.sql()}" + _order("a") + _limit(q) + ") page" + _order()
    )
    with map_db_errors("listing assets"):
        return list(await pool.fetch(sql, *where.args))


# An upload session's state as the video shows it (a completed one is its asset's).
SESSION_STATES = {
    "AWAITING_UPLOAD": "AWAITING_UPLOAD",
    "FAILED": "UPLOAD_FAILED",
    "EXPIRED": "UPLOAD_EXPIRED",
}


async def videos(pool: Pool, q: Query) -> list[asyncpg.Record]:
    """Assets and the upload sessions that made none (yet): the videos of
    ``GET /v1/videos/{id}/status``. A session past its expiry that the sweeper has not
    marked yet shows UPLOAD_EXPIRED. Each side pages on its own index, then the two pages
    are merged: a page costs its rows, whatever the tables hold."""
    assets_where = _Where()
    sessions_where = _Where(assets_where.args)
    # An uploaded video is listed at its session's creation, before and after it completes.
    assets_where.common(q, "a", "video_created_at")
    _states(assets_where, q, "a.status")
    if q.source_type is not None:
        assets_where.add("a.source_type = {}", q.source_type)
    sessions_where.common(q, "s")
    sessions_where.add("s.status <> 'COMPLETED'")
    session_state = (
        "CASE WHEN s.status = 'AWAITING_UPLOAD' AND s.expires_at <= now()"
        " THEN 'UPLOAD_EXPIRED' ELSE CASE s.status"
        + "".join(f" WHEN '{k}' THEN '{v}'" for k, v in SESSION_STATES.items())
        + " END END"
    )
    if q.states:
        sessions_where.add(f"{session_state} = ANY({{}}::text[])", q.states)
    if q.source_type not in (None, "UPLOAD") or q.provider is not None:
        sessions_where.add("false")
    sql = (
        "SELECT page.id, page.created_at, page.updated_at, page.state, page.source_type,"
        " CASE WHEN page.session THEN page.session_passthrough"
        " ELSE aivedio_passthrough(page.id) END AS passthrough FROM ("
        "(SELECT a.id, a.video_created_at AS created_at, a.updated_at, a.status AS state,"
        " a.source_type, false AS session, NULL::text AS session_passthrough"
        f" FROM assets a WHERE {assets_where.sql()}"
        + _order("a", "video_created_at")
        + _limit(q)
        + ")"
        " UNION ALL"
        f" (SELECT s.id, s.created_at, s.created_at AS updated_at, {session_state} AS state,"
        " 'UPLOAD' AS source_type, true AS session, s.passthrough AS session_passthrough"
        f" FROM upload_sessions s WHERE {sessions_where.sql()}" + _order("s") + _limit(q) + ")"
        ") page" + _order() + _limit(q)
    )
    with map_db_errors("listing videos"):
        return list(await pool.fetch(sql, *assets_where.args))


async def generation_tasks(pool: Pool, q: Query) -> list[asyncpg.Record]:
    where = _Where()
    where.common(q, "t")
    if q.states:
        where.add("t.provider_status = ANY({}::text[])", q.states)
    if q.provider is not None:
        where.add("t.provider = {}", q.provider)
    sql = (
        "SELECT t.id, t.created_at, t.updated_at, t.provider,"
        " t.provider_task_id, t.provider_status, t.output_asset_id, t.watch, t.passthrough"
        f" FROM generation_tasks t WHERE {where.sql()}" + _order("t") + _limit(q)
    )
    with map_db_errors("listing generation tasks"):
        return list(await pool.fetch(sql, *where.args))


def _states(where: _Where, q: Query, column: str) -> None:
    if q.states:
        where.add(f"{column} = ANY({{}}::text[])", q.states)
    else:
        where.add(f"{column} <> 'DELETED'")
