"""Runway's task API: ``GET /v1/tasks/{id}``, signed output URLs, no webhooks."""

from __future__ import annotations

from aiohttp import web

from aivedio.sim.provider import _iso_utc
from aivedio.sim.vendors.base import VendorSim

STATUS = {"running": "RUNNING", "succeeded": "SUCCEEDED", "failed": "FAILED"}


class RunwaySim(VendorSim):
    vendor = "runway"
    create_path = "/v1/image_to_video"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/tasks/{task_id}", self._task, allow_head=False)

    async def _task(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        if request.headers.get("X-Runway-Version") is None:
            return web.json_response({"error": "X-Runway-Version is required"}, status=400)
        doc: dict[str, object] = {
            "id": task.task_id,
            "status": STATUS[task.status],
            "createdAt": _iso_utc(int(task.created_at)),
        }
        if task.status == "succeeded":
            doc["output"] = [self.file_url(task.task_id, i) for i in range(task.outputs)]
        if task.status == "failed":
            doc["failure"] = "simulated failure"
        return web.json_response(doc)
