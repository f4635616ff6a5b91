"""``POST /v1/generation-tasks``: watch a generation task submitted to a provider elsewhere.

The tenant is the API key's. The task is polled by the worker (``pipeline/poller.py``) at the
provider's cadence until it ends; its outputs are then recorded exactly as a verified
callback records them. Registering the same ``(provider, task_id)`` again answers 200 with
the same watch (201 the first time); another tenant's task is refused 409; a provider whose
``[providers.NAME] tenant`` is another tenant, or an id the provider cannot have issued, 422.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from aiohttp import web

from aivedio import untrusted
from aivedio.api import schema
from aivedio.api.auth import tenant_of
from aivedio.api.bodies import read_body
from aivedio.api.context import context
from aivedio.api.idempotency import idempotent
from aivedio.api.problems import ApiError
from aivedio.api.video_bodies import Passthrough
from aivedio.errors import MalformedInputError, NotFoundError, PolicyBlockedError
from aivedio.logs import get_logger
from aivedio.pipeline.poller import register_watch
from aivedio.store.database import acquired
from aivedio.untrusted import whole

log = get_logger("aivedio.api")
routes = web.RouteTableDef()
BODY_MAX_BYTES = 16 * 1024

Name = Annotated[
    str, msgspec.Meta(min_length=1, max_length=100, pattern=whole(r"^[A-Za-z0-9_.-]+$"))
]
TaskId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=400, pattern=whole(r"^[\x21-\x7e]+$"))
]


class WatchTask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A task the provider is running for this tenant."""

    provider: Name
    task_id: TaskId
    # Kept from the first registration that gives one.
    passthrough: Passthrough | None = None


class WatchedTask(msgspec.Struct, frozen=True, kw_only=True):
    generation_task_id: uuid.UUID
    provider: str
    task_id: str
    # WATCHING, or how the watch ended: SUCCEEDED, FAILED, GAVE_UP
    watch_status: str
    created: bool


@routes.post("/v1/generation-tasks")
async def watch_task(request: web.Request) -> web.StreamResponse:
    ctx = context(request)
    body = await read_body(
        request,
        limit_bytes=BODY_MAX_BYTES,
        timeout_seconds=ctx.config.api.body_read_timeout_seconds,
    )
    return await idempotent(request, body, lambda: _watch(request, body))


async def _watch(request: web.Request, body: bytes) -> web.Response:
    ctx = context(request)
    try:
        wanted = untrusted.decode(body, WatchTask)
    except MalformedInputError as exc:
        raise ApiError(400, f"request body: {exc.detail}", exc.reason, field=exc.field) from None
    tenant_id = tenant_of(request)
    try:
        async with acquired(ctx.pool) as conn:
            watch = await register_watch(
                conn,
                queue=ctx.queue,
                config=ctx.config,
                provider=wanted.provider,
                provider_task_id=wanted.task_id,
                tenant_id=tenant_id,
                passthrough=wanted.passthrough,
            )
    except NotFoundError as exc:
        raise ApiError(422, exc.detail, "unknown_provider") from None
    except PolicyBlockedError as exc:
        reason = exc.detail.partition(":")[0]
        if reason == "tenant_mismatch":
            raise ApiError(409, "this task is registered by another tenant", "conflict") from None
        raise ApiError(422, exc.detail, reason) from None
    log.info(
        "task_watch_registered",
        tenant_id=tenant_id,
        provider=wanted.provider,
        task_id=wanted.task_id,
        created=watch.created,
    )
    answer = WatchedTask(
        generation_task_id=watch.generation_task_id,
        provider=watch.provider,
        task_id=watch.provider_task_id,
        watch_status=watch.status,
        created=watch.created,
    )
    return schema.encode(answer, status=201 if watch.created else 200)


_LINKS = {
    "getGenerationTask": schema.link(
        "getGenerationTask",
        "the task, and its outputs once it ends",
        {"task_id": "$response.body#/generation_task_id"},
    )
}
PATHS: dict[str, Any] = {
    "/v1/generation-tasks": {
        "post": {
            "summary": "Watch a generation task submitted to a provider elsewhere",
            "operationId": "watchGenerationTask",
            "tags": ["providers"],
            "parameters": [schema.IDEMPOTENCY_KEY],
            "requestBody": {"required": True, "content": schema.json_content(WatchTask)},
            "responses": schema.responses(
                {
                    "201": {
                        **schema.ok_json(WatchedTask, "watching; the worker polls the task"),
                        "links": _LINKS,
                    },
                    "200": {
                        **schema.ok_json(WatchedTask, "already registered; nothing changed"),
                        "links": _LINKS,
                    },
                },
                # Every body error is 400 here (naming the field), whatever its kind.
                400,
                408,
                409,
                413,
                422,
                503,
            ),
        }
    }
}
SCHEMAS: tuple[type, ...] = (WatchTask, WatchedTask)
