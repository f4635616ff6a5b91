"""``GET /v1/assets/{asset_id}/events``: an asset's stage changes as Server-Sent Events, so a
page can show "generated → receiving video → processing → playable" without polling.

The database is the source of truth: triggers append every status change of the asset, of
the provider output it came from and of that output's generation task to ``stage_events``
(migration 0007), and a stream reads that log by id (``store.stage_events.read_after``). The
event id is the log's id, so a client that reconnects with ``Last-Event-ID`` gets exactly
what it has not seen; without one it gets the whole history first, then live changes.

NOTIFY only wakes readers up. Each API process holds one LISTEN connection
(``run_listener``, supervised: reconnecting with backoff, down in ``/readyz`` while it
cannot listen) and fans wake-ups out to the streams
subscribed to the changed row's id; a stream re-reads the log after every wake-up and every
``REQUERY_SECONDS`` anyway, so a notification lost to a reconnect delays an event, never
loses it. Streams use short pooled queries only, never a connection of their own.

Between stage events, a ``progress`` event carries the asset's render progress (the same
``progress`` as ``GET /v1/videos/{id}/status``, a percentage as Cloudflare Stream's
``pctComplete``) each time it changes while a render runs (the end is the ENRICHED stage
event). It is read with the log, while the asset is not
final: workers store it once a heartbeat (``aivedio.progress``), nothing notifies it, so
the timer finds it. It has no ``id``: a reconnecting client resumes by stage events, and
the next read sends the progress again.

A stream ends when the client goes away (seen at the next write or tick) and when the server
shuts down (``close_streams``, or ``ctx.stopping``): the client reconnects elsewhere with its
``Last-Event-ID``. Not while the process only drains (``ctx.draining``: /readyz answers 503 so
the balancer takes it out): a stream ended then could reconnect to this same process and be
refused, and a browser's EventSource gives up on a refusal.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal, cast

import anyio
import msgspec
from aiohttp import web
from anyio.abc import TaskStatus

from aivedio.api import schema
from aivedio.api.auth import tenant_of
from aivedio.api.context import ApiContext, context
from aivedio.api.ids import path_uuid
from aivedio.api.problems import ApiError
from aivedio.errors import DatabaseError
from aivedio.logs import get_logger
from aivedio.states import Entity
from aivedio.store import listening
from aivedio.store.asset_status import progress_now
from aivedio.store.database import map_db_errors
from aivedio.store.listening import Wakeup
from aivedio.store.stage_events import (
    MAX_EVENT_ID,
    NOTIFY_CHANNEL,
    Scope,
    StageRow,
    read_after,
    scope_of,
)
from aivedio.supervision import Loop, supervise

log = get_logger("aivedio.api")

routes = web.RouteTableDef()

# Re-read the log this often even without a wake-up (a NOTIFY may be lost while reconnecting).
REQUERY_SECONDS = 5.0
# A writer of the stream's rows was mid-transaction: look again after about this long
# (doubling, up to 2 s, while it stays so).
HOLD_BACK_SECONDS = 0.1
# How often a waiting stream checks that its client is still there and the server running.
TICK_SECONDS = 1.0
# A client that does not read for this long is dropped (it reconnects with Last-Event-ID).
WRITE_TIMEOUT_SECONDS = 30.0
# Events read and written at once while replaying a long history.
BATCH = 500
# The reconnection delay suggested to EventSource clients.
RETRY_MILLISECONDS = 2000
# The LISTEN connection proves it is alive this often.
LISTEN_CHECK_SECONDS = 30.0
# At shutdown, how long close_streams waits for the streams to finish.
CLOSE_WAIT_SECONDS = 5.0

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

Phase = Literal[
    "generating",
    "generated",
    "receiving",
    "stored",
    "processing",
    "playable",
    "enriched",
    "failed",
    "cancelled",
    "deleted",
]
EntityName = Literal["generation_task", "provider_output", "asset"]

# What a person is told for each state, and whether the row's error class goes with it: the
# one place a status becomes a phase. tests/unit/api/test_events.py checks it covers every
# state in aivedio.states, so a new state cannot be streamed without a phase.
PHASES: Mapping[Entity, Mapping[str, tuple[Phase, bool]]] = {
    Entity.GENERATION_TASK: {
        "SUBMITTED": ("generating", False),
        "PROVIDER_RUNNING": ("generating", False),
        "PROVIDER_SUCCEEDED": ("generated", False),
        "PROVIDER_FAILED": ("failed", False),
        "CANCELLED": ("cancelled", False),
    },
    Entity.PROVIDER_OUTPUT: {
        "DISCOVERED": ("receiving", False),
        "FETCH_PENDING": ("receiving", False),
        "FETCHING": ("receiving", False),
        "RETRY_WAIT": ("receiving", True),
        "NEED_URL_REFRESH": ("receiving", True),
        "STORED": ("stored", False),
        "INVALID_RESPONSE": ("failed", True),
        "OUTPUT_LOST": ("failed", True),
    },
    Entity.ASSET: {
        "QUARANTINED": ("stored", False),
        "PROBING": ("processing", False),
        "PROCESSING": ("processing", False),
        "PLAYABLE": ("playable", False),
        "ENRICHED": ("enriched", False),
        "REJECTED": ("failed", True),
        "PROCESSING_FAILED": ("failed", True),
        "INVALID_MEDIA": ("failed", True),
        "DELETED": ("deleted", True),
    },
}
# A state missing from PHASES (only possible if the table fell behind the states module).
_IN_PROGRESS: Mapping[Entity, Phase] = {
    Entity.GENERATION_TASK: "generating",
    Entity.PROVIDER_OUTPUT: "receiving",
    Entity.ASSET: "processing",
}


class StageEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The data of one ``stage`` event: a status change of the asset, of the provider output
    it was fetched from, or of that output's generation task. ``event_id`` is also the SSE
    ``id``; ``error_class`` is given with failures (and retries, and deletion) when known."""

    event_id: int
    asset_id: uuid.UUID
    entity: EntityName
    state: str
    phase: Phase
    at: datetime
    provider_output_id: uuid.UUID | None = None
    generation_task_id: uuid.UUID | None = None
    error_class: str | None = None


class ProgressEvent(msgspec.Struct, frozen=True, kw_only=True):
    """The data of one ``progress`` event: the asset's render progress in percent."""

    asset_id: uuid.UUID
    progress: float


# Asset states after which no render runs: a stream stops reading progress.
_NO_MORE_PROGRESS = frozenset(
    {"ENRICHED", "REJECTED", "PROCESSING_FAILED", "INVALID_MEDIA", "DELETED"}
)


def phase_of(entity: Entity, state: str) -> tuple[Phase, bool]:
    return PHASES[entity].get(state, (_IN_PROGRESS[entity], True))


def stage_event(scope: Scope, row: StageRow) -> StageEvent:
    entity = Entity(row.entity)
    phase, with_error = phase_of(entity, row.state)
    if entity is Entity.ASSET:
        output, task = scope.provider_output_id, scope.generation_task_id
    else:
        output, task = row.provider_output_id, row.generation_task_id
    return StageEvent(
        event_id=row.id,
        asset_id=scope.asset_id,
        entity=cast(EntityName, row.entity),
        state=row.state,
        phase=phase,
        at=row.at,
        provider_output_id=output,
        generation_task_id=task,
        error_class=row.error_class if with_error else None,
    )


def frame(event: StageEvent) -> bytes:
    """One event in the SSE wire format (the JSON has no newline, so one data line)."""
    return b"id: %d\nevent: stage\ndata: %s\n\n" % (event.event_id, msgspec.json.encode(event))


def progress_frame(event: ProgressEvent) -> bytes:
    """A ``progress`` event: no ``id``, so it never moves a client's Last-Event-ID."""
    return b"event: progress\ndata: %s\n\n" % msgspec.json.encode(event)


_EVENT_ID = re.compile(r"[0-9]{1,40}")


def parse_last_event_id(value: str | None) -> int:
    """The cursor a reconnecting client asks for. Anything but a decimal id replays the whole
    history: a client only ever echoes ids we sent, and replaying loses nothing."""
    if value is None or not _EVENT_ID.fullmatch(value.strip()):
        return 0
    return min(int(value.strip()), MAX_EVENT_ID)


class Hub:
    """Wake-ups heard on the LISTEN connection, fanned out by the changed row's id."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[Wakeup]] = {}
        self._open = 0
        self._all_ended = anyio.Event()
        self.closing = False

    @contextmanager
    def subscribe(self, keys: Iterable[uuid.UUID]) -> Iterator[Wakeup]:
        """A stream's wake-ups while it is open: rung by changes of any row in ``keys``."""
        wakeup = Wakeup()
        names = [str(key) for key in keys]
        for name in names:
            self._by_key.setdefault(name, set()).add(wakeup)
        self._open += 1
        try:
            yield wakeup
        finally:
            for name in names:
                subscribers = self._by_key.get(name)
                if subscribers is not None:
                    subscribers.discard(wakeup)
                    if not subscribers:
                        del self._by_key[name]
            self._open -= 1
            if self.closing and self._open == 0:
                self._all_ended.set()

    def notify(self, key: str) -> None:
        for wakeup in self._by_key.get(key, ()):
            wakeup.ring()

    def wake_all(self) -> None:
        for subscribers in self._by_key.values():
            for wakeup in subscribers:
                wakeup.ring()

    async def close(self) -> None:
        """Ring every stream to end and wait until they have."""
        self.closing = True
        self.wake_all()
        if self._open:
            await self._all_ended.wait()


# One hub per API context (a process serves one; tests serve several in turn).
_HUBS: dict[int, Hub] = {}


def hub_of(ctx: ApiContext) -> Hub:
    return _HUBS.setdefault(id(ctx), Hub())


@routes.get("/v1/assets/{asset_id}/events")
async def asset_events(request: web.Request) -> web.StreamResponse:
    ctx = context(request)
    asset_id = path_uuid(request, "asset_id", "asset")
    scope = await scope_of(ctx.pool, tenant_of(request), asset_id)
    if scope is None:
        raise ApiError(404, "no such asset")
    if ctx.stopping:
        raise ApiError(503, "the server is shutting down; reconnect")
    cursor = parse_last_event_id(request.headers.get("Last-Event-ID"))
    hub = hub_of(ctx)
    response = web.StreamResponse(headers=SSE_HEADERS)
    # Subscribed before the first read, so a change committed after it always rings.
    with hub.subscribe(scope.keys) as wakeup:
        ctx.streams.add(response)
        ctx.metrics.event_streams.inc()
        try:
            await _stream(request, response, ctx, hub, scope, cursor, wakeup)
        except (ConnectionError, TimeoutError):
            pass  # the client went away or stopped reading; it resumes with Last-Event-ID
        except Exception:
            # The status line is sent: nothing to answer, only to end the stream.
            log.exception("event_stream_crashed", asset_id=str(asset_id))
        finally:
            ctx.streams.discard(response)
            ctx.metrics.event_streams.dec()
    return response


async def _stream(
    request: web.Request,
    response: web.StreamResponse,
    ctx: ApiContext,
    hub: Hub,
    scope: Scope,
    cursor: int,
    wakeup: Wakeup,
) -> None:
    keepalive = ctx.config.api.sse_keepalive_seconds
    now = anyio.current_time
    await response.prepare(request)
    await _send(response, b"retry: %d\n\n" % RETRY_MILLISECONDS)
    last_sent = now()
    read_at = now()  # the history (or what follows Last-Event-ID) first
    held = 0  # reads in a row that found a writer mid-transaction
    shown: float | None = None  # the progress last sent
    final = False  # the asset reached a state after which nothing renders
    while not (ctx.stopping or hub.closing or _client_gone(request)):
        if now() >= read_at:
            rows = await _read(ctx, scope, cursor)
            if rows is None:
                held += 1
                delay = min(HOLD_BACK_SECONDS * 2 ** (held - 1), 2.0) * (0.5 + random.random())
                read_at = now() + delay
            else:
                held = 0
                # A full batch: more history waits, read on at once.
                read_at = now() if len(rows) == BATCH else now() + REQUERY_SECONDS
            if rows:
                await _send(response, b"".join(frame(stage_event(scope, r)) for r in rows))
                cursor = rows[-1].id
                last_sent = now()
                final = final or any(
                    r.entity == Entity.ASSET.value and r.state in _NO_MORE_PROGRESS for r in rows
                )
            measured = None if rows is None or final else await _progress(ctx, scope)
            if measured is not None and measured != shown:
                event = ProgressEvent(asset_id=scope.asset_id, progress=measured)
                await _send(response, progress_frame(event))
                shown = measured
                last_sent = now()
        if now() - last_sent >= keepalive:
            await _send(response, b": keepalive\n\n")
            last_sent = now()
        timeout = min(read_at, last_sent + keepalive, now() + TICK_SECONDS) - now()
        if await wakeup.wait(max(timeout, 0.0)):
            read_at = now()
    with anyio.move_on_after(1.0):
        await response.write_eof()


async def _read(ctx: ApiContext, scope: Scope, cursor: int) -> list[StageRow] | None:
    """The events after ``cursor`` that are final now; None: look again shortly (a writer
    was mid-transaction); nothing when the database failed (logged; the timer retries)."""
    try:
        with map_db_errors("reading stage events"), anyio.fail_after(10):
            return await read_after(ctx.pool, scope, cursor, limit=BATCH)
    except DatabaseError as exc:
        log.warning("event_stream_read_failed", asset_id=str(scope.asset_id), error=str(exc))
        return []


async def _progress(ctx: ApiContext, scope: Scope) -> float | None:
    """The running render's progress now; None when unmeasured or unreadable (the next read
    retries), and at 100: the ENRICHED stage event says the end, in its order."""
    try:
        with map_db_errors("reading progress"), anyio.fail_after(10):
            measured = await progress_now(ctx.pool, scope.asset_id)
        return measured if measured is not None and measured < 100.0 else None
    except DatabaseError as exc:
        log.warning("event_stream_read_failed", asset_id=str(scope.asset_id), error=str(exc))
        return None


async def _send(response: web.StreamResponse, data: bytes) -> None:
    with anyio.fail_after(WRITE_TIMEOUT_SECONDS):
        await response.write(data)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def run_listener(
    ctx: ApiContext, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """The process's one LISTEN connection for stage events (``store/listening.py``),
    supervised: it reconnects with backoff and is down in ``/readyz`` while it cannot listen.
    Reports started once listening (or after the first failure: the API serves without it,
    streams then find their events on the timer)."""
    hub = hub_of(ctx)
    loop = Loop("stage_events_listen", conditions=ctx.conditions, event="stage_events_listen_lost")
    started = False

    def start() -> None:
        nonlocal started
        if not started:
            started = True
            task_status.started()

    def on_notify(_c: object, _pid: int, _channel: str, key: object) -> None:
        if isinstance(key, str):
            hub.notify(key)

    def on_listening() -> None:
        loop.ok()
        # Whatever committed while nobody listened: every stream looks now.
        hub.wake_all()
        start()

    async def session() -> None:
        try:
            await listening.listen(
                ctx.config.database,
                {NOTIFY_CHANNEL: on_notify},
                on_listening=on_listening,
                keepalive_seconds=LISTEN_CHECK_SECONDS,
            )
        except Exception:
            start()
            raise

    await supervise(loop, session)


async def close_streams(ctx: ApiContext) -> None:
    """End every open stream (the server is stopping) and wait, briefly, until they have."""
    hub = _HUBS.pop(id(ctx), None)
    if hub is not None:
        with anyio.move_on_after(CLOSE_WAIT_SECONDS):
            await hub.close()


def _paths() -> dict[str, Any]:
    last_event_id = {
        "name": "Last-Event-ID",
        "in": "header",
        "required": False,
        "description": "Resume after this event id (what EventSource sends on reconnecting); "
        "without it the whole history is sent first.",
        "schema": {"type": "string"},
    }
    # OpenAPI 3.1 reads the schema of an event stream as the schema of one event.
    stage = {
        "type": "object",
        "required": ["event", "data", "id"],
        "properties": {
            "event": {"const": "stage"},
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "retry": {"type": "integer"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": schema.ref(StageEvent),
            },
        },
    }
    progress = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"const": "progress"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": schema.ref(ProgressEvent),
            },
        },
    }
    event = {"oneOf": [stage, progress]}
    ok = {
        "description": "An endless text/event-stream: `retry:` first, then one `stage` event "
        "(`id:` the event id, `data:` a StageEvent as JSON) per status change of the asset, "
        "its provider output and that output's generation task, in id order; a "
        "`progress` event (`data:` a ProgressEvent, no `id:`) when the render's progress "
        "changes; a `: keepalive` comment line when idle. It ends when the server shuts down.",
        "content": {"text/event-stream": {"schema": event}},
    }
    return {
        "/v1/assets/{asset_id}/events": {
            "get": {
                "summary": "The asset's stage changes as Server-Sent Events",
                "operationId": "streamAssetEvents",
                "tags": ["assets"],
                "parameters": [schema.path_param("asset_id", "the asset id"), last_event_id],
                "responses": schema.responses({"200": ok}, 401, 404, 503),
            }
        }
    }


PATHS = _paths()
SCHEMAS: tuple[type, ...] = (StageEvent, ProgressEvent)
