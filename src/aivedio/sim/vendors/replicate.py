"""Replicate: ``GET /v1/predictions/{id}``; ``output`` a URL or a list; webhooks carry the
whole prediction, Standard Webhooks signed."""

from __future__ import annotations

import msgspec
from aiohttp import web

from aivedio.sim.provider import _iso_utc
from aivedio.sim.vendors.base import SimTask, VendorSim, standard_webhooks_headers

STATUS = {"running": "processing", "succeeded": "succeeded", "failed": "failed"}


class ReplicateSim(VendorSim):
    vendor = "replicate"
    create_path = "/v1/predictions"
    webhook_secret = "whsec_" + "c2ltdWxhdGVkLXJlcGxpY2F0ZS13ZWJob29rLXNlY3JldA=="

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/predictions/{task_id}", self._prediction, allow_head=False)

    def prediction(self, task: SimTask) -> dict[str, object]:
        doc: dict[str, object] = {
            "id": task.task_id,
            "status": STATUS[task.status],
            "created_at": _iso_utc(int(task.created_at)),
            "completed_at": _iso_utc(int(task.completed_at)) if task.completed_at else None,
            "output": None,
        }
        if task.status == "succeeded":
            urls = [self.file_url(task.task_id, i) for i in range(task.outputs)]
            doc["output"] = urls[0] if len(urls) == 1 else urls
        return doc

    async def _prediction(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.prediction(task))

    def callback(
        self, task_id: str, *, timestamp: int | None = None
    ) -> tuple[dict[str, str], bytes]:
        body = msgspec.json.encode(self.prediction(self.tasks[task_id]))
        return standard_webhooks_headers(self.webhook_secret, body, timestamp), body
