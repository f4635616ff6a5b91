"""fal.ai (and Pika through it): the queue API, or signed webhooks.

``GET {base}/{app_id}/requests/{id}/status`` answers 202 while IN_QUEUE or IN_PROGRESS and
200 once COMPLETED; the result is then ``GET {base}/{app_id}/requests/{id}``. Webhooks
(``status`` OK or ERROR, the result under ``payload``) are ED25519-signed against fal's
JWKS, so a verified one is recorded from its body. Outputs are File objects
``{url, content_type, file_name, file_size}`` under ``video`` (or a ``videos`` list), on a
public CDN by default. Their lifetime is a per-request preference whose default fal does not
state: [providers.NAME] default_url_ttl_seconds applies, and a refresh reads the result
again. Cadence: not documented; we assume 2 s.
"""

from __future__ import annotations

from typing import Any

from aivedio.config.load import ProviderConfig
from aivedio.errors import AivedioError, InvalidResponseError
from aivedio.providers.base import CallbackHint, VendorAdapter, decode_object, path_segment, text
from aivedio.providers.seam import ProviderOutput, ProviderTask


class FalAdapter(VendorAdapter):
    kind = "fal"
    default_api_base_url = "https://queue.fal.run"
    default_poll_interval_seconds = 2.0
    default_poll_jitter_seconds = 0.5
    callback_scheme = "fal_ed25519"
    required_secrets = ("api_key", "app_id")

    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Key {self.config.api_key}"}

    async def get_task(self, task_id: str) -> ProviderTask:
        base = f"/{self.config.app_id.strip('/')}/requests/{path_segment(task_id)}"
        try:
            doc = await self.call("GET", self.api_url(base + "/status"))
        except AivedioError as exc:
            if exc.http_status == 202:  # IN_QUEUE / IN_PROGRESS
                return ProviderTask(provider_task_id=task_id, status="RUNNING")
            raise
        if doc.get("status") != "COMPLETED":
            return ProviderTask(provider_task_id=task_id, status="RUNNING")
        result = await self.call("GET", self.api_url(base))
        outputs = file_outputs(result, self.expiry())
        return ProviderTask(provider_task_id=task_id, status="SUCCEEDED", outputs=outputs)

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        doc = decode_object(body)
        task_id = text(doc, "request_id")
        if doc.get("status") != "OK":
            return CallbackHint(task_id=task_id, status="FAILED", outputs=[])
        payload = doc.get("payload")
        if not isinstance(payload, dict):
            raise InvalidResponseError("fal webhook: payload is not an object")
        return CallbackHint(task_id=task_id, status="SUCCEEDED", outputs=file_outputs(payload))


def file_outputs(result: dict[str, Any], expires: Any = None) -> list[ProviderOutput]:
    files = result.get("videos")
    if files is None and result.get("video") is not None:
        files = [result["video"]]
    if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files):
        raise InvalidResponseError("fal result: no video File object")
    outputs = []
    for i, item in enumerate(files):
        size = item.get("file_size")
        outputs.append(
            ProviderOutput(
                index=i,
                url=text(item, "url"),
                expires_at=expires,
                size=size if isinstance(size, int) and size >= 0 else None,
                content_type=item.get("content_type") or None,
            )
        )
    return outputs
