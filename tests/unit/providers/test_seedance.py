"""Seedance (BytePlus ModelArk): task reads, the 24 h clearing, unsigned callbacks."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from aivedio.config.load import ProviderConfig
from aivedio.errors import InvalidResponseError, OutputLostError
from aivedio.providers.seedance import SeedanceAdapter
from tests.support.vendor_answers import answering

PATH = "/api/v3/contents/generations/tasks/"


@pytest.mark.anyio
async def test_the_video_url_expires_24_hours_after_the_task_was_created() -> None:
    created = int(time.time()) - 3600
    adapter = answering(
        "seedance",
        {
            PATH + "cgt-1": {
                "id": "cgt-1",
                "status": "succeeded",
                "created_at": created,
                "content": {"video_url": "https://tos.example/v.mp4"},
            },
            PATH + "cgt-2": {"id": "cgt-2", "status": "running", "created_at": created},
            PATH + "cgt-3": {"id": "cgt-3", "status": "succeeded", "content": "nope"},
        },
    )
    task = await adapter.get_task("cgt-1")
    assert task.status == "SUCCEEDED"
    [output] = task.outputs
    assert output.url == "https://tos.example/v.mp4"
    assert output.expires_at == datetime.fromtimestamp(created, UTC) + timedelta(hours=24)
    assert (await adapter.get_task("cgt-2")).status == "RUNNING"
    with pytest.raises(InvalidResponseError):
        await adapter.get_task("cgt-3")
    # Past the 24 hours the URL is not re-issued: lost, without asking.
    past = datetime.now(UTC) - timedelta(seconds=1)
    with pytest.raises(OutputLostError, match="does not re-issue"):
        await adapter.refresh_output_url("cgt-1", 0, expires_at=past)
    assert adapter.asked.count(PATH + "cgt-1") == 1  # type: ignore[attr-defined]


def test_a_callback_is_a_hint_whatever_its_body_says() -> None:
    body = b'{"id": "cgt-1", "status": "succeeded", "content": {"video_url": "https://evil/x"}}'
    hint = SeedanceAdapter.parse_callback(body, ProviderConfig())
    assert (hint.task_id, hint.status, hint.outputs) == ("cgt-1", "SUCCEEDED", None)
    for hostile in (b'{"id": 1, "status": "succeeded"}', b'"cgt-1"', b'{"status": "running"}'):
        with pytest.raises(InvalidResponseError):
            SeedanceAdapter.parse_callback(hostile, ProviderConfig())
