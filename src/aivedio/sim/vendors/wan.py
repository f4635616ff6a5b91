"""Wan on Model Studio (DashScope): ``GET /api/v1/tasks/{task_id}``; ``task_status``
UNKNOWN for a task older than 24 hours (or never issued); no callbacks."""

from __future__ import annotations

import time

from aiohttp import web

from aivedio.sim.vendors.base import SimTask, VendorSim

STATUS = {"running": "RUNNING", "succeeded": "SUCCEEDED", "failed": "FAILED"}
LIFETIME_SECONDS = 24 * 3600


def _local(unix: float) -> str:
    # Model Studio's times carry no zone (the adapter does not read them).
    return time.strftime("%Y-%m-%d %H:%M:%S.000", time.gmtime(unix))


class WanSim(VendorSim):
    vendor = "wan"
    create_path = "/api/v1/services/aigc/video-generation/video-synthesis"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/tasks/{task_id}", self._task, allow_head=False)

    def output_doc(self, task: SimTask | None, task_id: str) -> dict[str, object]:
        if task is None or task.created_at + LIFETIME_SECONDS < time.time():
            return {"task_id": task_id, "task_status": "UNKNOWN"}
        doc: dict[str, object] = {
            "task_id": task.task_id,
            "task_status": STATUS[task.status],
            "submit_time": _local(task.created_at),
        }
        if task.completed_at is not None:
            doc["end_time"] = _local(task.completed_at)
        if task.status == "succeeded":
            doc["video_url"] = self.file_url(task.task_id, 0)
        return doc

    async def _task(self, request: web.Request) -> web.StreamResponse:
        task_id = request.match_info["task_id"]
        task = self.task_read(request, task_id)
        if isinstance(task, web.Response):
            if task.status != 404:
                return task
            # Model Studio answers 200 with UNKNOWN for a task it does not know.
            return web.json_response({"request_id": "r", "output": self.output_doc(None, task_id)})
        return web.json_response({"request_id": "r", "output": self.output_doc(task, task_id)})
