"""OpenRouter video generation: an aggregator in front of Veo, Wan, Kling, Seedance, MiniMax.

Documented (OpenRouter's own skill notes): a ``callback_url`` per job; events
``video.generation.completed``, ``failed``, ``cancelled`` and ``expired``; each delivery
signed in ``X-OpenRouter-Signature`` (``providers/openrouter_webhooks.py``) with the
account's secret; the idempotency key ``<job_id>-<status>``.

Not documented there, so assumed and kept in this module alone: the job is read with
``GET /api/v1/videos/{id}`` and the bearer key; a job document (also a callback's ``data``)
is ``{"id", "status", "videos": [{"url"}, …]}`` with the statuses of the events (and
``pending`` / ``in_progress`` while it runs); a callback is ``{"type": <event>, "data":
<job>}``. The outputs' lifetime is not stated: ``[providers.NAME] default_url_ttl_seconds``
applies, and a refresh reads the job again; a job read that says ``expired`` lists no output,
so the refresh ends in OUTPUT_LOST. Cadence: not documented; we assume 5 s.

The signature is the account's, so a verified ``completed`` body is recorded at once (its
fields held to what we store like any other, its URLs to the fetch's network policy); the
other events name the job only and are confirmed by a read.
"""

from __future__ import annotations

from typing import Any, ClassVar

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError
from aivedio.providers.base import CallbackHint, VendorAdapter, decode_object, path_segment, text
from aivedio.providers.seam import MAX_OUTPUT_INDEX, ProviderOutput, ProviderTask

EVENT_PREFIX = "video.generation."
EVENT_STATUSES = ("completed", "failed", "cancelled", "expired")


class OpenRouterAdapter(VendorAdapter):
    kind = "openrouter"
    default_api_base_url = "https://openrouter.ai"
    default_poll_interval_seconds = 5.0
    default_poll_jitter_seconds = 1.0
    callback_scheme = "openrouter_hmac"
    callback_signed_by_account = True
    statuses: ClassVar[dict[str, str]] = {
        "pending": "RUNNING",
        "in_progress": "RUNNING",
        "completed": "SUCCEEDED",
        "failed": "FAILED",
        "cancelled": "CANCELLED",
        # The job (or its output) is past its time at OpenRouter: nothing left to fetch.
        "expired": "FAILED",
    }

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call("GET", self.api_url(f"/api/v1/videos/{path_segment(task_id)}"))
        status = self.status(doc.get("status"))
        outputs = job_outputs(doc, self.expiry()) if status == "SUCCEEDED" else []
        return ProviderTask(provider_task_id=text(doc, "id"), status=status, outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        event = text(doc, "type")
        status = event.removeprefix(EVENT_PREFIX)
        if not event.startswith(EVENT_PREFIX) or status not in EVENT_STATUSES:
            raise InvalidResponseError(f"openrouter callback: unknown event type {event[:80]!r}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise InvalidResponseError("openrouter callback: data is not an object")
        job_id = text(data, "id")
        normalised = cls.statuses[status]
        outputs = None
        if normalised == "SUCCEEDED":
            # Expiry left to the provider's default TTL at intake (not stated by OpenRouter).
            outputs = job_outputs(data, None)
        return CallbackHint(
            task_id=job_id, status=normalised, outputs=outputs, event_id=f"{job_id}-{status}"
        )


def job_outputs(doc: dict[str, Any], expires: Any) -> list[ProviderOutput]:
    videos = doc.get("videos")
    if (
        not isinstance(videos, list)
        or not 0 < len(videos) <= MAX_OUTPUT_INDEX + 1
        or not all(isinstance(v, dict) for v in videos)
    ):
        raise InvalidResponseError("openrouter job: videos is not a list of objects")
    return [
        ProviderOutput(index=i, url=text(v, "url"), expires_at=expires)
        for i, v in enumerate(videos)
    ]
