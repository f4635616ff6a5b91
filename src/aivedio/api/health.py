"""``/healthz`` (the event loop runs), ``/readyz`` (the database answers, the schema is
current, not draining, the event listener is not failing), ``/metrics`` (Prometheus text),
as the worker has them."""

from __future__ import annotations

from typing import Any

import anyio
from aiohttp import web

from aivedio.api.context import context
from aivedio.errors import DatabaseError
from aivedio.store import migrations
from aivedio.store.database import map_db_errors

READY_CHECK_TIMEOUT_SECONDS = 2.0

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    ctx = context(request)
    reasons: list[str] = ["draining"] if ctx.draining else []
    try:
        with anyio.fail_after(READY_CHECK_TIMEOUT_SECONDS), map_db_errors("readiness check"):
            async with ctx.pool.acquire() as conn:
                pending = await migrations.pending(conn)
        if pending:
            reasons.append("migrations pending: " + ", ".join(m.name for m in pending))
    except (DatabaseError, TimeoutError) as exc:
        reasons.append(f"database unreachable: {exc or 'timeout'}")
    reasons += ctx.conditions.reasons()
    if reasons:
        return web.json_response({"status": "not_ready", "reasons": reasons}, status=503)
    return web.json_response({"status": "ready"})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    ctx = context(request)
    ctx.metrics.draining.set(1 if ctx.draining else 0)
    await ctx.backlog.current()  # the backlog gauges: cached, read at most once per interval
    return web.Response(
        body=ctx.metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


_STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
PATHS: dict[str, Any] = {
    "/healthz": {
        "get": {
            "summary": "Liveness",
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": {
                    "description": "alive",
                    "content": {"application/json": {"schema": _STATUS}},
                }
            },
        }
    },
    "/readyz": {
        "get": {
            "summary": "Readiness",
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": {
                    "description": "ready",
                    "content": {"application/json": {"schema": _STATUS}},
                },
                "503": {
                    "description": "not ready (reasons listed)",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["status", "reasons"],
                                "properties": {
                                    "status": {"type": "string"},
                                    "reasons": {"type": "array", "items": {"type": "string"}},
                                },
                            }
                        }
                    },
                },
            },
        }
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus metrics",
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    },
}
