"""MiniMax (Hailuo): poll ``GET /v1/query/video_generation?task_id=``, or a ``callback_url``.

The output takes two steps: the task names a ``file_id``, and ``GET /v1/files/retrieve
?file_id=`` (with the bearer key, to the API origin only) answers ``file.download_url`` and
``file.bytes``. The download URL lives about 9 hours (32,400 s: a third-party source, not
MiniMax's documentation), counted from our retrieve call; a refresh calls retrieve again
for a new one.

Callbacks: MiniMax first posts ``{"challenge": …}`` and wants it echoed within 3 s; later
posts carry no signature, so they are hints confirmed by reading the task. Cadence: the
guide's examples poll every 10 s.
"""

from __future__ import annotations

from typing import ClassVar

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError
from aivedio.providers.base import CallbackHint, VendorAdapter, decode_object, text
from aivedio.providers.seam import ProviderOutput, ProviderTask


class MiniMaxAdapter(VendorAdapter):
    kind = "minimax"
    default_api_base_url = "https://api.minimax.io"
    default_poll_interval_seconds = 10.0
    default_poll_jitter_seconds = 2.0
    callback_scheme = "minimax_challenge"
    lifetime_seconds = 9 * 3600.0
    statuses: ClassVar[dict[str, str]] = {
        "Preparing": "RUNNING",
        "Queueing": "RUNNING",
        "Processing": "RUNNING",
        "Success": "SUCCEEDED",
        "Fail": "FAILED",
    }

    async def get_task(self, task_id: str) -> ProviderTask:
        self.check_task_id(task_id)  # a query value (encoded), but held to the same rule
        doc = await self.call("GET", self.api_url("/v1/query/video_generation", task_id=task_id))
        status = self.status(doc.get("status"))
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            retrieved = await self.call(
                "GET", self.api_url("/v1/files/retrieve", file_id=text(doc, "file_id"))
            )
            file = retrieved.get("file")
            if not isinstance(file, dict):
                raise InvalidResponseError("minimax retrieve: file is not an object")
            size = file.get("bytes")
            outputs = [
                ProviderOutput(
                    index=0,
                    url=text(file, "download_url"),
                    expires_at=self.expiry(),
                    size=size if isinstance(size, int) and size >= 0 else None,
                )
            ]
        return ProviderTask(provider_task_id=text(doc, "task_id"), status=status, outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        status = str(doc.get("status", ""))
        normalised = cls.statuses.get(status) or cls.statuses.get(status.capitalize(), "RUNNING")
        return CallbackHint(task_id=text(doc, "task_id"), status=normalised)
