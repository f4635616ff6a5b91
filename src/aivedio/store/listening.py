"""LISTEN, written once: the worker's wake-ups, the outbox relay's, the API's event streams
and ``aivedio status --follow`` all hold their LISTEN connection through ``run``.

A LISTEN needs a connection of its own (on a pooled one it would follow the connection to
its next borrower), and that connection fails in more ways than a query does: the server
restarts under it, a proxy drops it without a word, asyncpg's protocol is left
mid-operation ("cannot switch to state 15; another operation (2) is in progress"). Each
reader used to write its own loop, each naming the exceptions it expected; one met one it
did not name and took its worker down.

One session (``listen``): connect; LISTEN on every channel; call ``on_listening``: what was
notified before the LISTEN took effect reached nobody, so the caller looks again now (a
worker's lanes claim, a stream re-reads its log); then prove the connection alive with a
``SELECT 1`` every ``keepalive_seconds``, each under a timeout (a connection that hangs is
as lost as one that closed). When it is lost the session raises DatabaseError. It never
returns: ``run`` runs it under ``supervision.supervise``, which reconnects after a backoff,
logs the loop's event, and keeps the loop down in ``/readyz`` until it listens again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn

import anyio

from aivedio.config.load import DatabaseConfig
from aivedio.errors import DatabaseError
from aivedio.store.database import map_db_errors, open_connection
from aivedio.supervision import Loop, supervise

# asyncpg's listener: (connection, server pid, channel, payload).
Listener = Callable[[object, int, str, object], None]

KEEPALIVE_SECONDS = 30.0
KEEPALIVE_TIMEOUT_SECONDS = 10.0


async def listen(
    database: DatabaseConfig,
    channels: Mapping[str, Listener],
    *,
    on_listening: Callable[[], None] | None = None,
    on_stopped: Callable[[], None] | None = None,
    keepalive_seconds: float = KEEPALIVE_SECONDS,
    timeout_seconds: float = KEEPALIVE_TIMEOUT_SECONDS,
) -> NoReturn:
    """One LISTEN session until its connection is lost (then DatabaseError). ``on_stopped``
    runs on every way out after ``on_listening`` did, cancellation included."""
    with map_db_errors(f"listening on {', '.join(channels)}"):
        async with open_connection(database) as conn:
            lost = anyio.Event()

            def on_lost(_conn: object) -> None:
                lost.set()

            conn.add_termination_listener(on_lost)
            for channel, listener in channels.items():
                await conn.add_listener(channel, listener)
            try:
                if on_listening is not None:
                    on_listening()
                while not lost.is_set() and not conn.is_closed():
                    with anyio.move_on_after(keepalive_seconds):
                        await lost.wait()
                    if not lost.is_set() and not conn.is_closed():
                        with anyio.fail_after(timeout_seconds):
                            await conn.execute("SELECT 1")
            finally:
                if on_stopped is not None:
                    on_stopped()
    raise DatabaseError(f"the connection listening on {', '.join(channels)} closed")


async def run(
    loop: Loop,
    database: DatabaseConfig,
    channels: Mapping[str, Listener],
    *,
    on_listening: Callable[[], None] | None = None,
    on_stopped: Callable[[], None] | None = None,
    keepalive_seconds: float = KEEPALIVE_SECONDS,
    timeout_seconds: float = KEEPALIVE_TIMEOUT_SECONDS,
) -> None:
    """LISTEN for ever: each session under ``loop``'s supervision (reconnect with backoff,
    one event per failure, down in readiness until it listens again)."""

    def listening() -> None:
        loop.ok()
        if on_listening is not None:
            on_listening()

    async def session() -> None:
        await listen(
            database,
            channels,
            on_listening=listening,
            on_stopped=on_stopped,
            keepalive_seconds=keepalive_seconds,
            timeout_seconds=timeout_seconds,
        )

    await supervise(loop, session)


class Wakeup:
    """What a LISTEN callback rings and a reader waits on: a notification only wakes the
    reader, which then reads again (a lost one delays, never loses)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def ring(self) -> None:
        self._event.set()

    async def wait(self, seconds: float) -> bool:
        """Whether it rang (since the last wait) within ``seconds``."""
        with anyio.move_on_after(seconds):
            await self._event.wait()
        if not self._event.is_set():
            return False
        self._event = anyio.Event()
        return True
