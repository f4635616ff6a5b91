"""Migrations (twice, concurrently) and state changes as CAS against real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import uuid

import anyio
import asyncpg
import pytest

from aivedio.errors import StaleStateError, TransitionError
from aivedio.states import TRANSITIONS, Entity
from aivedio.store import migrations
from aivedio.store.database import Pool
from aivedio.store.records import transition
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.anyio


async def test_migrate_twice_applies_once(empty_database: str) -> None:
    conn = await asyncpg.connect(empty_database)
    try:
        first = await migrations.migrate(conn)
        second = await migrations.migrate(conn)
        assert [m.version for m in first] == [m.version for m in migrations.available()]
        assert second == []
        assert await migrations.pending(conn) == []
    finally:
        await conn.close()


async def test_concurrent_migrations_apply_each_file_once(empty_database: str) -> None:
    results: list[list[int]] = []

    async def run() -> None:
        conn = await asyncpg.connect(empty_database)
        try:
            results.append([m.version for m in await migrations.migrate(conn)])
        finally:
            await conn.close()

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(run)
    applied = sorted(v for r in results for v in r)
    assert applied == [m.version for m in migrations.available()]


def test_two_migrate_processes_at_once_both_succeed(empty_database: str) -> None:
    env = {
        "AIVEDIO_DATABASE_URL": empty_database,
        "AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY,
        "PATH": "/usr/bin:/bin",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "aivedio", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
    check = subprocess.run(
        ["psql", empty_database, "-Atc", "SELECT count(*) FROM schema_migrations"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(check.stdout) == len(migrations.available())


async def _seed(pool: Pool) -> dict[Entity, tuple[object, ...]]:
    """One record of each entity, so transitions have something to act on."""
    tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
    task, output, asset, variant = (uuid.uuid4() for _ in range(4))
    await pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status) VALUES ($1, $2, 'sim', 'pt-1', 'SUBMITTED')",
        task,
        tenant,
    )
    await pool.execute(
        "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
        " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
        " fetch_status) VALUES ($1, $2, $3, 'sim', 'pt-1', 0, '\\x00', 'k1', 'DISCOVERED')",
        output,
        tenant,
        task,
    )
    await pool.execute(
        "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id, status)"
        " VALUES ($1, $2, 'PROVIDER_OUTPUT', $3, 'QUARANTINED')",
        asset,
        tenant,
        output,
    )
    await pool.execute(
        "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status)"
        " VALUES ($1, 1, 1, 'BUILDING')",
        asset,
    )
    await pool.execute(
        "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
        " mime_type, size_bytes, checksum_alg, checksum, status)"
        " VALUES ($1, $2, 1, 'PLAYBACK_MP4', 'k', 'video/mp4', 1, 'sha256', 'x', 'PENDING')",
        variant,
        asset,
    )
    # A piece with its object recorded, so that forcing it DONE meets the table's CHECK.
    await pool.execute(
        "INSERT INTO media_pieces (asset_id, revision, piece, status, object_key, size_bytes,"
        " sha256) VALUES ($1, 1, 'video:360p:0000', 'PENDING', 'k', 1, 'x')",
        asset,
    )
    return {
        Entity.GENERATION_TASK: (task,),
        Entity.PROVIDER_OUTPUT: (output,),
        Entity.ASSET: (asset,),
        Entity.REVISION: (asset, 1),
        Entity.VARIANT: (asset, 1, "PLAYBACK_MP4"),
        Entity.PIECE: (asset, 1, "video:360p:0000"),
    }


async def _force_state(pool: Pool, entity: Entity, key: tuple[object, ...], state: str) -> None:
    from aivedio.states import TABLES

    table, column, key_columns = TABLES[entity]
    where = " AND ".join(f"{c} = ${i + 2}" for i, c in enumerate(key_columns))
    await pool.execute(f"UPDATE {table} SET {column} = $1 WHERE {where}", state, *key)


async def test_every_transition_is_enforced_against_the_database(pool: Pool) -> None:
    keys = await _seed(pool)
    for entity, table in TRANSITIONS.items():
        for current in table:
            for new in table:
                await _force_state(pool, entity, keys[entity], current)
                async with pool.acquire() as conn:
                    if new in table[current]:
                        await transition(conn, entity, keys[entity], expected=current, new=new)
                    else:
                        with pytest.raises(TransitionError):
                            await transition(conn, entity, keys[entity], expected=current, new=new)


async def test_cas_refuses_a_stale_state_or_version(pool: Pool) -> None:
    keys = await _seed(pool)
    key = keys[Entity.PROVIDER_OUTPUT]
    async with pool.acquire() as conn:
        version = await transition(
            conn, Entity.PROVIDER_OUTPUT, key, expected="DISCOVERED", new="FETCH_PENDING", version=1
        )
        assert version == 2
        # A late duplicate of the same event expects the old state: refused, not applied.
        with pytest.raises(StaleStateError):
            await transition(
                conn,
                Entity.PROVIDER_OUTPUT,
                key,
                expected="DISCOVERED",
                new="FETCH_PENDING",
                version=1,
            )
        # Right state, stale version: refused too.
        with pytest.raises(StaleStateError):
            await transition(
                conn,
                Entity.PROVIDER_OUTPUT,
                key,
                expected="FETCH_PENDING",
                new="FETCHING",
                version=1,
            )
        assert (
            await transition(
                conn,
                Entity.PROVIDER_OUTPUT,
                key,
                expected="FETCH_PENDING",
                new="FETCHING",
                version=2,
            )
            == 3
        )
    assert await pool.fetchval("SELECT fetch_status FROM provider_outputs") == "FETCHING"
