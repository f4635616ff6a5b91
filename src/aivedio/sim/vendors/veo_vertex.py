"""Veo on Vertex AI: ``POST …/models/{m}:fetchPredictOperation``; videos in the caller's
bucket (``gcsUris``), downloaded through the GCS JSON API with a bearer access token."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aivedio.sim.provider import _error
from aivedio.sim.vendors.base import SimTask, VendorSim

MODEL_PATH = "projects/sim-project/locations/us-central1/publishers/google/models/veo-3.0"
BUCKET = "sim-bucket"


class VeoVertexSim(VendorSim):
    vendor = "veo_vertex"
    create_path = f"/v1/{MODEL_PATH}:predictLongRunning"

    @staticmethod
    def operation_name(task_id: str) -> str:
        return f"{MODEL_PATH}/operations/{task_id}"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(r"/v1/{model:.+}:fetchPredictOperation", self._fetch_operation)
        app.router.add_get(
            r"/download/storage/v1/b/{bucket}/o/{name:.+}", self._object, allow_head=False
        )

    def operation(self, task: SimTask) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.operation_name(task.task_id),
            "done": task.status != "running",
        }
        if task.status == "failed":
            doc["error"] = {"code": 3, "message": "simulated failure"}
        elif task.status == "succeeded":
            uris = [f"gs://{BUCKET}/{task.task_id}/sample_{i}.mp4" for i in range(task.outputs)]
            doc["response"] = {"gcsUris": uris}
        return doc

    async def _fetch_operation(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = str(body.get("operationName", ""))
        model, _, task_id = name.partition("/operations/")
        if model != MODEL_PATH or request.match_info["model"] != MODEL_PATH:
            self.requests["task"] += 1
            return _error(404, "not_found")
        task = self.task_read(request, task_id)
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.operation(task))

    async def _object(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            self.requests["download_refused"] += 1
            return _error(401, "unauthorized")
        if request.match_info["bucket"] != BUCKET or request.query.get("alt") != "media":
            return _error(404, "not_found")
        task_id, _, leaf = request.match_info["name"].partition("/")
        index = leaf.removeprefix("sample_").removesuffix(".mp4")
        if not index.isdigit():
            return _error(404, "not_found")
        return await self.serve_output(request, task_id, int(index))
