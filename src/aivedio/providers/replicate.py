"""Replicate: poll ``GET /v1/predictions/{id}``, or take the per-request webhook.

Webhooks are Standard Webhooks with the account's ``whsec_`` secret and carry the whole
prediction, so a verified one is recorded from its body. ``output`` is a URL or a list of
URLs, depending on the model. API outputs are removed an hour after the prediction
completed and are never re-issued: the expiry counts from ``completed_at``, and a refresh
after it answers OUTPUT_LOST. Cadence: not documented for the HTTP API; we assume 2 s.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

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

LIFETIME = timedelta(hours=1)


class ReplicateAdapter(VendorAdapter):
    kind = "replicate"
    default_api_base_url = "https://api.replicate.com"
    default_poll_interval_seconds = 2.0
    default_poll_jitter_seconds = 0.5
    lifetime_seconds = LIFETIME.total_seconds()
    refreshable = False
    callback_scheme = "standard_webhooks"
    callback_signed_by_account = True
    statuses: ClassVar[dict[str, str]] = {
        "starting": "RUNNING",
        "processing": "RUNNING",
        "succeeded": "SUCCEEDED",
        "failed": "FAILED",
        "canceled": "CANCELLED",
        "aborted": "CANCELLED",
    }

    async def get_task(self, task_id: str) -> ProviderTask:
        return self.prediction(
            await self.call("GET", self.api_url(f"/v1/predictions/{path_segment(task_id)}"))
        )

    def prediction(self, doc: dict[str, Any]) -> ProviderTask:
        status = self.status(doc.get("status"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            outputs = prediction_outputs(
                doc, self.expiry(parse_time(doc.get("completed_at"), "completed_at"))
            )
        return ProviderTask(provider_task_id=text(doc, "id"), status=status, outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        status = cls.statuses.get(str(doc.get("status")), "RUNNING")
        outputs = None
        if status == "SUCCEEDED":
            completed = parse_time(doc.get("completed_at"), "completed_at")
            if completed is None:
                return CallbackHint(task_id=text(doc, "id"), status=status)
            outputs = prediction_outputs(doc, completed + LIFETIME)
        return CallbackHint(task_id=text(doc, "id"), status=status, outputs=outputs)


def prediction_outputs(doc: dict[str, Any], expires: Any) -> list[ProviderOutput]:
    output = doc.get("output")
    urls = [output] if isinstance(output, str) else output
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise InvalidResponseError("replicate prediction: output is not a URL or a list of URLs")
    return [ProviderOutput(index=i, url=u, expires_at=expires) for i, u in enumerate(urls)]
