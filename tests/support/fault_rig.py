"""Faults to inject into the daemons' loops: what a dependency can throw at them.

``FAILURES`` holds one factory per exception class that can plausibly reach a loop while
PostgreSQL restarts, fails over or refuses (asyncpg's own classes, a server error class,
the socket's and the clock's), plus a bare ``Exception`` for the class nobody thought of.
A ``Fault`` wraps a callee (a queue method, ``database.connect``) and raises the armed
failure from it until disarmed, so a test can drive a real worker or API through a failure
and back.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anyio
import asyncpg

# What asyncpg raised in a worker during `pg_ctl restart` (scripts/chaos): a pooled or LISTEN
# connection whose protocol still believed an earlier operation was in progress.
STALE_PROTOCOL = "cannot switch to state 15; another operation (2) is in progress"

FAILURES: dict[str, Callable[[], BaseException]] = {
    "InterfaceError": lambda: asyncpg.InterfaceError("connection is closed"),
    "InternalClientError": lambda: asyncpg.InternalClientError(STALE_PROTOCOL),
    "ConnectionDoesNotExistError": lambda: asyncpg.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    ),
    "PostgresConnectionError": lambda: asyncpg.PostgresConnectionError("connection failure"),
    "TooManyConnectionsError": lambda: asyncpg.TooManyConnectionsError(
        "sorry, too many clients already"
    ),
    # A server error that is neither about the connection nor retryable by its class.
    "DeadlockDetectedError": lambda: asyncpg.DeadlockDetectedError("deadlock detected"),
    "TimeoutError": lambda: TimeoutError(),
    "OSError": lambda: OSError(errno.EHOSTUNREACH, "No route to host"),
    "Exception": lambda: Exception("a class nobody named"),
}


class Fault:
    """Raises the armed failure from every call of the callees it wraps."""

    def __init__(self) -> None:
        self.failure: Callable[[], BaseException] | None = None
        self.raised = 0

    def arm(self, name: str) -> None:
        self.failure = FAILURES[name]

    def disarm(self) -> None:
        self.failure = None

    def check(self) -> None:
        if self.failure is not None:
            self.raised += 1
            raise self.failure()

    def wrap(self, callee: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.check()
            return await callee(*args, **kwargs)

        return wrapped


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, list[str]]:
    async with http.get(url) as resp:
        body = await resp.json()
    return resp.status, list(body.get("reasons", []))


async def until_ready(
    http: aiohttp.ClientSession, url: str, loop: str, *, down: bool, timeout: float = 15.0
) -> list[str]:
    """Poll ``/readyz`` until it names ``loop`` as unable to work (``down``) or is 200; the
    reasons seen last."""
    deadline = time.monotonic() + timeout
    reasons: list[str] = []
    while time.monotonic() < deadline:
        status, reasons = await readyz(http, url)
        named = any(r.startswith(f"{loop} cannot work since ") for r in reasons)
        if (down and status == 503 and named) or (not down and status == 200):
            return reasons
        await anyio.sleep(0.05)
    state = "naming" if down else "ready, not naming"
    raise AssertionError(f"/readyz never became {state} {loop}: {reasons}")


async def until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.02)


def failures_of(logs: list[dict[str, Any]], loop: str, name: str) -> list[dict[str, Any]]:
    """The failure events of ``loop`` whose error class names exception class ``name``."""
    return [
        e
        for e in logs
        if e.get("loop") == loop
        and "error_class" in e
        and e["event"] != "loop_recovered"
        and e["error_class"].split(":")[-1] == name
    ]


async def until_failed(logs: list[dict[str, Any]], loop: str, name: str) -> None:
    """Until ``loop`` logged a failure of class ``name``: two for the bare ``Exception``, a
    streak, so that the once-per-streak traceback rule can be checked."""
    wanted = 2 if name == "Exception" else 1
    await until(lambda: len(failures_of(logs, loop, name)) >= wanted, f"{loop} failing: {name}")
