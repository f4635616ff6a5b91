"""Callback replay protection against real PostgreSQL: an event id is accepted once."""

from __future__ import annotations

import anyio
import pytest

from aivedio.pipeline.callbacks import accept_event_once
from aivedio.store.database import Pool

pytestmark = pytest.mark.anyio


async def test_first_delivery_is_accepted_and_a_replay_is_not(pool: Pool) -> None:
    async with pool.acquire() as conn:
        assert await accept_event_once(conn, "sim", "evt_1") is True
        assert await accept_event_once(conn, "sim", "evt_1") is False
        assert await accept_event_once(conn, "sim", "evt_1") is False
    count = await pool.fetchval(
        "SELECT count(*) FROM callback_receipts WHERE provider = 'sim' AND event_id = 'evt_1'"
    )
    assert count == 1


async def test_same_event_id_from_another_provider_is_accepted(pool: Pool) -> None:
    async with pool.acquire() as conn:
        assert await accept_event_once(conn, "sim", "evt_1") is True
        assert await accept_event_once(conn, "other", "evt_1") is True
        assert await accept_event_once(conn, "other", "evt_1") is False


async def test_distinct_event_ids_are_each_accepted(pool: Pool) -> None:
    async with pool.acquire() as conn:
        results = [await accept_event_once(conn, "sim", f"evt_{n}") for n in range(5)]
    assert results == [True] * 5


async def test_receipt_rolls_back_with_the_callers_transaction(pool: Pool) -> None:
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        assert await accept_event_once(conn, "sim", "evt_rollback") is True
        await tx.rollback()
        assert await accept_event_once(conn, "sim", "evt_rollback") is True


async def test_concurrent_duplicates_accept_exactly_one(pool: Pool) -> None:
    results: list[bool] = []

    async def deliver() -> None:
        async with pool.acquire() as conn:
            results.append(await accept_event_once(conn, "sim", "evt_race"))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(deliver)
    assert sorted(results) == [False] * 5 + [True]
