"""Runway: no webhook; poll ``GET /v1/tasks/{id}`` (the SDK's cadence: 6 s ± 1.5 s).

``output`` lists one or more signed CloudFront URLs that expire 24 to 48 hours after the API
was accessed: we assume the short end from the moment we read the task, and a refresh reads
the task again for freshly signed URLs.
"""

from __future__ import annotations

from typing import ClassVar

from aivedio.errors import InvalidResponseError
from aivedio.providers.base import VendorAdapter, path_segment, text
from aivedio.providers.seam import ProviderOutput, ProviderTask

API_VERSION = "2024-11-06"


class RunwayAdapter(VendorAdapter):
    kind = "runway"
    default_api_base_url = "https://api.dev.runwayml.com"
    default_poll_interval_seconds = 6.0
    default_poll_jitter_seconds = 1.5
    lifetime_seconds = 24 * 3600.0
    statuses: ClassVar[dict[str, str]] = {
        "PENDING": "RUNNING",
        "THROTTLED": "RUNNING",
        "RUNNING": "RUNNING",
        "SUCCEEDED": "SUCCEEDED",
        "FAILED": "FAILED",
        "CANCELLED": "CANCELLED",
    }

    def api_headers(self) -> dict[str, str]:
        return {**super().api_headers(), "X-Runway-Version": API_VERSION}

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call("GET", self.api_url(f"/v1/tasks/{path_segment(task_id)}"))
        status = self.status(doc.get("status"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            urls = doc.get("output")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise InvalidResponseError("runway task: output is not a list of URLs")
            expires = self.expiry()
            outputs = [
                ProviderOutput(index=i, url=u, expires_at=expires) for i, u in enumerate(urls)
            ]
        return ProviderTask(provider_task_id=text(doc, "id"), status=status, outputs=outputs)
