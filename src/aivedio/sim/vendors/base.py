"""A simulated vendor: the generic simulated provider's file server, plus one vendor's API.

Each vendor module (written from PROVIDERS.md, not from anyone's payloads) adds the routes
and JSON shapes of its task API, and builds its callbacks (signed or not). What they share:

* tasks that run until ``complete`` (or ``fail``), with one or more outputs each, served
  as signed ``/files/…`` URLs by the generic provider (with its :class:`Faults`);
* ``issue_expired``: task reads hand out already-expired signed URLs (a stored URL that
  outlived its lifetime); ``age`` moves a task's times into the past;
* ``throttle_task_reads``: the next N task API reads answer 429 with ``Retry-After``;
* ``redirect_task_reads``: task API reads answer 302 to the same path on that host (an API
  call must not follow it with our credentials);
* API credentials checked on every API call (401 otherwise) and, for vendors whose
  downloads need them, on downloads;
* every request recorded (host, path, headers), so tests can see where a credential went;
  ``requests["create"]`` counts generation requests, which adapters must never send.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from aivedio.providers import standard_webhooks
from aivedio.sim.provider import Faults, SimulatedProvider, _error


@dataclass
class SimTask:
    task_id: str
    outputs: int
    status: str = "running"  # running, succeeded, failed
    created_at: float = field(default_factory=time.time)
    completed_at: float | None = None


@dataclass(frozen=True)
class SeenRequest:
    method: str
    host: str
    path: str
    headers: dict[str, str]


class VendorSim(SimulatedProvider):
    """Subclasses set ``vendor`` and implement ``add_routes`` and ``task_doc``."""

    vendor = ""
    create_path = ""

    def __init__(self, *, api_key: str = "sim-api-key", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api_key = api_key
        self.tasks: dict[str, SimTask] = {}
        self.issue_expired = False
        self.throttle_task_reads = 0
        self.redirect_task_reads: str | None = None
        self.task_reads: list[tuple[float, str]] = []  # (monotonic time, task id)
        self.seen: list[SeenRequest] = []

    # -- state --------------------------------------------------------------------------------

    def add_task(
        self,
        task_id: str,
        bodies: list[bytes],
        *,
        faults: Faults = Faults(),  # noqa: B008  (frozen)
        done: bool = False,
    ) -> SimTask:
        for index, body in enumerate(bodies):
            self.add_output(task_id, index, body, faults=faults)
        task = SimTask(task_id, len(bodies))
        self.tasks[task_id] = task
        if done:
            self.complete(task_id)
        return task

    def complete(self, task_id: str) -> None:
        task = self.tasks[task_id]
        task.status, task.completed_at = "succeeded", time.time()

    def fail(self, task_id: str) -> None:
        task = self.tasks[task_id]
        task.status, task.completed_at = "failed", time.time()

    def age(self, task_id: str, seconds: float) -> None:
        task = self.tasks[task_id]
        task.created_at -= seconds
        if task.completed_at is not None:
            task.completed_at -= seconds

    def file_url(self, task_id: str, index: int) -> str:
        """A signed download URL (already expired while ``issue_expired``)."""
        return self.signed_url(task_id, index, -60 if self.issue_expired else None)

    def credential_seen_by(self, secret: str) -> set[str]:
        """The hosts that received ``secret`` in any header."""
        return {r.host for r in self.seen if any(secret in v for v in r.headers.values())}

    # -- server -------------------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get(r"/files/{task_id}/{index:\d+}", self._download, allow_head=False)
        app.router.add_get(
            r"/r/{hop:\d+}/files/{task_id}/{index:\d+}", self._redirect_hop, allow_head=False
        )
        if self.create_path:
            app.router.add_post(self.create_path, self._create)
        self.add_routes(app)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append(
            SeenRequest(request.method, request.host, request.path, dict(request.headers))
        )
        response: web.StreamResponse = await handler(request)
        return response

    async def _create(self, request: web.Request) -> web.StreamResponse:
        self.requests["create"] += 1
        return _error(400, "the simulator does not generate")

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    def task_read(self, request: web.Request, task_id: str) -> SimTask | web.Response:
        """The common half of a task read: credentials, throttling, the task."""
        self.requests["task"] += 1
        self.task_reads.append((time.monotonic(), task_id))
        if self.redirect_task_reads is not None:
            target = self._cross_host_origin(self.redirect_task_reads)
            if request.url.host != target.host:
                location = f"{str(target).rstrip('/')}{request.path_qs}"
                return web.Response(status=302, headers={"Location": location})
        if not self.authorized(request):
            return _error(401, "unauthorized")
        if self.throttle_task_reads > 0:
            self.throttle_task_reads -= 1
            return _error(429, "throttled", {"Retry-After": f"{self.retry_after_seconds:g}"})
        task = self.tasks.get(task_id)
        if task is None:
            return _error(404, "not_found")
        return task

    retry_after_seconds: float = 1.0

    async def serve_output(
        self, request: web.Request, task_id: str, index: int
    ) -> web.StreamResponse:
        """An output's bytes, through its faults, for vendors that serve them from an API
        route (Gemini files, GCS) rather than a signed URL."""
        self.requests["download"] += 1
        output = self._tasks.get(task_id, {}).get(index)
        if output is None:
            return _error(404, "not_found")
        faults = output.faults
        if faults.expired:
            return _error(403, "expired")
        if faults.gone:
            return _error(404, "gone")
        if faults.cross_host_redirect is not None:
            target = self._cross_host_origin(faults.cross_host_redirect)
            if request.url.host != target.host:
                signed = self.signed_url(task_id, index).split("/files/", 1)[1]
                return web.Response(
                    status=302, headers={"Location": f"{str(target).rstrip('/')}/files/{signed}"}
                )
        output.attempts += 1
        if output.attempts <= faults.throttle_requests:
            return _error(429, "throttled", {"Retry-After": f"{faults.retry_after_seconds:g}"})
        return await self._send_body(request, output)


def standard_webhooks_headers(secret: str, body: bytes, timestamp: int | None) -> dict[str, str]:
    """A Standard Webhooks delivery's headers under a ``whsec_`` secret (Replicate, Gemini)."""
    webhook_id = f"msg_{secrets.token_hex(8)}"
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    key = standard_webhooks.secret_key(secret)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": stamp,
        "webhook-signature": standard_webhooks.sign(key, webhook_id, stamp, body),
        "Content-Type": "application/json",
    }
