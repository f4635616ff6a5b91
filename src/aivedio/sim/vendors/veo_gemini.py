"""Veo on the Gemini API: ``GET /v1beta/models/{model}/operations/{op}``; samples as file
URLs that need the API key (``x-goog-api-key``); files gone after two days; webhooks
(``video.generated`` with ``output_file_uri``) signed to Standard Webhooks, by the project's
static webhook secret or a request's dynamic one."""

from __future__ import annotations

import secrets
import time

import msgspec
from aiohttp import web

from aivedio.sim.provider import _error
from aivedio.sim.vendors.base import SimTask, VendorSim, standard_webhooks_headers

MODEL = "veo-3.0-generate-001"
LIFETIME_SECONDS = 2 * 86400


class VeoGeminiSim(VendorSim):
    vendor = "veo_gemini"
    create_path = f"/v1beta/models/{MODEL}:predictLongRunning"
    webhook_secret = "whsec_" + "c2ltdWxhdGVkLWdlbWluaS1zdGF0aWMtd2ViaG9vaw=="
    dynamic_webhook_secret = "whsec_" + "c2ltdWxhdGVkLWdlbWluaS1keW5hbWljLXdlYmhvb2s="

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
                        "uri": self.file_uri(task.task_id, i),
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

    def file_uri(self, task_id: str, index: int) -> str:
        return f"{self.base_url}/v1beta/files/{task_id}-{index}:download?alt=media"

    def callback(
        self, task_id: str, *, timestamp: int | None = None, dynamic: bool = False
    ) -> tuple[dict[str, str], bytes]:
        """One ``video.generated`` delivery per sample, signed by the static webhook's
        secret (or, ``dynamic``, a per-request one); the first sample's here."""
        body = msgspec.json.encode(
            {
                "id": f"evt_{secrets.token_hex(8)}",
                "type": "video.generated",
                "create_time": _iso_now(),
                "data": {
                    "name": self.operation_name(task_id),
                    "output_file_uri": self.file_uri(task_id, 0),
                },
            }
        )
        secret = self.dynamic_webhook_secret if dynamic else self.webhook_secret
        return standard_webhooks_headers(secret, body, timestamp), body


def _iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
