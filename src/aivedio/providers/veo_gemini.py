"""Google Veo on the Gemini API: a long-running operation, polled until ``done``.

The task id is the operation's name (``models/…/operations/…``), read with
``GET /v1beta/{name}``. Outputs are ``response.generateVideoResponse.generatedSamples[]
.video.uri``, file download URLs that need the API key (sent as ``x-goog-api-key``, to the
API origin or the configured download origin only). Files stay two days on the server and
are never re-issued: the operation carries no time, so we count the two days from when we
first read it, and a refresh after that answers OUTPUT_LOST.
Cadence: not documented; the guide's examples poll every 10 s.

Webhooks (December 2026): a project-level (static) webhook, or per-request (dynamic) ones
named in the request's ``webhook_config``, signed to the Standard Webhooks specification;
the signing secret is shown once, at creation. Configured (``webhook_secret``, and
``extra_webhook_secrets`` for per-request ones or a rotation), the adapter takes them
instead of polling: a watched operation is read at a slow backstop cadence
(``WEBHOOK_BACKSTOP_SECONDS``, for a delivery that never came) unless
``poll_interval_seconds`` says otherwise, and a verified ``video.generated`` makes its read
due now. The event is documented to carry ``output_file_uri``; that the operation's name is
``data.name`` is our assumption (Google's resources name themselves so). The event is a
hint even though it is our project's: one URI per event says nothing of which sample it is
or when it was made, and the operation read gives every sample with the key-guarded URIs
we already trust, so nothing from the body reaches the database but the operation's name
(held to the operation-name rule, since it goes into a URL with our key).
"""

from __future__ import annotations

from typing import Any

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError
from aivedio.net.fetch import Fetcher
from aivedio.providers.base import CallbackHint, VendorAdapter, decode_object, origin, text
from aivedio.providers.operations import operation_path, operation_status
from aivedio.providers.seam import MAX_URL_CHARS, ProviderOutput, ProviderTask

VIDEO_EVENT = "video.generated"
# With webhooks, a read of a watched operation at this pace only catches a lost delivery.
WEBHOOK_BACKSTOP_SECONDS = 600.0


class VeoGeminiAdapter(VendorAdapter):
    kind = "veo_gemini"
    default_api_base_url = "https://generativelanguage.googleapis.com"
    default_poll_interval_seconds = 10.0
    default_poll_jitter_seconds = 2.0
    lifetime_seconds = 2 * 86400.0
    refreshable = False
    callback_scheme = "standard_webhooks"
    # The secret is our project's (static) or our request's (dynamic): only we can have it.
    callback_signed_by_account = True

    def __init__(self, name: str, config: ProviderConfig, fetcher: Fetcher) -> None:
        super().__init__(name, config, fetcher)
        webhooks = bool(config.webhook_secret or config.extra_webhook_secrets)
        if webhooks and config.poll_interval_seconds is None:
            self.poll_interval_seconds = WEBHOOK_BACKSTOP_SECONDS
            self.poll_jitter_seconds = WEBHOOK_BACKSTOP_SECONDS / 10

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

    @classmethod
    def parse_callback(cls, body: bytes, config: ProviderConfig) -> CallbackHint:
        return parse_event(body)

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


def parse_event(body: bytes) -> CallbackHint:
    """A verified webhook delivery: the operation it names, as a hint (outputs None)."""
    doc = decode_object(body)
    if doc.get("type") != VIDEO_EVENT:
        raise InvalidResponseError(
            f"gemini webhook: not a {VIDEO_EVENT} event (subscribe the webhook to it only)"
        )
    data = doc.get("data")
    if not isinstance(data, dict):
        raise InvalidResponseError("gemini webhook: data is not an object")
    uri = data.get("output_file_uri")
    if uri is not None and not (isinstance(uri, str) and 0 < len(uri) <= MAX_URL_CHARS):
        raise InvalidResponseError("gemini webhook: output_file_uri is not a URL")
    name = text(data, "name")
    VeoGeminiAdapter.check_task_id(name)  # PolicyBlockedError: not an operation name
    return CallbackHint(task_id=name, status="SUCCEEDED", outputs=None)
