"""Callback replay protection against real PostgreSQL: an event id is accepted once."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.pipeline.intake import receive
from aivedio.store.database import Connection, Pool

pytestmark = pytest.mark.anyio


@pytest.fixture
def accept_event_once(config: Config) -> object:
    """The receipt as a callback records it (``intake.receive``): True for a new event."""

    async def accept(conn: Connection, provider: str, event_id: str) -> bool:
        return (await receive(conn, config, provider, "t-1", event_id)).fresh

    return accept


async def test_first_delivery_is_accepted_and_a_replay_is_not(
    pool: Pool, accept_event_once: Any
) -> None:
    async with pool.acquire() as conn:
        assert await accept_event_once(conn, "sim", "evt_1") is True
        assert await accept_event_once(conn, "sim", "evt_1") is False
        assert await accept_event_once(conn, "sim", "evt_1") is False
    count = await pool.fetchval(
        "SELECT count(*) FROM callback_receipts WHERE provider = 'sim' AND event_id = 'evt_1'"
    )
    assert count == 1


async def test_same_event_id_from_another_provider_is_accepted(
    pool: Pool, accept_event_once: Any
) -> None:
    async with pool.acquire() as conn:
        assert await accept_event_once(conn, "sim", "evt_1") is True
        assert await accept_event_once(conn, "other", "evt_1") is True
        assert await accept_event_once(conn, "other", "evt_1") is False


async def test_distinct_event_ids_are_each_accepted(pool: Pool, accept_event_once: Any) -> None:
    async with pool.acquire() as conn:
        results = [await accept_event_once(conn, "sim", f"evt_{n}") for n in range(5)]
    assert results == [True] * 5


async def test_receipt_rolls_back_with_the_callers_transaction(
    pool: Pool, accept_event_once: Any
) -> None:
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        assert await accept_event_once(conn, "sim", "evt_rollback") is True
        await tx.rollback()
        assert await accept_event_once(conn, "sim", "evt_rollback") is True


async def test_concurrent_duplicates_accept_exactly_one(pool: Pool, accept_event_once: Any) -> None:
    results: list[bool] = []

    async def deliver() -> None:
        async with pool.acquire() as conn:
            results.append(await accept_event_once(conn, "sim", "evt_race"))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(deliver)
    assert sorted(results) == [False] * 5 + [True]
