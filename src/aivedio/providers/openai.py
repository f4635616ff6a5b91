"""OpenAI video (``/v1/videos``): shut down on 2026-09-24; kept for the records it made.

OpenAI deprecated the Videos API and its sora-2 models on 2026-03-24 and shut them down on
2026-09-24, naming no replacement. From that day the adapter registers nothing new (a
watched task, a webhook's task, an ingested output: ``check_open`` refuses them with
``provider_shut_down``), a task still running can never finish (``get_task`` answers FAILED
without asking), and a stored content URL cannot be refreshed (OUTPUT_LOST). What follows
describes the API as it was, for outputs recorded before the shutdown.

Poll ``GET /v1/videos/{id}`` or take project webhooks.

There is no output URL: the bytes come from ``GET /v1/videos/{id}/content?variant=video``
with the account's bearer key, until the video's ``expires_at``; the content endpoint can be
asked again until then (that is the refresh). The key goes to the API origin only.

Webhooks are Standard Webhooks (``video.completed`` / ``video.failed``) naming the video
only, so a verified webhook still reads the video for its ``expires_at`` before recording.
The polling cadence is not documented: we assume 10 s.
"""

from __future__ import annotations

from datetime import date
from typing import ClassVar

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError
from aivedio.providers.base import (
    CallbackHint,
    VendorAdapter,
    decode_object,
    origin,
    parse_time,
    path_segment,
    text,
)
from aivedio.providers.seam import ProviderOutput, ProviderTask

EVENT_STATUS = {"video.completed": "SUCCEEDED", "video.failed": "FAILED"}


class OpenAIAdapter(VendorAdapter):
    kind = "openai"
    default_api_base_url = "https://api.openai.com"
    default_poll_interval_seconds = 10.0
    default_poll_jitter_seconds = 2.0
    refreshable = True
    shut_down_on = date(2026, 9, 24)
    display_name = "OpenAI Videos"
    callback_scheme = "standard_webhooks"
    callback_signed_by_account = True
    statuses: ClassVar[dict[str, str]] = {
        "queued": "RUNNING",
        "in_progress": "RUNNING",
        "completed": "SUCCEEDED",
        "failed": "FAILED",
    }

    def content_url(self, video_id: str) -> str:
        return self.api_url(f"/v1/videos/{path_segment(video_id)}/content", variant="video")

    async def get_task(self, task_id: str) -> ProviderTask:
        if self.shut_down():
            # Nothing to ask: a generation unfinished at the shutdown never finishes.
            return ProviderTask(provider_task_id=task_id, status="FAILED")
        doc = await self.call("GET", self.api_url(f"/v1/videos/{path_segment(task_id)}"))
        video_id = text(doc, "id")
        status = self.status(doc.get("status"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            expires = parse_time(doc.get("expires_at"), "expires_at") or self.expiry()
            outputs = [ProviderOutput(index=0, url=self.content_url(video_id), expires_at=expires)]
        return ProviderTask(provider_task_id=video_id, status=status, outputs=outputs)

    def credential_origins(self) -> set[tuple[str, str, int]]:
        return {origin(self.api_base)}

    def download_credentials(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"}

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        data = doc.get("data")
        if not isinstance(data, dict):
            raise InvalidResponseError("openai webhook: data is not an object")
        status = EVENT_STATUS.get(str(doc.get("type")), "RUNNING")
        return CallbackHint(task_id=text(data, "id"), status=status, outputs=None)
