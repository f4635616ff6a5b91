"""Session advisory locks of this process, held on one connection of their own.

A render holds a lock on its (asset, revision) for as long as it runs, minutes for a long
source: a pooled connection must not be pinned that long (heartbeats and state changes need
the pool), so the locks live on a dedicated session. One session serves every lock of the
process: opening a connection per render cost the worker a connect and TLS/auth handshake
and PostgreSQL a backend process each time.

* ``hold(key)`` answers whether the lock was taken (``pg_try_advisory_lock``: never waits)
  and releases it on exit (``pg_advisory_unlock``, shielded). A session lock is re-entrant
  within its session, so two holders in this process are told apart here: a key already held
  here is refused without asking the server.
* Statements on the session go one at a time (one connection, one statement in flight),
  shielded from the caller's cancellation (a statement cut short would make the session
  unusable, and dropping it drops everyone's locks) and bounded by the statement timeout: a
  database that does not answer in time, a broken connection or a failed unlock drop the
  session; a server's error on a try (the lock not taken) keeps it.
* When the session dies (a database restart), every lock on it is gone, as a per-render
  session's was when it died: the holders run on (what they write is fenced by their leases
  and compare-and-sets, the lock only keeps two renders from doing the same work at once).
  The next ``hold`` opens a new session; a lock of the lost one is not released again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg

from aivedio.config.load import DatabaseConfig
from aivedio.errors import AivedioError, TransientError
from aivedio.logs import get_logger
from aivedio.store.database import Connection, connect, map_db_errors

log = get_logger("aivedio.store.session_locks")

TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
UNLOCK = "SELECT pg_advisory_unlock($1)"


class SessionLocks:
    def __init__(self, database: DatabaseConfig) -> None:
        self._database = database
        self._conn: Connection | None = None
        self._mutex = anyio.Lock()
        self._held: set[int] = set()
        self._closed = False

    @asynccontextmanager
    async def hold(self, key: int) -> AsyncIterator[bool]:
        """Try the lock ``key``; True while held, released on exit. False: someone holds it
        (here or in another process)."""
        if key in self._held:
            yield False
            return
        self._held.add(key)  # claimed here before the await: a second holder sees it
        try:
            acquired, session = await self._statement(TRY_LOCK, key)
        except BaseException:
            self._held.discard(key)
            raise
        if not acquired:
            self._held.discard(key)
            yield False
            return
        try:
            yield True
        finally:
            # Shielded and without a deadline of its own: the statement's timeout bounds
            # it, and a session that does not answer is dropped (the lock with it). Either
            # the lock is released or its session is gone; never left held.
            with anyio.CancelScope(shield=True):
                try:
                    await self._statement(UNLOCK, key, on=session)
                except AivedioError as exc:  # the session is gone, and the lock with it
                    log.warning("session_lock_release_failed", key=key, error=exc.detail)
            self._held.discard(key)

    async def _statement(
        self, sql: str, key: int, *, on: Connection | None = None
    ) -> tuple[bool, Connection | None]:
        """Run ``sql`` on the session: the answer and the session it ran on. ``on``: only on
        that session (an unlock): when it has been replaced or closed since, its locks went
        with it and nothing is sent (no session is opened just to say so)."""
        async with self._mutex:
            if on is not None and (on is not self._conn or on.is_closed()):
                return False, None
            if self._closed:
                raise TransientError("session locks are closed: the worker is stopping")
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self._database, codecs=False)
            conn = self._conn
            # Shielded: a statement cut short by a caller's cancellation would leave the
            # session unusable, and closing it would drop every other holder's lock. Only a
            # database that does not answer in time ends it.
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(self._database.statement_timeout_seconds) as late:
                    with map_db_errors("holding a session lock"):
                        try:
                            return bool(await conn.fetchval(sql, key)), conn
                        except asyncpg.PostgresError:
                            # The server answered with an error: the session works. A
                            # refused lock was not taken; an unlock that failed may have
                            # left one held, so that session goes.
                            if sql == UNLOCK:
                                self._drop(conn)
                            raise
                        except BaseException:  # the connection broke
                            self._drop(conn)
                            raise
            assert late.cancelled_caught
            self._drop(conn)
            raise TransientError("holding a session lock: PostgreSQL did not answer in time")

    def _drop(self, conn: Connection) -> None:
        """The session is unusable: a new one next time (its locks are gone with it)."""
        if not conn.is_closed():
            conn.terminate()
        if self._conn is conn:
            self._conn = None

    async def aclose(self) -> None:
        """Close the session: every lock still on it is released by the server."""
        async with self._mutex:
            self._closed = True
            if self._conn is not None and not self._conn.is_closed():
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await self._conn.close()
            self._conn = None
