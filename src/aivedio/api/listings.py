"""``GET /v1/assets``, ``GET /v1/videos``, ``GET /v1/generation-tasks``: the tenant's
lists, newest first, a page at a time (``store/listings.py`` says how pages hold still while
rows are added).

``limit`` (1 to ``MAX_LIMIT``, default ``DEFAULT_LIMIT``); ``cursor``: the ``next_cursor``
of the page before, opaque (it names its list: a cursor of another list, or one that does
not decode, is refused 400; a made-up one that decodes only moves within the caller's own
rows, since every statement is the tenant's); filters: ``state`` (repeatable; by default
every state but DELETED), ``created_after``/``created_before`` (RFC 3339), and per list
``source_type``, ``provider``. The answer is ``{"data": [...], "next_cursor": ...}``;
``next_cursor`` is null on the last page. A filter changed between pages is the client's
choice: the cursor only says where the last page ended.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
from aiohttp import web

from aivedio.api import cursors, schema
from aivedio.api.auth import tenant_of
from aivedio.api.context import context
from aivedio.api.problems import ApiError
from aivedio.states import Entity, states
from aivedio.store import listings

routes = web.RouteTableDef()

DEFAULT_LIMIT = 25
MAX_LIMIT = 100
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(2500, 1, 1, tzinfo=UTC)


class AssetItem(msgspec.Struct, frozen=True, kw_only=True):
    asset_id: uuid.UUID
    state: str
    source_type: str
    current_revision: int | None
    moderation: str
    duration_seconds: float | None
    width: int | None
    height: int | None
    generation_task_id: uuid.UUID | None
    provider: str | None
    created_at: datetime
    updated_at: datetime
    passthrough: str | None


class VideoItem(msgspec.Struct, frozen=True, kw_only=True):
    video_id: uuid.UUID
    state: str
    source_type: str
    created_at: datetime
    updated_at: datetime
    passthrough: str | None


class TaskItem(msgspec.Struct, frozen=True, kw_only=True):
    generation_task_id: uuid.UUID
    provider: str
    provider_task_id: str
    status: str
    output_asset_id: uuid.UUID | None
    watched: bool
    created_at: datetime
    updated_at: datetime
    passthrough: str | None


class AssetPage(msgspec.Struct, frozen=True, kw_only=True):
    data: list[AssetItem]
    next_cursor: str | None


class VideoPage(msgspec.Struct, frozen=True, kw_only=True):
    data: list[VideoItem]
    next_cursor: str | None


class TaskPage(msgspec.Struct, frozen=True, kw_only=True):
    data: list[TaskItem]
    next_cursor: str | None


class _Cursor(msgspec.Struct, frozen=True, array_like=True):
    list: str
    created_at: datetime
    id: uuid.UUID


def encode_cursor(name: str, row: Any) -> str:
    return cursors.encode(_Cursor(name, row["created_at"], row["id"]))


def decode_cursor(name: str, text: str) -> listings.After:
    cursor = cursors.decode(text, _Cursor, name)
    if cursor.created_at.tzinfo is None:
        raise ApiError(400, "cursor: not a cursor of this list", field="cursor")
    return listings.After(cursor.created_at, cursor.id)


def _time(request: web.Request, name: str) -> datetime | None:
    value = request.query.get(name)
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ApiError(400, f"{name}: not an RFC 3339 time", field=name) from None
    if when.tzinfo is None or not _EARLIEST <= when < _LATEST:
        raise ApiError(400, f"{name}: a time with its offset, 1970 to 2499", field=name)
    return when


def _one(request: web.Request, name: str, allowed: frozenset[str] | None = None) -> str | None:
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise ApiError(400, f"{name}: give it once", field=name)
    if values and (not values[0] or len(values[0]) > 100):
        raise ApiError(400, f"{name}: 1 to 100 characters", field=name)
    if values and allowed is not None and values[0] not in allowed:
        raise ApiError(400, f"{name}: one of {', '.join(sorted(allowed))}", field=name)
    return values[0] if values else None


def query_of(request: web.Request, name: str, states: frozenset[str]) -> listings.Query:
    raw_limit = request.query.get("limit", str(DEFAULT_LIMIT))
    if not re.fullmatch(r"[0-9]{1,3}", raw_limit) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise ApiError(400, f"limit: an integer from 1 to {MAX_LIMIT}", field="limit")
    wanted = request.query.getall("state", [])
    unknown = sorted(set(wanted) - states)
    if unknown:
        raise ApiError(
            400, f"state: unknown {unknown}; one of {', '.join(sorted(states))}", field="state"
        )
    cursor = request.query.get("cursor")
    return listings.Query(
        tenant_id=tenant_of(request),
        limit=int(raw_limit),
        after=decode_cursor(name, cursor) if cursor is not None else None,
        states=sorted(set(wanted)),
        source_type=_one(request, "source_type", SOURCE_TYPES) if name != "tasks" else None,
        provider=_one(request, "provider") if name != "videos" else None,
        created_after=_time(request, "created_after"),
        created_before=_time(request, "created_before"),
    )


def _next(name: str, rows: list[Any], limit: int) -> tuple[list[Any], str | None]:
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(name, rows[-1])


ASSET_STATES = states(Entity.ASSET)
VIDEO_STATES = ASSET_STATES | frozenset(listings.SESSION_STATES.values())
TASK_STATES = states(Entity.GENERATION_TASK)
SOURCE_TYPES = frozenset({"PROVIDER_OUTPUT", "UPLOAD"})


@routes.get("/v1/assets")
async def list_assets(request: web.Request) -> web.Response:
    q = query_of(request, "assets", ASSET_STATES)
    rows, cursor = _next("assets", await listings.assets(context(request).pool, q), q.limit)
    items = [
        AssetItem(
            asset_id=r["id"],
            state=r["status"],
            source_type=r["source_type"],
            current_revision=r["current_revision"],
            moderation=r["moderation_status"],
            duration_seconds=r["duration_us"] / 1e6 if r["duration_us"] is not None else None,
            width=r["width"],
            height=r["height"],
            generation_task_id=r["generation_task_id"],
            provider=r["provider"],
            created_at=r["created_at"],
            updated_at=r["updated_at"],
            passthrough=r["passthrough"],
        )
        for r in rows
    ]
    return schema.encode(AssetPage(data=items, next_cursor=cursor))


@routes.get("/v1/videos")
async def list_videos(request: web.Request) -> web.Response:
    q = query_of(request, "videos", VIDEO_STATES)
    rows, cursor = _next("videos", await listings.videos(context(request).pool, q), q.limit)
    items = [
        VideoItem(
            video_id=r["id"],
            state=r["state"],
            source_type=r["source_type"],
            created_at=r["created_at"],
            updated_at=r["updated_at"],
            passthrough=r["passthrough"],
        )
        for r in rows
    ]
    return schema.encode(VideoPage(data=items, next_cursor=cursor))


@routes.get("/v1/generation-tasks")
async def list_tasks(request: web.Request) -> web.Response:
    q = query_of(request, "tasks", TASK_STATES)
    rows, cursor = _next(
        "tasks", await listings.generation_tasks(context(request).pool, q), q.limit
    )
    items = [
        TaskItem(
            generation_task_id=r["id"],
            provider=r["provider"],
            provider_task_id=r["provider_task_id"],
            status=r["provider_status"],
            output_asset_id=r["output_asset_id"],
            watched=r["watch"],
            created_at=r["created_at"],
            updated_at=r["updated_at"],
            passthrough=r["passthrough"],
        )
        for r in rows
    ]
    return schema.encode(TaskPage(data=items, next_cursor=cursor))


def _query_param(name: str, description: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": value,
    }


def _parameters(states: frozenset[str], *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        _query_param(
            "limit",
            f"items per page, 1 to {MAX_LIMIT}",
            {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        ),
        _query_param(
            "cursor", "the next_cursor of the page before", {"type": "string", "maxLength": 200}
        ),
        {
            **_query_param(
                "state",
                "only these states (repeat it); default every state but DELETED",
                {"type": "array", "items": {"type": "string", "enum": sorted(states)}},
            ),
            "style": "form",
            "explode": True,
        },
        _query_param(
            "created_after",
            "created after this time (RFC 3339)",
            {"type": "string", "format": "date-time"},
        ),
        _query_param(
            "created_before",
            "created before this time (RFC 3339)",
            {"type": "string", "format": "date-time"},
        ),
        *extra,
    ]


_SOURCE = _query_param(
    "source_type", "only this source", {"type": "string", "enum": sorted(SOURCE_TYPES)}
)
_PROVIDER = _query_param(
    "provider", "only this provider's", {"type": "string", "minLength": 1, "maxLength": 100}
)


def _get(summary: str, operation: str, tag: str, page: type, params: list[Any]) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "description": "Newest first; pages hold still while rows are added.",
            "operationId": operation,
            "tags": [tag],
            "parameters": params,
            "responses": schema.responses({"200": schema.ok_json(page)}, 400, 503),
        }
    }


PATHS: dict[str, Any] = {
    "/v1/assets": _get(
        "The tenant's assets",
        "listAssets",
        "assets",
        AssetPage,
        _parameters(ASSET_STATES, _SOURCE, _PROVIDER),
    ),
    "/v1/videos": _get(
        "The tenant's videos (assets, and upload sessions not completed)",
        "listVideos",
        "videos",
        VideoPage,
        _parameters(VIDEO_STATES, _SOURCE),
    ),
    "/v1/generation-tasks": _get(
        "The tenant's generation tasks",
        "listGenerationTasks",
        "providers",
        TaskPage,
        _parameters(TASK_STATES, _PROVIDER),
    ),
}
SCHEMAS: tuple[type, ...] = (AssetPage, VideoPage, TaskPage, AssetItem, VideoItem, TaskItem)
