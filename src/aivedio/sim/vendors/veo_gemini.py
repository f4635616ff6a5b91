"""Veo on the Gemini API: ``GET /v1beta/models/{model}/operations/{op}``; samples as file
URLs that need the API key (``x-goog-api-key``); files gone after two days."""

from __future__ import annotations

import time

from aiohttp import web

from aivedio.sim.provider import _error
from aivedio.sim.vendors.base import SimTask, VendorSim

MODEL = "veo-3.0-generate-001"
LIFETIME_SECONDS = 2 * 86400


class VeoGeminiSim(VendorSim):
    vendor = "veo_gemini"
    create_path = f"/v1beta/models/{MODEL}:predictLongRunning"

    @staticmethod
    def operation_name(task_id: str) -> str:
        return f"models/{MODEL}/operations/{task_id}"

    def authorized(self, request: web.Request) -> bool:
        return request.headers.get("x-goog-api-key") == self.api_key

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(
            "/v1beta/models/{model}/operations/{task_id}", self._operation, allow_head=False
        )
        app.router.add_get(
            r"/v1beta/files/{task_id:[^/:]+}-{index:\d+}:download", self._file, allow_head=False
        )

    def operation(self, task: SimTask) -> dict[str, object]:
        doc: dict[str, object] = {
            "name": self.operation_name(task.task_id),
            "done": task.status != "running",
        }
        if task.status == "failed":
            doc["error"] = {"code": 3, "message": "simulated failure"}
        elif task.status == "succeeded":
            samples = [
                {
                    "video": {
                        "uri": f"{self.base_url}/v1beta/files/{task.task_id}-{i}:download"
                        "?alt=media",
                        "mimeType": "video/mp4",
                    }
                }
                for i in range(task.outputs)
            ]
            doc["response"] = {"generateVideoResponse": {"generatedSamples": samples}}
        return doc

    async def _operation(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.operation(task))

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            self.requests["download_refused"] += 1
            return _error(403, "permission_denied")
        task = self.tasks.get(request.match_info["task_id"])
        if task is None or task.completed_at is None:
            return _error(404, "not_found")
        if task.completed_at + LIFETIME_SECONDS < time.time():
            return _error(404, "not_found")  # deleted after two days
        return await self.serve_output(request, task.task_id, int(request.match_info["index"]))
