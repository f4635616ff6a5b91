"""Google Veo on the Gemini API: a long-running operation, polled until ``done``.

The task id is the operation's name (``models/…/operations/…``), read with
``GET /v1beta/{name}``. Outputs are ``response.generateVideoResponse.generatedSamples[]
.video.uri``, file download URLs that need the API key (sent as ``x-goog-api-key``, to the
API origin or the configured download origin only). Files stay two days on the server and
are never re-issued: the operation carries no time, so we count the two days from when we
first read it, and a refresh after that answers OUTPUT_LOST. No webhook exists.
Cadence: not documented; the guide's examples poll every 10 s.
"""

from __future__ import annotations

from typing import Any

from aivedio.errors import InvalidResponseError
from aivedio.providers.base import VendorAdapter, origin, text
from aivedio.providers.operations import operation_path, operation_status
from aivedio.providers.seam import ProviderOutput, ProviderTask


class VeoGeminiAdapter(VendorAdapter):
    kind = "veo_gemini"
    default_api_base_url = "https://generativelanguage.googleapis.com"
    default_poll_interval_seconds = 10.0
    default_poll_jitter_seconds = 2.0
    lifetime_seconds = 2 * 86400.0
    refreshable = False

    def api_headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self.config.api_key}

    @classmethod
    def check_task_id(cls, task_id: str) -> None:
        operation_path(task_id, "models")

    async def get_task(self, task_id: str) -> ProviderTask:
        doc = await self.call("GET", self.api_url(f"/v1beta/{operation_path(task_id, 'models')}"))
        status = operation_status(doc)
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            expires = self.expiry()
            for i, sample in enumerate(_samples(doc["response"])):
                video = sample.get("video") if isinstance(sample, dict) else None
                if not isinstance(video, dict):
                    raise InvalidResponseError("gemini operation: a sample has no video")
                outputs.append(
                    ProviderOutput(
                        index=i,
                        url=text(video, "uri"),
                        expires_at=expires,
                        content_type=video.get("mimeType") or None,
                    )
                )
        return ProviderTask(provider_task_id=text(doc, "name"), status=status, outputs=outputs)

    def credential_origins(self) -> set[tuple[str, str, int]]:
        origins = {origin(self.api_base)}
        if self.config.download_base_url:
            origins.add(origin(self.config.download_base_url))
        return origins

    def download_credentials(self) -> dict[str, str]:
        return {"x-goog-api-key": self.config.api_key}


def _samples(response: dict[str, Any]) -> list[Any]:
    generated = response.get("generateVideoResponse")
    samples = generated.get("generatedSamples") if isinstance(generated, dict) else None
    if not isinstance(samples, list) or not samples:
        raise InvalidResponseError("gemini operation: no generatedSamples")
    return samples
