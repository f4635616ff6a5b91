"""Session advisory locks on one shared session: taken, refused (here and elsewhere),
released, and a lost session replaced without a holder noticing more than a warning."""

from __future__ import annotations

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.errors import TransientError
from aivedio.store.database import Pool
from aivedio.store.session_locks import SessionLocks

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

KEY = 424242


async def held_elsewhere(pool: Pool, key: int) -> bool:
    """Whether another session is refused ``key`` (taking it, then giving it back)."""
    async with pool.acquire() as conn:
        got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
        if got:
            await conn.fetchval("SELECT pg_advisory_unlock($1)", key)
        return not got


async def test_a_lock_is_held_once_and_released_on_exit(config: Config, pool: Pool) -> None:
    locks = SessionLocks(config.database)
    try:
        async with locks.hold(KEY) as first:
            assert first
            assert await held_elsewhere(pool, KEY)
            # The same session would take it again (re-entrant): refused here instead.
            async with locks.hold(KEY) as second:
                assert not second
            async with locks.hold(KEY + 1) as other:  # another key, the same session
                assert other
            assert await held_elsewhere(pool, KEY)  # the refused holder released nothing
        assert not await held_elsewhere(pool, KEY)
        async with locks.hold(KEY) as again:
            assert again
    finally:
        await locks.aclose()
    assert not await held_elsewhere(pool, KEY)


async def test_a_lock_held_by_another_session_is_refused(config: Config, pool: Pool) -> None:
    locks = SessionLocks(config.database)
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", KEY)
        try:
            async with locks.hold(KEY) as got:
                assert not got
        finally:
            await conn.fetchval("SELECT pg_advisory_unlock($1)", KEY)
    async with locks.hold(KEY) as got:
        assert got
    await locks.aclose()


async def test_one_session_serves_many_holders_at_once(config: Config, pool: Pool) -> None:
    locks = SessionLocks(config.database)
    # Client sessions of this database alone: autovacuum and other tests' databases come
    # and go on their own.
    sessions = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND datname = current_database()"
    )
    before = await pool.fetchval(sessions)
    results: list[bool] = []

    async def render(key: int) -> None:
        async with locks.hold(key) as got:
            results.append(got)
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        for key in range(20):
            tg.start_soon(render, KEY + key)
    assert results == [True] * 20
    assert await pool.fetchval(sessions) <= before + 1
    await locks.aclose()


async def test_a_lost_session_is_replaced(config: Config, pool: Pool) -> None:
    locks = SessionLocks(config.database)
    async with locks.hold(KEY) as got:
        assert got
        # The database ends the session (a restart, an operator): the lock goes with it.
        killed = await pool.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_locks"
            " WHERE locktype = 'advisory' AND objid = $1 AND pid <> pg_backend_pid()",
            KEY,
        )
        assert killed
        for _ in range(100):
            if not await held_elsewhere(pool, KEY):
                break
            await anyio.sleep(0.05)
        assert not await held_elsewhere(pool, KEY)
    # The release found the session gone (a warning); the next hold opens a new one.
    async with locks.hold(KEY + 7) as got:
        assert got
        assert await held_elsewhere(pool, KEY + 7)
    await locks.aclose()


async def test_close_releases_what_is_still_held(config: Config, pool: Pool) -> None:
    locks = SessionLocks(config.database)
    holding = anyio.Event()
    stop = anyio.Event()

    async def holder() -> None:
        async with locks.hold(KEY) as got:
            assert got
            holding.set()
            await stop.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await holding.wait()
        await locks.aclose()  # a worker shutting down with a render still running
        assert not await held_elsewhere(pool, KEY)
        stop.set()
    with pytest.raises(TransientError, match="closed"):
        async with locks.hold(KEY):
            pass
