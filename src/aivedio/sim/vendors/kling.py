"""Kling: ``GET /v1/videos/{type}/{task_id}`` with an HS256 JWT; unsigned callbacks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import msgspec
from aiohttp import web

from aivedio.sim.provider import _error
from aivedio.sim.vendors.base import SimTask, VendorSim

STATUS = {"running": "processing", "succeeded": "succeed", "failed": "failed"}
ACCESS_KEY = "sim-access-key"


def _unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class KlingSim(VendorSim):
    vendor = "kling"
    create_path = "/v1/videos/text2video"

    def authorized(self, request: web.Request) -> bool:
        """A JWT issued by ACCESS_KEY, signed with the secret key (``api_key`` here), live."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        parts = token.split(".")
        if scheme != "Bearer" or len(parts) != 3:
            return False
        expected = hmac.new(
            self.api_key.encode(), f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256
        ).digest()
        if not hmac.compare_digest(expected, _unb64(parts[2])):
            return False
        claims = msgspec.json.decode(_unb64(parts[1]))
        now = time.time()
        return bool(claims.get("iss") == ACCESS_KEY and claims["nbf"] <= now < claims["exp"])

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/videos/{kind}/{task_id}", self._task, allow_head=False)

    def task_doc(self, task: SimTask) -> dict[str, object]:
        result = None
        if task.status == "succeeded":
            videos = [
                {
                    "id": f"{task.task_id}-{i}",
                    "url": self.file_url(task.task_id, i),
                    "duration": "5",
                }
                for i in range(task.outputs)
            ]
            result = {"videos": videos}
        return {
            "task_id": task.task_id,
            "task_status": STATUS[task.status],
            "created_at": int(task.created_at * 1000),
            "updated_at": int((task.completed_at or task.created_at) * 1000),
            "task_result": result,
        }

    async def _task(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["kind"] not in ("text2video", "image2video"):
            return _error(404, "not_found")
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response({"code": 0, "message": "SUCCEED", "data": self.task_doc(task)})

    def callback(self, task_id: str, **_: object) -> tuple[dict[str, str], bytes]:
        body = msgspec.json.encode(self.task_doc(self.tasks[task_id]))
        return {"Content-Type": "application/json"}, body
