"""Migrations (twice, concurrently) and state changes as CAS against real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import uuid

import anyio
import asyncpg
import pytest

from aivedio.api.problems import status_for
from aivedio.errors import (
    DatabaseError,
    InvalidValueError,
    Retry,
    StaleStateError,
    TransitionError,
)
from aivedio.states import TRANSITIONS, Entity
from aivedio.store import migrations
from aivedio.store.database import Pool, map_db_errors
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


TIME_COLUMNS = (
    "SELECT c.table_name, c.column_name FROM information_schema.columns c"
    " JOIN information_schema.tables t USING (table_schema, table_name)"
    " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
    " AND c.data_type IN ('timestamp with time zone', 'timestamp without time zone', 'date')"
)


async def test_every_stored_time_has_a_sanity_check(pool: Pool) -> None:
    # A migration adding a time column adds its <table>_<column>_sane CHECK (0016's rule).
    columns = await pool.fetch(TIME_COLUMNS)
    assert len(columns) > 50
    checks = {
        r["conname"]
        for r in await pool.fetch("SELECT conname FROM pg_constraint WHERE contype = 'c'")
    }
    missing = [
        f"{r['table_name']}.{r['column_name']}"
        for r in columns
        if f"{r['table_name']}_{r['column_name']}_sane" not in checks
    ]
    assert missing == []


@pytest.mark.parametrize(
    "value", ["-infinity", "infinity", "0001-01-01 00:00:00+00", "9999-12-31 23:59:59+00"]
)
async def test_no_path_can_store_an_infinite_or_absurd_time(pool: Pool, value: str) -> None:
    tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
    async with pool.acquire() as conn:
        with (
            pytest.raises(InvalidValueError, match="check constraint"),
            map_db_errors("storing a callback receipt"),
        ):
            await conn.execute(
                "INSERT INTO callback_receipts (provider, event_id, received_at)"
                " VALUES ('p', 'e', $1::text::timestamptz)",
                value,
            )
        with pytest.raises(InvalidValueError), map_db_errors("updating a tenant"):
            await conn.execute(
                "UPDATE tenants SET created_at = $2::text::timestamptz WHERE id = $1", tenant, value
            )


async def test_a_refused_value_is_an_error_of_the_input_never_an_outage(pool: Pool) -> None:
    # A NUL in text was answered 503 "database": a retry of what can never succeed.
    error = None
    async with pool.acquire() as conn:
        try:
            with map_db_errors("recording a receipt"):
                await conn.execute(
                    "INSERT INTO callback_receipts (provider, event_id) VALUES ('p', $1)", "a\x00b"
                )
        except DatabaseError as exc:
            error = exc
    assert isinstance(error, InvalidValueError)
    assert error.retry is Retry.NEVER and status_for(error) == 400
    # A value the driver cannot even encode is the input's fault too.
    async with pool.acquire() as conn:
        with pytest.raises(InvalidValueError), map_db_errors("storing a size"):
            await conn.execute("SELECT $1::bigint", 2**64)


async def test_a_refused_value_names_the_constraint_but_never_shows_the_row(pool: Pool) -> None:
    # The detail of a 400 goes back to the client: PostgreSQL's DETAIL ("Failing row
    # contains (…)") is the whole row, every column of it.
    await pool.execute("INSERT INTO tenants (name) VALUES ('row-secret-name')")
    async with pool.acquire() as conn:
        with pytest.raises(InvalidValueError) as caught, map_db_errors("renaming a tenant"):
            await conn.execute(
                "UPDATE tenants SET created_at = '0001-01-01 00:00:00+00'"
                " WHERE name = 'row-secret-name'"
            )
    assert "tenants_created_at_sane" in caught.value.detail
    assert "Failing row" not in caught.value.detail
    assert "row-secret-name" not in caught.value.detail


async def test_upgrading_a_database_holding_infinite_times_clamps_them(
    empty_database: str,
) -> None:
    conn = await asyncpg.connect(empty_database)
    try:
        await conn.execute(migrations.CREATE_TABLE)
        for migration in migrations.available():
            if migration.version >= 16:
                break
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
        # What the old edge let in: a signed callback's "0001-01-01T00:00:00Z" as -infinity.
        tenant = await conn.fetchval(
            "INSERT INTO tenants (name, created_at) VALUES ('t', 'infinity') RETURNING id"
        )
        task = uuid.uuid4()
        await conn.execute(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status, updated_at) VALUES ($1, $2, 'p', 't', 'PROVIDER_SUCCEEDED',"
            " '0001-01-01 00:00:00+00')",
            task,
            tenant,
        )
        await conn.execute(
            "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
            " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
            " source_url_expires_at, fetch_status) VALUES ($1, $2, $3, 'p', 't', 0, '\\x00',"
            " 'k', '-infinity', 'FETCH_PENDING')",
            uuid.uuid4(),
            tenant,
            task,
        )
        applied = await migrations.migrate(conn)
        assert [m.version for m in applied][:1] == [16]  # then any later ones
        row = await conn.fetchrow(
            "SELECT (SELECT created_at FROM tenants)::text AS tenant,"
            " (SELECT updated_at FROM generation_tasks)::text AS task,"
            " (SELECT source_url_expires_at FROM provider_outputs)::text AS expiry"
        )
        assert row is not None
        assert row["expiry"].startswith("1970-01-01 00:00:00")
        assert row["task"].startswith("1970-01-01 00:00:00")
        assert row["tenant"].startswith("2499-12-31 00:00:00")
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE provider_outputs SET source_url_expires_at = '-infinity'")
    finally:
        await conn.close()
