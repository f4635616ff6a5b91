"""Whose task a callback names (``intake.task_tenant``), against real PostgreSQL: a known
task keeps its tenant, an unknown one takes its provider's, a missing tenant is the
operator's error naming it."""

from __future__ import annotations

import msgspec
import pytest

from aivedio.config.load import Config, ProviderConfig
from aivedio.errors import NotFoundError
from aivedio.pipeline.intake import Received, receive, task_tenant
from aivedio.store.database import Pool
from aivedio.store.tenants import create_tenant

pytestmark = pytest.mark.anyio


def _with_providers(config: Config, **providers: ProviderConfig) -> Config:
    return msgspec.structs.replace(config, providers=providers)


async def test_known_task_keeps_its_tenant_and_unknown_takes_the_providers(
    pool: Pool, config: Config
) -> None:
    cfg = _with_providers(
        config,
        sim=ProviderConfig(tenant="acme"),
        orphan=ProviderConfig(),
    )
    async with pool.acquire() as conn:
        acme, _ = await create_tenant(conn, "acme")
        other, _ = await create_tenant(conn, "other")
        await conn.execute(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status) VALUES (gen_random_uuid(), $1, 'sim', 't-known', 'SUBMITTED')",
            other,
        )
        assert await task_tenant(conn, cfg, "sim", "t-known") == (other, True)
        assert await task_tenant(conn, cfg, "sim", "t-new") == (acme, False)
        assert await task_tenant(conn, cfg, "orphan", "t-new") == (None, False)
        assert await task_tenant(conn, cfg, "unconfigured", "t-new") == (None, False)


async def test_a_provider_naming_a_missing_tenant_is_an_error_naming_it(
    pool: Pool, config: Config
) -> None:
    cfg = _with_providers(config, sim=ProviderConfig(tenant="nobody"))
    async with pool.acquire() as conn:
        with pytest.raises(NotFoundError, match="unknown tenant 'nobody'"):
            await task_tenant(conn, cfg, "sim", "t-new")


async def test_receive_records_the_event_once_with_the_tenant_lookup(
    pool: Pool, config: Config
) -> None:
    cfg = _with_providers(config, sim=ProviderConfig(tenant="acme"))
    async with pool.acquire() as conn:
        acme, _ = await create_tenant(conn, "acme")
        assert await receive(conn, cfg, "sim", "t-new", "ev-1") == Received(True, acme, False)
        # The same event again (a replay), and another provider's event of the same id.
        assert await receive(conn, cfg, "sim", "t-new", "ev-1") == Received(False, acme, False)
        assert await receive(conn, cfg, "other", "t-new", "ev-1") == Received(True, None, False)
        # No event id: nothing recorded, always fresh.
        assert await receive(conn, cfg, "sim", "t-new", None) == Received(True, acme, False)
        rows = await conn.fetch("SELECT provider, event_id FROM callback_receipts ORDER BY 1")
    assert [tuple(r) for r in rows] == [("other", "ev-1"), ("sim", "ev-1")]
