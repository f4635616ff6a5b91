"""Veo on the Gemini API: webhooks (``video.generated``) taken instead of polling."""

from __future__ import annotations

import msgspec
import pytest

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError, PolicyBlockedError
from aivedio.providers.veo_gemini import WEBHOOK_BACKSTOP_SECONDS, VeoGeminiAdapter
from tests.support.vendor_answers import FETCHER

OPERATION = "models/veo-3.1-generate-preview/operations/op-1"


def event(data: object, kind: str = "video.generated") -> bytes:
    return msgspec.json.encode({"id": "evt_1", "type": kind, "data": data})


def test_a_video_generated_event_names_the_operation_and_never_carries_a_url() -> None:
    hostile = "https://169.254.169.254/latest/meta-data"  # the URI is not what we fetch
    hint = VeoGeminiAdapter.parse_callback(
        event({"name": OPERATION, "output_file_uri": hostile}), ProviderConfig()
    )
    assert (hint.task_id, hint.status, hint.outputs) == (OPERATION, "SUCCEEDED", None)
    assert VeoGeminiAdapter.callback_scheme == "standard_webhooks"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (event({"name": OPERATION}, kind="batch.succeeded"), InvalidResponseError),
        (event("models/x/operations/y"), InvalidResponseError),
        (event({"name": 5}), InvalidResponseError),
        (event({"name": OPERATION, "output_file_uri": {"a": 1}}), InvalidResponseError),
        (event({"name": OPERATION, "output_file_uri": "x" * 9000}), InvalidResponseError),
        # Goes into a URL sent with our key: an operation name or nothing.
        (event({"name": "models/../../v1beta/files/operations/x"}), PolicyBlockedError),
        (event({"name": "files/abc"}), PolicyBlockedError),
    ],
)
def test_a_signed_but_hostile_event_is_refused(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        VeoGeminiAdapter.parse_callback(body, ProviderConfig())


def test_with_webhooks_configured_polling_is_only_a_slow_backstop() -> None:
    plain = VeoGeminiAdapter("veo", ProviderConfig(adapter="veo_gemini", api_key="k"), FETCHER)
    assert plain.poll_interval_seconds == 10.0
    for settings in ({"webhook_secret": "whsec_QUJD"}, {"extra_webhook_secrets": ["whsec_QUJD"]}):
        hooked = VeoGeminiAdapter(
            "veo", ProviderConfig(adapter="veo_gemini", api_key="k", **settings), FETCHER
        )
        assert hooked.poll_interval_seconds == WEBHOOK_BACKSTOP_SECONDS
    chosen = VeoGeminiAdapter(
        "veo",
        ProviderConfig(
            adapter="veo_gemini", api_key="k", webhook_secret="whsec_QUJD", poll_interval_seconds=3
        ),
        FETCHER,
    )
    assert chosen.poll_interval_seconds == 3  # the operator's word wins
