"""Per-host concurrency that backs off on 429, and a per-provider circuit breaker.

A provider that answers 429 is telling the fleet to slow down; retrying later is not enough
if every worker keeps the same number of connections open. ``HostLimiter`` halves a host's
concurrency on each 429 (down to 1) and grows it back by one per success (AIMD). The
``CircuitBreaker`` opens after ``failures`` consecutive 5xx or connection failures and fails
fast for ``open_seconds``, then lets one probe through (half-open): a provider outage costs
one request per window instead of one per queued job. Both are per process, with an
injectable clock so the tests need no sleeping.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio


class HostLimiter:
    def __init__(self, max_per_host: int) -> None:
        self.max_per_host = max_per_host
        self._limit: dict[str, int] = {}
        self._active: dict[str, int] = {}
        self._changed: dict[str, anyio.Event] = {}

    def limit(self, host: str) -> int:
        return self._limit.get(host, self.max_per_host)

    def throttled(self, host: str) -> None:
        self._limit[host] = max(1, self.limit(host) // 2)

    def succeeded(self, host: str) -> None:
        self._limit[host] = min(self.max_per_host, self.limit(host) + 1)
        self._wake(host)

    def _wake(self, host: str) -> None:
        event = self._changed.pop(host, None)
        if event is not None:
            event.set()

    @asynccontextmanager
    async def slot(self, host: str) -> AsyncIterator[None]:
        while self._active.get(host, 0) >= self.limit(host):
            event = self._changed.setdefault(host, anyio.Event())
            await event.wait()
        self._active[host] = self._active.get(host, 0) + 1
        try:
            yield
        finally:
            self._active[host] -= 1
            self._wake(host)


class CircuitBreaker:
    def __init__(
        self, failures: int, open_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.open_seconds = open_seconds
        self._clock = clock
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False

    def acquire(self) -> float:
        """0 when this request may go, else seconds to wait. After the open window, exactly one
        caller gets through (the half-open probe) until it reports success or failure."""
        wait = self.blocked_for()
        if wait > 0:
            return wait
        if self._opened_at is None:
            return 0.0
        if self._probing:
            return max(1.0, self.open_seconds / 10)
        self._probing = True
        return 0.0

    def blocked_for(self) -> float:
        """Seconds left while open; 0 when a request may go (closed or half-open)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self._opened_at + self.open_seconds - self._clock())

    def success(self) -> None:
        self._consecutive = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> None:
        self._consecutive += 1
        self._probing = False
        if self._consecutive >= self.failures:
            self._opened_at = self._clock()
