"""``aivedio tenants create`` and ``aivedio ingest`` as subprocesses against real PostgreSQL.

Ingest records a provider output as a verified callback would: the signed URL is encrypted
at rest, the fetch job carries ids only, and running it again changes nothing.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.crypto import UrlCipher
from aivedio.store.database import Pool
from aivedio.store.tenants import create_tenant
from tests.conftest import TEST_KEY

pytestmark = pytest.mark.anyio

URL = "https://cdn.provider.test/files/T/0?exp=1900000000&sig=SECRET"


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        (line,) = self.stdout.splitlines()
        return json.loads(line)


async def aivedio(database: str, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(AIVEDIO_DATABASE_URL=database, AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY)
    with anyio.fail_after(60):
        proc = await anyio.run_process(
            [sys.executable, "-m", "aivedio", *args], check=False, env=env
        )
    run = Run(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert "SECRET" not in run.stdout + run.stderr
    return run


async def ingest(database: str, *extra: str, tenant: str = "acme") -> Run:
    base = ["ingest", "--provider", "sim", "--task-id", "T", "--url", URL, "--tenant", tenant]
    return await aivedio(database, *base, *extra)


async def acme(pool: Pool) -> None:
    """The tenant "acme", made as ``aivedio tenants create acme`` makes it (its own run of
    the command, a process start of a second or two, is test_tenant_create_is_idempotent's)."""
    async with pool.acquire() as conn:
        _, created = await create_tenant(conn, "acme")
    assert created


async def test_tenant_create_is_idempotent(database: str, pool: Pool) -> None:
    first = await aivedio(database, "tenants", "create", "acme")
    assert first.code == 0, first.stderr
    created = first.json()
    assert created["tenant"] == "acme"
    assert created["created"] is True
    again = await aivedio(database, "tenants", "create", "acme")
    assert again.code == 0, again.stderr
    assert again.json() == {"tenant": "acme", "id": created["id"], "created": False}
    assert await pool.fetchval("SELECT count(*) FROM tenants WHERE name = 'acme'") == 1


async def test_ingest_records_the_output_and_enqueues_its_fetch(database: str, pool: Pool) -> None:
    await acme(pool)
    run = await ingest(database)
    assert run.code == 0, run.stderr
    recorded = run.json()
    assert recorded["output_created"] is True
    assert recorded["job_created"] is True
    assert recorded["fetch_status"] == "FETCH_PENDING"
    output_id = uuid.UUID(recorded["provider_output_id"])
    job = await pool.fetchrow(
        "SELECT kind, payload::text AS payload, idempotency_key FROM jobs WHERE id = $1",
        recorded["fetch_job_id"],
    )
    assert job is not None
    assert job["kind"] == "fetch"
    assert json.loads(job["payload"]) == {"provider_output_id": str(output_id)}
    assert job["idempotency_key"] == f"fetch:{output_id}:v1"


async def test_ingest_twice_returns_the_same_ids_and_creates_nothing(
    database: str, pool: Pool
) -> None:
    await acme(pool)
    first = (await ingest(database)).json()
    second_run = await ingest(database)
    assert second_run.code == 0, second_run.stderr
    second = second_run.json()
    for key in ("generation_task_id", "provider_output_id", "fetch_job_id"):
        assert second[key] == first[key]
    assert (second["output_created"], second["job_created"]) == (False, False)
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 1
    assert await pool.fetchval("SELECT count(*) FROM provider_outputs") == 1


async def test_signed_url_is_stored_only_encrypted(database: str, pool: Pool) -> None:
    await acme(pool)
    recorded = (await ingest(database)).json()
    payloads = await pool.fetch("SELECT payload::text AS p FROM jobs")
    assert payloads and all("SECRET" not in row["p"] for row in payloads)
    row = await pool.fetchrow(
        "SELECT source_url_ciphertext AS blob, source_url_key_id AS key_id"
        " FROM provider_outputs WHERE id = $1",
        uuid.UUID(recorded["provider_output_id"]),
    )
    assert row is not None
    blob = bytes(row["blob"])
    assert b"SECRET" not in blob and b"cdn.provider.test" not in blob
    cipher = UrlCipher.from_base64("k1", TEST_KEY)
    bound = recorded["provider_output_id"]
    assert cipher.decrypt(blob, row["key_id"], bound_to=bound) == URL


async def test_unknown_tenant_fails_naming_it(database: str, pool: Pool) -> None:
    run = await ingest(database, tenant="nobody-here")
    assert run.code == 1
    assert run.stdout == ""
    assert "nobody-here" in run.stderr
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert await pool.fetchval("SELECT count(*) FROM generation_tasks") == 0


@pytest.mark.parametrize(
    "value",
    [
        "tomorrow",
        "2030-13-01T00:00:00Z",
        "2030-01-01T00:00:00",
        # Outside [now - 400 days, now + 400 days]: 0001-01-01 was stored as -infinity.
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-01:00",
        "2000-01-01T00:00:00Z",
    ],
)
async def test_bad_expires_at_is_bad_usage(database: str, pool: Pool, value: str) -> None:
    await acme(pool)
    run = await ingest(database, "--expires-at", value)
    assert run.code == 2
    assert run.stdout == ""
    assert "--expires-at" in run.stderr
    assert await pool.fetchval("SELECT count(*) FROM provider_outputs") == 0


async def test_expires_at_is_stored_on_the_output_and_the_job(database: str, pool: Pool) -> None:
    await acme(pool)
    expected = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    run = await ingest(database, "--expires-at", expected.isoformat())
    assert run.code == 0, run.stderr
    recorded = run.json()
    output_expiry = await pool.fetchval(
        "SELECT source_url_expires_at FROM provider_outputs WHERE id = $1",
        uuid.UUID(recorded["provider_output_id"]),
    )
    job_expiry = await pool.fetchval(
        "SELECT expires_at FROM jobs WHERE id = $1", recorded["fetch_job_id"]
    )
    assert output_expiry == expected
    assert job_expiry == expected


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--size", str(2**62)), "--size"),
        (("--size", "-1"), "--size"),
        (("--output-index", "70000"), "--output-index"),
        (("--sha256", "abc"), "--sha256"),
    ],
)
async def test_an_out_of_range_output_field_is_bad_usage_naming_its_flag(
    database: str, pool: Pool, flags: tuple[str, str], named: str
) -> None:
    # --size 2^62 overflowed the claim order (a traceback) before sizes were bounded.
    await acme(pool)
    run = await ingest(database, *flags)
    assert (run.code, run.stdout) == (2, ""), run.stderr
    assert named in run.stderr and "Traceback" not in run.stderr
    assert await pool.fetchval("SELECT count(*) FROM provider_outputs") == 0


async def test_an_output_of_a_provider_whose_api_was_shut_down_is_refused(
    database: str, pool: Pool, tmp_path: Path
) -> None:
    # The provider "sim" is configured with the openai adapter: its Videos API shut down on
    # 2026-09-24, so it has no new outputs to take.
    await acme(pool)
    config = tmp_path / "aivedio.toml"
    config.write_text('[providers.sim]\nadapter = "openai"\napi_key = "k"\n', encoding="utf-8")
    run = await ingest(database, "--config", str(config))
    assert run.code == 2, run.stderr
    assert run.stdout == ""
    assert "provider_shut_down" in run.stderr and "2026-09-24" in run.stderr
    assert await pool.fetchval("SELECT count(*) FROM provider_outputs") == 0
