"""OpenRouter: events, the ``<job_id>-<status>`` delivery key, hostile bodies, job reads."""

from __future__ import annotations

import msgspec
import pytest

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError, MalformedInputError, OutputLostError
from aivedio.providers.openrouter import OpenRouterAdapter
from aivedio.providers.seam import check_reported
from tests.support.vendor_answers import answering

CONFIG = ProviderConfig(adapter="openrouter")


def event(status: str, data: object) -> bytes:
    return msgspec.json.encode({"type": f"video.generation.{status}", "data": data})


def test_a_completed_event_carries_its_outputs_and_its_idempotency_key() -> None:
    videos = [{"url": "https://cdn.openrouter.example/a.mp4"}, {"url": "https://c/b.mp4"}]
    hint = OpenRouterAdapter.parse_callback(
        event("completed", {"id": "job-7", "status": "completed", "videos": videos}), CONFIG
    )
    assert (hint.task_id, hint.status, hint.event_id) == ("job-7", "SUCCEEDED", "job-7-completed")
    assert hint.outputs is not None
    assert [(o.index, o.url, o.expires_at) for o in hint.outputs] == [
        (0, videos[0]["url"], None),  # no stated lifetime: the provider's default TTL applies
        (1, videos[1]["url"], None),
    ]


@pytest.mark.parametrize(
    ("status", "normalised"),
    [("failed", "FAILED"), ("cancelled", "CANCELLED"), ("expired", "FAILED")],
)
def test_other_events_name_the_job_only(status: str, normalised: str) -> None:
    body = event(status, {"id": "job-7", "videos": [{"url": "https://evil.example/x"}]})
    hint = OpenRouterAdapter.parse_callback(body, CONFIG)
    assert (hint.status, hint.outputs, hint.event_id) == (normalised, None, f"job-7-{status}")


@pytest.mark.parametrize(
    "body",
    [
        event("started", {"id": "j"}),  # not one of the four events
        msgspec.json.encode({"type": "video.generated", "data": {"id": "j"}}),
        event("completed", ["j"]),  # data of the wrong type
        event("completed", {"id": 7, "videos": [{"url": "https://x/y"}]}),
        event("completed", {"id": "j", "videos": "https://x/y"}),
        event("completed", {"id": "j", "videos": [{"url": 5}]}),
        event("completed", {"id": "j", "videos": []}),
        event("completed", {"id": "j", "videos": [{"url": "https://x/y"}] * 300}),
        b"[1, 2]",
    ],
)
def test_a_signed_but_hostile_body_is_refused(body: bytes) -> None:
    with pytest.raises(InvalidResponseError):
        OpenRouterAdapter.parse_callback(body, CONFIG)


def test_what_a_completed_body_says_is_held_to_what_we_store() -> None:
    # Signed is not sane: an overlong id or a URL with control characters is refused at the
    # edge that every callback passes (``vendor_callbacks.parse``).
    for data in (
        {"id": "j" * 401, "videos": [{"url": "https://x/y"}]},
        {"id": "j", "videos": [{"url": "https://x/y\r\nHost: evil"}]},
        {"id": "j", "videos": [{"url": "https://x/" + "y" * 9000}]},
    ):
        hint = OpenRouterAdapter.parse_callback(event("completed", data), CONFIG)
        with pytest.raises(MalformedInputError):
            check_reported(hint.task_id, hint.outputs)


@pytest.mark.anyio
async def test_a_job_read_gives_its_videos_and_an_expired_job_loses_them() -> None:
    base = "/api/v1/videos/"
    adapter = answering(
        "openrouter",
        {
            base + "j1": {"id": "j1", "status": "completed", "videos": [{"url": "https://c/1"}]},
            base + "j2": {"id": "j2", "status": "in_progress"},
            base + "j3": {"id": "j3", "status": "expired"},
            base + "j4": {"id": "j4", "status": "something_new"},
        },
    )
    done = await adapter.get_task("j1")
    assert done.status == "SUCCEEDED" and [o.url for o in done.outputs] == ["https://c/1"]
    assert done.outputs[0].expires_at is not None  # default_url_ttl_seconds from the read
    assert (await adapter.get_task("j2")).status == "RUNNING"
    assert (await adapter.get_task("j4")).status == "RUNNING"  # a later status: keep asking
    with pytest.raises(OutputLostError):
        await adapter.refresh_output_url("j3", 0)
    assert (await adapter.refresh_output_url("j1", 0)).url == "https://c/1"
