"""Kling: poll ``GET /v1/videos/{type}/{task_id}``, or a ``callback_url`` on each change.

API calls carry a short-lived JWT (HS256) issued by the account's access key and signed
with its secret key. Callbacks carry no signature: a hint, confirmed by reading the task.
Outputs are ``task_result.videos[].url``, cleared 30 days after the task was created: the
expiry counts from ``created_at`` (milliseconds), a refresh reads the task again and answers
OUTPUT_LOST after the 30 days. Whether downloads need auth is not documented: none is sent.
Cadence: not documented; we assume 5 s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Any, ClassVar

import msgspec

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError
from aivedio.providers.base import (
    CallbackHint,
    VendorAdapter,
    decode_object,
    parse_time,
    path_segment,
    text,
)
from aivedio.providers.seam import ProviderOutput, ProviderTask

TOKEN_SECONDS = 1800


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt_token(access_key: str, secret_key: str, now: float | None = None) -> str:
    issued = int(time.time() if now is None else now)
    header = _b64(msgspec.json.encode({"alg": "HS256", "typ": "JWT"}))
    claims = _b64(
        msgspec.json.encode({"iss": access_key, "exp": issued + TOKEN_SECONDS, "nbf": issued - 5})
    )
    signing_input = f"{header}.{claims}".encode()
    signature = hmac.new(secret_key.encode(), signing_input, hashlib.sha256).digest()
    return f"{header}.{claims}.{_b64(signature)}"


class KlingAdapter(VendorAdapter):
    kind = "kling"
    default_api_base_url = "https://api.klingai.com"
    default_poll_interval_seconds = 5.0
    default_poll_jitter_seconds = 1.0
    lifetime_seconds = 30 * 86400.0
    callback_scheme = "unsigned"
    required_secrets = ("access_key", "secret_key")
    statuses: ClassVar[dict[str, str]] = {
        "submitted": "RUNNING",
        "processing": "RUNNING",
        "succeed": "SUCCEEDED",
        "failed": "FAILED",
    }

    def api_headers(self) -> dict[str, str]:
        token = jwt_token(self.config.access_key, self.config.secret_key)
        return {"Authorization": f"Bearer {token}"}

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call(
            "GET", self.api_url(f"/v1/videos/{self.config.task_type}/{path_segment(task_id)}")
        )
        data = doc.get("data", doc)
        if not isinstance(data, dict):
            raise InvalidResponseError("kling task: data is not an object")
        status = self.status(data.get("task_status"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            expires = self.expiry(parse_time(data.get("created_at"), "created_at"))
            outputs = [
                ProviderOutput(index=i, url=text(v, "url"), expires_at=expires)
                for i, v in enumerate(_videos(data))
            ]
        return ProviderTask(provider_task_id=text(data, "task_id"), status=status, outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        status = cls.statuses.get(str(doc.get("task_status")), "RUNNING")
        return CallbackHint(task_id=text(doc, "task_id"), status=status)


def _videos(data: dict[str, Any]) -> list[dict[str, Any]]:
    result = data.get("task_result")
    videos = result.get("videos") if isinstance(result, dict) else None
    if not isinstance(videos, list) or not videos or not all(isinstance(v, dict) for v in videos):
        raise InvalidResponseError("kling task: task_result.videos is not a list of objects")
    return videos
