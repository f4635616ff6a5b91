"""fal.ai's queue: status 202 while IN_QUEUE / IN_PROGRESS, 200 COMPLETED, the result's
File objects; webhooks ED25519-signed, with the JWKS served at ``/.well-known/jwks.json``."""

from __future__ import annotations

import base64
import secrets
import time

import msgspec
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from aivedio.providers import fal_webhooks
from aivedio.sim.provider import CONTENT_TYPE
from aivedio.sim.vendors.base import SimTask, VendorSim

APP_ID = "fal-ai/pika"
USER_ID = "sim-user"


class FalSim(VendorSim):
    vendor = "fal"
    create_path = f"/{APP_ID}"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.signing_key_ed25519 = Ed25519PrivateKey.generate()
        self.retired_keys: list[Ed25519PrivateKey] = []

    def rotate_key(self) -> None:
        """Sign with a new key from now on; the JWKS publishes it beside the old one."""
        self.retired_keys.append(self.signing_key_ed25519)
        self.signing_key_ed25519 = Ed25519PrivateKey.generate()

    def authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Key {self.api_key}"

    def jwks(self) -> dict[str, object]:
        keys = []
        for n, key in enumerate([self.signing_key_ed25519, *reversed(self.retired_keys)]):
            raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
            keys.append({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": f"sim-{n}"})
        return {"keys": keys}

    def add_routes(self, app: web.Application) -> None:
        base = f"/{APP_ID}/requests/{{task_id}}"
        app.router.add_get(base + "/status", self._status, allow_head=False)
        app.router.add_get(base, self._result, allow_head=False)
        app.router.add_get("/.well-known/jwks.json", self._jwks, allow_head=False)

    async def _jwks(self, request: web.Request) -> web.StreamResponse:
        self.requests["jwks"] += 1
        return web.json_response(self.jwks())

    async def _status(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        if task.status == "running":
            return web.json_response({"status": "IN_PROGRESS"}, status=202)
        return web.json_response({"status": "COMPLETED"})

    def result(self, task: SimTask) -> dict[str, object]:
        files = [
            {
                "url": self.file_url(task.task_id, i),
                "content_type": CONTENT_TYPE,
                "file_name": f"{task.task_id}-{i}.mp4",
                "file_size": self._tasks[task.task_id][i].size,
            }
            for i in range(task.outputs)
        ]
        return {"video": files[0]} if len(files) == 1 else {"videos": files}

    async def _result(self, request: web.Request) -> web.StreamResponse:
        task = self.task_read(request, request.match_info["task_id"])
        if isinstance(task, web.Response):
            return task
        return web.json_response(self.result(task))

    def callback(
        self, task_id: str, *, timestamp: int | None = None
    ) -> tuple[dict[str, str], bytes]:
        task = self.tasks[task_id]
        doc: dict[str, object] = {
            "request_id": task_id,
            "gateway_request_id": task_id,
            "status": "OK" if task.status == "succeeded" else "ERROR",
            "payload": self.result(task) if task.status == "succeeded" else None,
        }
        body = msgspec.json.encode(doc)
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        message = fal_webhooks.message(task_id, USER_ID, stamp, body)
        signature = self.signing_key_ed25519.sign(message).hex()
        headers = {
            "X-Fal-Webhook-Request-Id": task_id,
            "X-Fal-Webhook-User-Id": USER_ID,
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": signature,
            "Content-Type": "application/json",
        }
        return headers, body

    def foreign_callback(self, request_id: str, video_url: str) -> tuple[dict[str, str], bytes]:
        """A webhook for another fal customer's request (one this account never made), with a
        result of that customer's choosing, signed by fal's key all the same."""
        doc = {"request_id": request_id, "status": "OK", "payload": {"video": {"url": video_url}}}
        body = msgspec.json.encode(doc)
        stamp = str(int(time.time()))
        user = "another-fal-customer"
        signature = self.signing_key_ed25519.sign(
            fal_webhooks.message(request_id, user, stamp, body)
        ).hex()
        headers = {
            "X-Fal-Webhook-Request-Id": request_id,
            "X-Fal-Webhook-User-Id": user,
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": signature,
            "Content-Type": "application/json",
        }
        return headers, body

    def forged_callback(self, task_id: str) -> tuple[dict[str, str], bytes]:
        """Signed by a key that is not in the JWKS."""
        headers, body = self.callback(task_id)
        other = Ed25519PrivateKey.generate()
        message = fal_webhooks.message(task_id, USER_ID, headers["X-Fal-Webhook-Timestamp"], body)
        headers["X-Fal-Webhook-Signature"] = other.sign(message).hex()
        headers["X-Fal-Webhook-Request-Id"] = task_id + secrets.token_hex(2)
        return headers, body
