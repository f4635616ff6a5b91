"""The sweeper's session advisory lock: one pass at a time across the fleet.

The lock is taken on a connection of its own, so the server releases it when that
connection dies with its worker.
"""

from __future__ import annotations

import zlib

from aivedio.store.database import Connection, map_db_errors

LOCK_KEY = zlib.crc32(b"aivedio:sweeper") - 2**31
TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
UNLOCK = "SELECT pg_advisory_unlock($1)"


async def try_sweeper_lock(conn: Connection) -> bool:
    """Take the lock on ``conn`` if nobody holds it; never waits."""
    with map_db_errors("taking the sweeper lock"):
        return bool(await conn.fetchval(TRY_LOCK, LOCK_KEY))


async def release_sweeper_lock(conn: Connection) -> None:
    with map_db_errors("releasing the sweeper lock"):
        await conn.execute(UNLOCK, LOCK_KEY)
