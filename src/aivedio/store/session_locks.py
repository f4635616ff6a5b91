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
* Statements on the session go one at a time (one connection, one statement in flight).
* When the session dies (a database restart), every lock on it is gone, as a per-render
  session's was when it died: the holders run on (what they write is fenced by their leases
  and compare-and-sets, the lock only keeps two renders from doing the same work at once).
  The next ``hold`` opens a new session; a lock of the lost one is not released again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from aivedio.config import DatabaseConfig
from aivedio.errors import AivedioError, TransientError
from aivedio.logs import get_logger
from aivedio.store.database import Connection, connect, map_db_errors

log = get_logger("aivedio.store.session_locks")

RELEASE_TIMEOUT_SECONDS = 10.0


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
            acquired = bool(await self._fetchval("SELECT pg_try_advisory_lock($1)", key))
        except BaseException:
            self._held.discard(key)
            raise
        if not acquired:
            self._held.discard(key)
            yield False
            return
        session = self._conn
        try:
            yield True
        finally:
            # Released by the session that took it; a session since closed or lost took
            # the lock with it (a new session must not be opened just to say so).
            if session is self._conn and session is not None and not session.is_closed():
                with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_SECONDS):
                    try:
                        await self._fetchval("SELECT pg_advisory_unlock($1)", key)
                    except AivedioError as exc:  # the session is gone, and the lock with it
                        log.warning("session_lock_release_failed", key=key, error=exc.detail)
            self._held.discard(key)

    async def _fetchval(self, sql: str, key: int) -> object:
        async with self._mutex:
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
                            return await conn.fetchval(sql, key)
                        except BaseException:
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
