"""Wan (Model Studio): task reads by ``task_id``, valid 24 h, UNKNOWN as gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aivedio.errors import InvalidResponseError, NotYetAvailableError, OutputLostError
from aivedio.providers.wan import WanAdapter
from tests.support.vendor_answers import answering


def task(task_id: str, status: str, **extra: object) -> dict[str, object]:
    return {"request_id": "r", "output": {"task_id": task_id, "task_status": status, **extra}}


ANSWERS = {
    "/api/v1/tasks/w1": task("w1", "SUCCEEDED", video_url="https://oss.example/v.mp4"),
    "/api/v1/tasks/w2": task("w2", "PENDING"),
    "/api/v1/tasks/w3": task("w3", "CANCELED"),
    "/api/v1/tasks/w4": task("w4", "UNKNOWN"),
    "/api/v1/tasks/w5": {"request_id": "r", "output": None},
}


@pytest.mark.anyio
async def test_a_finished_task_gives_its_video_for_24_hours_from_our_read() -> None:
    adapter = answering("wan", ANSWERS)
    before = datetime.now(UTC)
    finished = await adapter.get_task("w1")
    [output] = finished.outputs
    assert output.url == "https://oss.example/v.mp4"
    assert output.expires_at is not None
    assert timedelta(hours=24) <= output.expires_at - before <= timedelta(hours=24, seconds=5)
    assert (await adapter.get_task("w2")).status == "RUNNING"
    assert (await adapter.get_task("w3")).status == "CANCELLED"
    with pytest.raises(InvalidResponseError):
        await adapter.get_task("w5")
    assert not WanAdapter.refreshable and WanAdapter.callback_scheme == "none"


@pytest.mark.anyio
async def test_an_unknown_task_reads_as_gone() -> None:
    # Older than its 24 hours (or never issued): a 404 to the poller (a few reads, then it
    # gives up) and, for a stored output, lost.
    adapter = answering("wan", ANSWERS)
    with pytest.raises(NotYetAvailableError) as unknown:
        await adapter.get_task("w4")
    assert unknown.value.http_status == 404
    with pytest.raises(OutputLostError, match="no longer knows"):
        await adapter.refresh_output_url("w4", 0)
