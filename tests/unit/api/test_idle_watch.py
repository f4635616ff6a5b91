"""api/idle_watch.py: one watchdog per request body ends a read that waits ``idle_seconds``
for a byte, and only such a read: chunks that keep coming, or time spent between reads,
never fire it. (The tus PATCH over HTTP: tests/integration/api/test_tus.py.)"""

from __future__ import annotations

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from aivedio.api.idle_watch import IdleWatch, body_timeout

pytestmark = pytest.mark.anyio

# A guard against a hang, far above any idle time below: never part of what is asserted.
HANG_GUARD_SECONDS = 30


class Body:
    """A body whose chunks come from a memory stream; its end is (b"", False)."""

    def __init__(self, receive: MemoryObjectReceiveStream[bytes]) -> None:
        self._receive = receive

    async def readchunk(self) -> tuple[bytes, bool]:
        try:
            return await self._receive.receive(), False
        except anyio.EndOfStream:
            return b"", False

    def close(self) -> None:
        self._receive.close()


async def read_all(watch: IdleWatch, body: Body, pause_seconds: float = 0.0) -> list[bytes]:
    """What a caller does: the watchdog in a task group, reads inside its scope; with
    ``pause_seconds``, a pause outside any read after each chunk (a slow disk write)."""
    got: list[bytes] = []
    async with anyio.create_task_group() as group:
        group.start_soon(watch.watch)
        try:
            with watch.scope:
                while chunk := (await watch.readchunk(body))[0]:
                    got.append(chunk)
                    await anyio.sleep(pause_seconds)
        finally:
            watch.stop()
            body.close()
    return got


async def test_a_body_that_stalls_is_ended_with_what_arrived() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](10)
    watch = IdleWatch(0.05)
    await send.send(b"first")
    with anyio.fail_after(HANG_GUARD_SECONDS):
        got = await read_all(watch, Body(receive))  # the sender never sends again
    assert got == [b"first"]
    assert watch.expired and watch.scope.cancel_called
    assert watch.error.status == 408
    send.close()


async def test_chunks_that_keep_coming_never_fire_it() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](0)
    watch = IdleWatch(5.0)  # a hundred times the gap between chunks

    async def sender() -> None:
        async with send:
            for number in range(20):
                await anyio.sleep(0.01)
                await send.send(b"%d" % number)

    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as group:
            group.start_soon(sender)
            got = await read_all(watch, Body(receive))
    assert len(got) == 20 and not watch.expired and not watch.scope.cancel_called


async def test_time_between_reads_is_not_idle() -> None:
    # Each chunk is there when it is read, but the caller pauses for many idle periods
    # after each one: only a read that waits counts, as with a deadline per read.
    send, receive = anyio.create_memory_object_stream[bytes](10)
    for number in range(3):
        await send.send(b"%d" % number)
    send.close()
    watch = IdleWatch(0.02)
    with anyio.fail_after(HANG_GUARD_SECONDS):
        got = await read_all(watch, Body(receive), pause_seconds=0.2)
    assert got == [b"0", b"1", b"2"] and not watch.expired


async def test_stop_ends_the_watchdog_before_any_read() -> None:
    watch = IdleWatch(3600.0)
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with anyio.create_task_group() as group:
            group.start_soon(watch.watch)
            await anyio.sleep(0)
            watch.stop()
    assert not watch.expired


def test_the_answer_is_arrivings_408() -> None:
    error = body_timeout(1.5)
    assert (error.status, error.code) == (408, "body_timeout")
    assert error.detail == "the upload sent nothing for 1.5 s"
