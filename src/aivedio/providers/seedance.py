"""ByteDance Seedance on BytePlus ModelArk: poll the content-generation task, or a
``callback_url``.

Third-party sources (not BytePlus's own documentation; design for them, assume no more):
a ``callback_url`` is accepted, and the video URLs are cleared 24 hours after the task.
Callbacks carry no documented signature, so one is a hint: the task is read with our key
before anything is recorded, and a forged body's URL never reaches the database.

Assumed and kept here alone: the task is ``GET /api/v3/contents/generations/tasks/{id}``
with the bearer key, answering ``{"id", "status", "content": {"video_url"}, "created_at"}``
(Unix seconds), statuses queued, running, succeeded, failed, cancelled; a callback posts
the same document. The 24 hours are counted from ``created_at`` (the earliest reading of
"after the task"; our first read when absent), and the URL is never re-issued: a refresh
reads the task again until then, and answers OUTPUT_LOST after. One output per task.
Cadence: not documented; we assume 5 s.
"""

from __future__ import annotations

from typing import ClassVar

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


class SeedanceAdapter(VendorAdapter):
    kind = "seedance"
    default_api_base_url = "https://ark.ap-southeast.bytepluses.com"
    default_poll_interval_seconds = 5.0
    default_poll_jitter_seconds = 1.0
    lifetime_seconds = 24 * 3600.0
    refreshable = False
    callback_scheme = "unsigned"
    statuses: ClassVar[dict[str, str]] = {
        "queued": "RUNNING",
        "running": "RUNNING",
        "succeeded": "SUCCEEDED",
        "failed": "FAILED",
        "cancelled": "CANCELLED",
    }

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call(
            "GET", self.api_url(f"/api/v3/contents/generations/tasks/{path_segment(task_id)}")
        )
        status = self.status(doc.get("status"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            content = doc.get("content")
            if not isinstance(content, dict):
                raise InvalidResponseError("seedance task: content is not an object")
            expires = self.expiry(parse_time(doc.get("created_at"), "created_at"))
            outputs = [ProviderOutput(index=0, url=text(content, "video_url"), expires_at=expires)]
        return ProviderTask(provider_task_id=text(doc, "id"), status=status, outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        # Unsigned: the task id and a status, never the body's URL (outputs None).
        return CallbackHint(
            task_id=text(doc, "id"), status=cls.statuses.get(str(doc.get("status")), "RUNNING")
        )
