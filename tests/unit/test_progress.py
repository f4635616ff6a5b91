"""A job's progress from ffmpeg's -progress blocks: the slowest running process's share,
never going back, below 1 while the job runs."""

from __future__ import annotations

import pytest

from aivedio import progress


@pytest.mark.parametrize(
    ("block", "duration", "expected"),
    [
        ({"out_time_us": "2500000", "progress": "continue"}, 10.0, 0.25),
        ({"out_time_ms": "5000000"}, 10.0, 0.5),  # ffmpeg's _ms is microseconds too
        ({"out_time_us": "12000000"}, 10.0, 1.0),  # past the end: done, not more
        ({"out_time_us": "N/A"}, 10.0, None),
        ({"out_time_us": "-3"}, 10.0, None),
        ({}, 10.0, None),
        ({"out_time_us": "1000000"}, 0.0, None),
    ],
)
def test_a_block_gives_its_share_of_the_duration(
    block: dict[str, str], duration: float, expected: float | None
) -> None:
    assert progress.fraction_of(block, duration) == expected


def test_nothing_is_measured_before_a_process_reports() -> None:
    meter = progress.Meter()
    meter.start()
    assert meter.value is None


def test_the_slowest_running_process_sets_the_value_and_it_never_goes_back() -> None:
    seen: list[float] = []
    meter = progress.Meter(on_change=seen.append)
    render = meter.start()
    meter.update(render, 0.4)
    poster = meter.start()  # a short process starting late, at 0: no step back
    meter.update(poster, 1.0)
    assert meter.value == 0.4
    meter.finish(poster)  # one ending early, at 100 %: no jump forward
    assert meter.value == 0.4
    meter.update(render, 0.7)
    assert meter.value == 0.7
    meter.finish(render)
    audio = meter.start()
    meter.update(audio, 0.2)  # the next step starts over: the value holds
    assert meter.value == 0.7
    meter.update(audio, 0.9)
    assert seen == [0.4, 0.7, 0.9]


def test_a_running_job_never_reports_done() -> None:
    meter = progress.Meter()
    token = meter.start()
    meter.update(token, 1.0)
    assert meter.value == progress.RUNNING_CAP
    assert progress.percent(meter.value) == 99.9


def test_an_unknown_token_is_ignored() -> None:
    meter = progress.Meter()
    meter.update(42, 0.5)
    assert meter.value is None
    assert progress.percent(None) is None
