"""Seedance on BytePlus ModelArk: ``GET /api/v3/contents/generations/tasks/{id}``; unsigned
callbacks carrying the task; video URLs cleared 24 hours after the task."""

from __future__ import annotations

import msgspec
from aiohttp import web

from aivedio.sim.vendors.base import SimTask, VendorSim

STATUS = {"running": "running", "succeeded": "succeeded", "failed": "failed"}


class SeedanceSim(VendorSim):
    vendor = "seedance"
    create_path = "/api/v3/contents/generations/tasks"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(
            "/api/v3/contents/generations/tasks/{task_id}", self._task, allow_head=False
        )

    def task_doc(self, task: SimTask) -> dict[str, object]:
        doc: dict[str, object] = {
            "id": task.task_id,
            "model": "seedance-1-0-pro",
            "status": STATUS[task.status],
            "created_at": int(task.created_at),
            "updated_at": int(task.completed_at or task.created_at),
        }
        if task.status == "succeeded":
            doc["content"] = {"video_url": self.file_url(task.task_id, 0)}
        return doc

    async def _task(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.task_doc(task))

    def callback(self, task_id: str, **_: object) -> tuple[dict[str, str], bytes]:
        body = msgspec.json.encode(self.task_doc(self.tasks[task_id]))
        return {"Content-Type": "application/json"}, body
