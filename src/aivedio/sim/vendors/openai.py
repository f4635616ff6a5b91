"""OpenAI video: ``GET /v1/videos/{id}``, bytes from ``/content`` with the bearer key until
``expires_at``, Standard Webhooks ``video.completed`` / ``video.failed``."""

from __future__ import annotations

import secrets
import time

import msgspec
from aiohttp import web

from aivedio.providers import standard_webhooks
from aivedio.sim.provider import _error
from aivedio.sim.vendors.base import SimTask, VendorSim

STATUS = {"running": "in_progress", "succeeded": "completed", "failed": "failed"}
LIFETIME_SECONDS = 3600


class OpenAISim(VendorSim):
    vendor = "openai"
    create_path = "/v1/videos"
    webhook_secret = "whsec_" + "c2ltdWxhdGVkLW9wZW5haS13ZWJob29rLXNlY3JldA=="

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/videos/{task_id}", self._video, allow_head=False)
        app.router.add_get("/v1/videos/{task_id}/content", self._content, allow_head=False)

    def expires_at(self, task: SimTask) -> int | None:
        return int(task.completed_at + LIFETIME_SECONDS) if task.completed_at else None

    def video_doc(self, task: SimTask) -> dict[str, object]:
        return {
            "id": task.task_id,
            "object": "video",
            "status": STATUS[task.status],
            "created_at": int(task.created_at),
            "completed_at": int(task.completed_at) if task.completed_at else None,
            "expires_at": self.expires_at(task),
        }

    async def _video(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.video_doc(task))

    async def _content(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            self.requests["download_refused"] += 1
            return _error(401, "unauthorized")
        task = self.tasks.get(request.match_info["task_id"])
        expires = self.expires_at(task) if task else None
        if task is None or task.status != "succeeded" or expires is None:
            return _error(404, "not_found")
        if expires < time.time():
            return _error(404, "expired")
        return await self.serve_output(request, task.task_id, 0)

    def callback(
        self, task_id: str, *, timestamp: int | None = None
    ) -> tuple[dict[str, str], bytes]:
        task = self.tasks[task_id]
        kind = "video.completed" if task.status == "succeeded" else "video.failed"
        body = msgspec.json.encode(
            {
                "id": f"evt_{secrets.token_hex(8)}",
                "object": "event",
                "created_at": int(time.time()),
                "type": kind,
                "data": {"id": task_id},
            }
        )
        return standard_webhooks_headers(self.webhook_secret, body, timestamp), body


def standard_webhooks_headers(secret: str, body: bytes, timestamp: int | None) -> dict[str, str]:
    webhook_id = f"msg_{secrets.token_hex(8)}"
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    key = standard_webhooks.secret_key(secret)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": stamp,
        "webhook-signature": standard_webhooks.sign(key, webhook_id, stamp, body),
        "Content-Type": "application/json",
    }
