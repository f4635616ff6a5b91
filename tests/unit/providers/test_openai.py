"""OpenAI's Videos API shut down on 2026-09-24: nothing new is registered for it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from aivedio.config.load import ProviderConfig
from aivedio.errors import OutputLostError, PolicyBlockedError
from aivedio.providers import check_open
from aivedio.providers.openai import OpenAIAdapter
from tests.support.vendor_answers import answering

DAY_BEFORE = datetime(2026, 9, 23, 23, 59, tzinfo=UTC)
SHUTDOWN = datetime(2026, 9, 24, 0, 0, tzinfo=UTC)


def test_registrations_are_refused_from_the_shutdown_day_naming_the_date() -> None:
    OpenAIAdapter.check_open("sora", DAY_BEFORE)  # the day before: still open
    with pytest.raises(PolicyBlockedError) as refused:
        OpenAIAdapter.check_open("sora", SHUTDOWN)
    assert refused.value.detail.startswith("provider_shut_down:")
    assert "2026-09-24" in refused.value.detail and "'sora'" in refused.value.detail
    # Today (after the date) through the one check every registration path makes.
    with pytest.raises(PolicyBlockedError, match="OpenAI Videos API was shut down on 2026-09-24"):
        check_open("sora", ProviderConfig(adapter="openai", api_key="k"))
    check_open("acme", ProviderConfig())  # a generic provider has no such date
    check_open("runway", ProviderConfig(adapter="runway"))


@pytest.mark.anyio
async def test_after_the_shutdown_nothing_is_asked_a_running_task_fails_and_urls_are_lost() -> None:
    adapter = answering("openai", {})  # any API call would fail the test (KeyError)
    task = await adapter.get_task("video_1")
    assert (task.status, task.outputs) == ("FAILED", [])
    with pytest.raises(OutputLostError, match="2026-09-24"):
        await adapter.refresh_output_url("video_1", 0)
    assert adapter.asked == []  # type: ignore[attr-defined]
