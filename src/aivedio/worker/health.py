"""The worker's HTTP endpoint for autoscalers and orchestrators.

``/healthz``: the process runs its event loop (liveness). ``/readyz``: the database answers,
no migration is pending, the worker is not draining, and none of its supervised loops
(LISTEN, the claimers, the heartbeat…: ``supervision.py``) is failing (readiness: 503 with
the reasons otherwise, "claim:fetch cannot work since …" for a loop). ``/metrics``:
Prometheus text.
"""

from __future__ import annotations

from typing import Protocol

import anyio
from aiohttp import web
from anyio.abc import TaskStatus

from aivedio.errors import DatabaseError
from aivedio.http_server import make_runner
from aivedio.logs import get_logger
from aivedio.metrics import WorkerMetrics
from aivedio.store import migrations
from aivedio.store.database import Pool, map_db_errors
from aivedio.supervision import Conditions

READY_CHECK_TIMEOUT_SECONDS = 2.0


class ReadinessSource(Protocol):
    """What the endpoint reads from the process it reports on (``worker.daemon.Worker``
    is one); the endpoint only reads it, never changes it."""

    @property
    def owner(self) -> str: ...

    @property
    def draining(self) -> bool: ...

    @property
    def pool(self) -> Pool: ...

    @property
    def conditions(self) -> Conditions: ...

    @property
    def metrics(self) -> WorkerMetrics: ...


async def readiness(worker: ReadinessSource) -> list[str]:
    """Reasons the worker is not ready; empty when it is."""
    reasons: list[str] = []
    if worker.draining:
        reasons.append("draining")
    try:
        with anyio.fail_after(READY_CHECK_TIMEOUT_SECONDS), map_db_errors("readiness check"):
            async with worker.pool.acquire() as conn:
                pending = await migrations.pending(conn)
        if pending:
            reasons.append("migrations pending: " + ", ".join(m.name for m in pending))
    except (DatabaseError, TimeoutError) as exc:
        reasons.append(f"database unreachable: {exc or 'timeout'}")
    return reasons + worker.conditions.reasons()


def make_app(worker: ReadinessSource) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "owner": worker.owner})

    async def readyz(_request: web.Request) -> web.Response:
        reasons = await readiness(worker)
        if reasons:
            return web.json_response({"status": "not_ready", "reasons": reasons}, status=503)
        return web.json_response({"status": "ready"})

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            body=worker.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve_health(
    worker: ReadinessSource,
    host: str,
    port: int,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    runner = make_runner(make_app(worker))
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        get_logger("aivedio.worker.health").info("http_listening", host=host, port=bound)
        task_status.started(bound)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await runner.cleanup()
