"""Luma Dream Machine: ``GET /dream-machine/v1/generations/{id}``; unsigned callbacks
carrying the generation."""

from __future__ import annotations

import msgspec
from aiohttp import web

from aivedio.sim.provider import _iso_utc
from aivedio.sim.vendors.base import SimTask, VendorSim

STATE = {"running": "dreaming", "succeeded": "completed", "failed": "failed"}


class LumaSim(VendorSim):
    vendor = "luma"
    create_path = "/dream-machine/v1/generations"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(
            "/dream-machine/v1/generations/{task_id}", self._generation, allow_head=False
        )

    def generation(self, task: SimTask) -> dict[str, object]:
        assets = {"video": self.file_url(task.task_id, 0)} if task.status == "succeeded" else None
        return {
            "id": task.task_id,
            "state": STATE[task.status],
            "created_at": _iso_utc(int(task.created_at)),
            "assets": assets,
            "failure_reason": "simulated" if task.status == "failed" else None,
        }

    async def _generation(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.generation(task))

    def callback(self, task_id: str, **_: object) -> tuple[dict[str, str], bytes]:
        body = msgspec.json.encode(self.generation(self.tasks[task_id]))
        return {"Content-Type": "application/json"}, body
