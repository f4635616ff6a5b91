"""MiniMax: the retrieve call's ``download_url`` lives about 9 hours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.vendor_answers import answering


@pytest.mark.anyio
async def test_a_download_url_is_given_nine_hours_from_the_retrieve_call() -> None:
    adapter = answering(
        "minimax",
        {
            "/v1/query/video_generation?task_id=m1": {
                "task_id": "m1",
                "status": "Success",
                "file_id": "f1",
            },
            "/v1/files/retrieve?file_id=f1": {
                "file": {"download_url": "https://cdn.minimax.example/v.mp4", "bytes": 42}
            },
        },
    )
    before = datetime.now(UTC)
    [output] = (await adapter.get_task("m1")).outputs
    assert output.size == 42 and output.expires_at is not None
    assert timedelta(hours=9) <= output.expires_at - before <= timedelta(hours=9, seconds=5)
