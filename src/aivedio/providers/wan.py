"""Alibaba Wan on Model Studio (DashScope): asynchronous, polled by ``task_id``.

Documented (Model Studio API reference): a generation is asynchronous; the result is read
with ``GET /api/v1/tasks/{task_id}`` (bearer key), ``output.task_status`` PENDING,
RUNNING, SUCCEEDED, FAILED, CANCELED or UNKNOWN, the video at ``output.video_url``; the
task id, and the result's URL, are valid for 24 hours. No callback is documented.

UNKNOWN is the answer for a task the service no longer (or never) knew, so it reads as a
404: a watch gives up after a few such reads, and a refresh ends in OUTPUT_LOST. The task's
times (``submit_time``, ``end_time``) carry no zone, so the 24 hours are counted from our
first read of the finished task, and the URL is never re-issued: a refresh reads the task
again until then and answers OUTPUT_LOST after. One output per task. Cadence: not
documented; we assume 10 s.
"""

from __future__ import annotations

from typing import ClassVar

from aivedio.errors import InvalidResponseError, NotYetAvailableError
from aivedio.providers.base import VendorAdapter, path_segment, text
from aivedio.providers.seam import ProviderOutput, ProviderTask

UNKNOWN = "UNKNOWN"


class WanAdapter(VendorAdapter):
    kind = "wan"
    default_api_base_url = "https://dashscope-intl.aliyuncs.com"
    default_poll_interval_seconds = 10.0
    default_poll_jitter_seconds = 2.0
    lifetime_seconds = 24 * 3600.0
    refreshable = False
    statuses: ClassVar[dict[str, str]] = {
        "PENDING": "RUNNING",
        "RUNNING": "RUNNING",
        "SUCCEEDED": "SUCCEEDED",
        "FAILED": "FAILED",
        "CANCELED": "CANCELLED",
    }

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call("GET", self.api_url(f"/api/v1/tasks/{path_segment(task_id)}"))
        output = doc.get("output")
        if not isinstance(output, dict):
            raise InvalidResponseError("wan task: output is not an object")
        raw_status = output.get("task_status")
        if raw_status == UNKNOWN:
            error = NotYetAvailableError(
                "wan task is UNKNOWN: older than its 24 hours, or never issued"
            )
            error.http_status = 404
            raise error
        status = self.status(raw_status)
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            outputs = [
                ProviderOutput(index=0, url=text(output, "video_url"), expires_at=self.expiry())
            ]
        return ProviderTask(
            provider_task_id=text(output, "task_id"), status=status, outputs=outputs
        )
