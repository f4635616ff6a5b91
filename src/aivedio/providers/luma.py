"""Luma Dream Machine: poll ``GET /dream-machine/v1/generations/{id}``, or a ``callback_url``.

Luma POSTs the generation to the ``callback_url`` on every state change, retried 3 times
100 ms apart with a 5 s timeout, unsigned. So a callback is a hint whatever it says: its
``assets.video`` is never taken, the generation is read from Luma with our key before
anything is recorded, and a callback for an intermediate state (queued, dreaming) only
makes that read due. The output is ``assets.video``; its lifetime and whether a new URL is
issued later are not documented: [providers.NAME] default_url_ttl_seconds applies, and a
refresh reads the generation again. Cadence: not documented; we assume 3 s.
"""

from __future__ import annotations

from typing import ClassVar

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError
from aivedio.providers.base import CallbackHint, VendorAdapter, decode_object, path_segment, text
from aivedio.providers.seam import ProviderOutput, ProviderTask


class LumaAdapter(VendorAdapter):
    kind = "luma"
    default_api_base_url = "https://api.lumalabs.ai"
    default_poll_interval_seconds = 3.0
    default_poll_jitter_seconds = 0.75
    callback_scheme = "unsigned"
    statuses: ClassVar[dict[str, str]] = {
        "queued": "RUNNING",
        "dreaming": "RUNNING",
        "completed": "SUCCEEDED",
        "failed": "FAILED",
    }

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call(
            "GET", self.api_url(f"/dream-machine/v1/generations/{path_segment(task_id)}")
        )
        status = self.status(doc.get("state"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            assets = doc.get("assets")
            if not isinstance(assets, dict):
                raise InvalidResponseError("luma generation: assets is not an object")
            outputs = [ProviderOutput(index=0, url=text(assets, "video"), expires_at=self.expiry())]
        return ProviderTask(provider_task_id=text(doc, "id"), status=status, outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        return CallbackHint(
            task_id=text(doc, "id"), status=cls.statuses.get(str(doc.get("state")), "RUNNING")
        )
