"""MiniMax: ``GET /v1/query/video_generation?task_id=`` then ``GET /v1/files/retrieve
?file_id=`` for the download URL; callbacks after a challenge echo, unsigned."""

from __future__ import annotations

import msgspec
from aiohttp import web

from aivedio.sim.provider import _error
from aivedio.sim.vendors.base import SimTask, VendorSim

STATUS = {"running": "Processing", "succeeded": "Success", "failed": "Fail"}
OK = {"status_code": 0, "status_msg": "success"}


class MiniMaxSim(VendorSim):
    vendor = "minimax"
    create_path = "/v1/video_generation"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/query/video_generation", self._query, allow_head=False)
        app.router.add_get("/v1/files/retrieve", self._retrieve, allow_head=False)

    def query_doc(self, task: SimTask) -> dict[str, object]:
        file_id = f"file-{task.task_id}" if task.status == "succeeded" else ""
        return {
            "task_id": task.task_id,
            "status": STATUS[task.status],
            "file_id": file_id,
            "base_resp": OK,
        }

    async def _query(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.query.get("task_id", ""))
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.query_doc(task))

    async def _retrieve(self, request: web.Request) -> web.StreamResponse:
        self.requests["retrieve"] += 1
        if not self.authorized(request):
            return _error(401, "unauthorized")
        task = self.tasks.get(request.query.get("file_id", "").removeprefix("file-"))
        if task is None or task.status != "succeeded":
            return _error(404, "not_found")
        file = {
            "file_id": f"file-{task.task_id}",
            "bytes": self._tasks[task.task_id][0].size,
            "created_at": int(task.created_at),
            "filename": f"{task.task_id}.mp4",
            "purpose": "video_generation",
            "download_url": self.file_url(task.task_id, 0),
        }
        return web.json_response({"file": file, "base_resp": OK})

    def callback(self, task_id: str, **_: object) -> tuple[dict[str, str], bytes]:
        task = self.tasks[task_id]
        doc = {
            "task_id": task_id,
            "status": STATUS[task.status].lower(),
            "file_id": f"file-{task_id}",
            "base_resp": OK,
        }
        return {"Content-Type": "application/json"}, msgspec.json.encode(doc)
