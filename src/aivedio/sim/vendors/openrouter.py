"""OpenRouter video generation: ``GET /api/v1/videos/{id}``; callbacks ``{"type":
"video.generation.<status>", "data": <job>}`` signed in ``X-OpenRouter-Signature``
(``t=<ts>,v1=<hex HMAC-SHA256 of "<ts>,<body>">``, one ``v1`` per signing secret)."""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from aivedio.providers import openrouter_webhooks
from aivedio.sim.vendors.base import SimTask, VendorSim

STATUS = {"running": "in_progress", "succeeded": "completed", "failed": "failed"}


class OpenRouterSim(VendorSim):
    vendor = "openrouter"
    create_path = "/api/v1/videos"
    webhook_secret = "sim-openrouter-callback-secret"  # noqa: S105 - a simulator's own
    # While a secret is rotated the sender signs with both (``rotate_secret``).
    next_webhook_secret = ""

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/videos/{task_id}", self._job, allow_head=False)

    def job(self, task: SimTask, status: str | None = None) -> dict[str, object]:
        doc: dict[str, object] = {
            "id": task.task_id,
            "status": status or STATUS[task.status],
            "created_at": int(task.created_at),
        }
        if doc["status"] == "completed":
            doc["videos"] = [{"url": self.file_url(task.task_id, i)} for i in range(task.outputs)]
        return doc

    async def _job(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.job(task))

    def callback(
        self, task_id: str, *, timestamp: int | None = None, status: str | None = None
    ) -> tuple[dict[str, str], bytes]:
        job = self.job(self.tasks[task_id], status)
        body = msgspec.json.encode({"type": f"video.generation.{job['status']}", "data": job})
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        keys = [s.encode() for s in (self.webhook_secret, self.next_webhook_secret) if s]
        return {
            openrouter_webhooks.HEADER: openrouter_webhooks.signature_header(keys, stamp, body),
            "Content-Type": "application/json",
        }, body
