"""One idle deadline for a whole request body, instead of one per chunk.

``arriving`` (``video_sessions.py``) gives each read of the body a deadline of its own
(``anyio.fail_after``): a cancel scope set up and torn down, and a timer scheduled and
cancelled, for every chunk aiohttp hands over (about 4,000 per GiB). On a tus ``PATCH`` of
a large file that was about 6% of the event loop's time. ``IdleWatch`` keeps the same rule,
"no byte for ``idle_seconds`` while waiting for one ends the body", with one watchdog task
per request: a read only notes when it started waiting and that it stopped, and the
watchdog sleeps until the current wait would reach ``idle_seconds``, then looks again.

What counts as idle is unchanged: only the time spent waiting for the body. Time spent
elsewhere between reads (the caller handing a batch to a slow disk, renewing a lease) is
not, as it was not with a deadline per read.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio

from aivedio.api.problems import ApiError


class ChunkReader(Protocol):
    """What ``IdleWatch`` reads (aiohttp's ``StreamReader``)."""

    async def readchunk(self) -> tuple[bytes, bool]: ...


def body_timeout(idle_seconds: float) -> ApiError:
    """The answer to a body that stopped arriving (``arriving``'s, word for word)."""
    return ApiError(408, f"the upload sent nothing for {idle_seconds:g} s", "body_timeout")


class IdleWatch:
    """Reads of one body, cancelled when one of them waits ``idle_seconds``.

    Use: start ``watch`` in a task group, read with ``readchunk`` inside ``with
    self.scope``, and call ``stop`` when done reading. When the watchdog fired, ``expired``
    is true and the scope was cancelled (the read in progress ends there); ``error`` is the
    408 to raise or report."""

    def __init__(self, idle_seconds: float) -> None:
        self.idle_seconds = idle_seconds
        self.scope = anyio.CancelScope()
        self.expired = False
        self._waiting_since: float | None = None
        self._stopped = anyio.CancelScope()

    @property
    def error(self) -> ApiError:
        return body_timeout(self.idle_seconds)

    async def readchunk(self, content: ChunkReader) -> tuple[bytes, bool]:
        """``content.readchunk()``, its wait watched."""
        self._waiting_since = time.monotonic()
        try:
            return await content.readchunk()
        finally:
            self._waiting_since = None

    async def watch(self) -> None:
        """The watchdog: sleeps until the current wait (if any) would reach ``idle_seconds``
        and cancels ``scope`` if that wait is still going on; returns once it fired or
        ``stop`` was called."""
        idle = self.idle_seconds
        with self._stopped:
            while True:
                since = self._waiting_since
                if since is None:
                    await anyio.sleep(idle)  # a wait starting now ends no sooner than this
                    continue
                left = since + idle - time.monotonic()
                if left > 0:
                    await anyio.sleep(left)  # then look again: that wait may have ended
                    continue
                self.expired = True
                self.scope.cancel()
                return

    def stop(self) -> None:
        """End the watchdog (the body was read, or reading it failed)."""
        self._stopped.cancel()
