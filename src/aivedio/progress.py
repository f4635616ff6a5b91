"""How far a job's media work has got: measured from ffmpeg's ``-progress``, shown by
``aivedio status``, the API's status and its event stream, and ``aivedio process``.

Measuring. A media job may run several ffmpeg processes, some at once (the renditions'
decode, the poster, the sprite, the waveform, the chunks). Each reports how far it is
through its media timeline (``out_time_us`` of ``-progress``, over the duration it works
on). The job's progress is that of its slowest process still running, and never goes
back: a short process that starts late (at 0 %) or ends early (at 100 %) must not move it
either way, and an estimate that never overstates is the one a person can wait on. It stays
below 1 until the job ends (``Meter.value``); the job's end is what says "done".

Carrying. The worker runs each job with a ``Meter`` in the ``current`` context variable
(processes started in the job's tasks find it there) and its heartbeat writes each running
job's value into ``jobs.progress`` with the leases it extends anyway: the one statement a
worker already sends every ``heartbeat_interval_seconds`` for all its jobs. So progress
costs no statement of its own, and each job's row is written at most once a heartbeat
(5 s by default, far under the once a second a dedicated update would cost per job); a
reader sees it at most one heartbeat late, which a render of seconds to minutes can afford.
The row goes away with the job (its history keeps no progress): a finished job is 100 %
by its state, not by a number.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar

# The job's meter, if whoever runs the job measures it (the worker, ``aivedio process``).
current: ContextVar[Meter | None] = ContextVar("aivedio_progress", default=None)

# The most a running job reports: 1.0 is for a job that ended.
RUNNING_CAP = 0.999


def fraction_of(block: Mapping[str, str], duration_seconds: float) -> float | None:
    """The share of ``duration_seconds`` an ffmpeg ``-progress`` block says is done, in
    [0, 1]; None when the block says nothing usable (no time yet, or no duration)."""
    if duration_seconds <= 0:
        return None
    raw = block.get("out_time_us") or block.get("out_time_ms")  # both are microseconds
    try:
        done_us = int(raw) if raw is not None else None
    except ValueError:
        return None
    if done_us is None or done_us < 0:
        return None
    return min(done_us / 1e6 / duration_seconds, 1.0)


class Meter:
    """One job's progress over its processes (see the module docstring). ``on_change`` is
    called with the new value whenever it rises (``aivedio process`` draws it)."""

    def __init__(self, on_change: Callable[[float], None] | None = None) -> None:
        self._running: dict[int, float] = {}
        self._next = 0
        self._value = 0.0
        self._measured = False
        self._on_change = on_change

    @property
    def value(self) -> float | None:
        """The job's progress in [0, RUNNING_CAP]; None before any process measured any."""
        return self._value if self._measured else None

    def start(self) -> int:
        """A process begins; its token for ``update`` and ``finish``."""
        self._next += 1
        self._running[self._next] = 0.0
        return self._next

    def update(self, token: int, fraction: float) -> None:
        if token not in self._running:
            return
        self._running[token] = max(0.0, min(fraction, 1.0))
        self._measured = True
        self._settle()

    def finish(self, token: int) -> None:
        self._running.pop(token, None)
        self._settle()

    def _settle(self) -> None:
        if not self._running or not self._measured:
            return
        slowest = min(min(self._running.values()), RUNNING_CAP)
        if slowest > self._value:
            self._value = slowest
            if self._on_change is not None:
                self._on_change(slowest)


def percent(fraction: float | None) -> float | None:
    """A stored fraction as the percentage every surface shows (one decimal)."""
    return None if fraction is None else round(fraction * 100.0, 1)
