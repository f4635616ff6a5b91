"""A fetch worker SIGKILLed mid-upload: the job is reclaimed and completes, nothing is left open."""

from __future__ import annotations

import hashlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from scripts.lib.seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY

from aivedio.config.load import load_config
from aivedio.pipeline.intake import OutputDescriptor, record_provider_output
from aivedio.pipeline.services import url_cipher
from aivedio.sim.provider import Faults, open_simulated_provider
from aivedio.sim.tls import make_test_ca
from aivedio.store.database import Pool
from aivedio.store.queue import Queue
from tests.conftest import TEST_KEY
from tests.support.dns_server import dns_server
from tests.support.processes import WorkerProcess
from tests.support.s3_server import BUCKET, s3_client

pytestmark = pytest.mark.anyio

HOST = "cdn.provider.test"
SIZE = 24 << 20


@pytest.fixture
def nameserver() -> Iterator[str]:
    with dns_server() as (zone, ns):
        zone.set(HOST, ["127.0.0.1"])
        yield ns


def open_uploads(endpoint: str, prefix: str) -> list[dict[str, object]]:
    client = s3_client(endpoint)
    uploads = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix)  # type: ignore[attr-defined]
    return list(uploads.get("Uploads", []))


async def poll(pool: Pool, sql: str, want: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    value: object = None
    while time.monotonic() < deadline:
        value = await pool.fetchval(sql)
        if value == want:
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"{sql!r} is {value!r}, wanted {want!r}")


async def test_sigkill_mid_upload_is_reclaimed_and_leaves_no_open_upload(
    pool: Pool, database: str, tmp_path: Path, s3_endpoint: str, nameserver: str
) -> None:
    _ca, server_ctx, pem = make_test_ca(("localhost", HOST), tmp_path / "ca")
    prefix = f"crash-{time.monotonic_ns()}"
    async with open_simulated_provider(ssl_context=server_ctx, public_host=HOST) as sim:
        # Slow enough that the first worker is killed with parts uploaded and the rest not.
        sim.add_output("task-1", 0, size=SIZE, faults=Faults(drip_bytes_per_second=6 << 20))
        config_path = tmp_path / "worker.toml"
        config_path.write_text(f"""
[database]
url = "{database}"
[storage]
url = "s3://{BUCKET}/{prefix}"
s3_endpoint_url = "{s3_endpoint}"
s3_access_key_id = "{ACCESS_KEY_ID}"
s3_secret_access_key = "{SECRET_ACCESS_KEY}"
[worker]
http_port = 0
lease_seconds = 3
heartbeat_interval_seconds = 1
poll_interval_seconds = 0.2
[net]
allowed_ports = [{sim.port}]
allow_cidrs = ["127.0.0.0/8"]
nameservers = ["{nameserver}"]
ca_file = "{pem}"
[fetch]
part_size_bytes = {5 << 20}
parts_in_flight = 2
[providers.sim]
api_base_url = "{sim.base_url}"
[moderation]
backend = "local"
[moderation.local]
allow_all = true
""")
        config = load_config(config_path, environ={"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY})
        tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
        doc = sim.task_json("task-1")["outputs"][0]
        async with pool.acquire() as conn:
            recorded = await record_provider_output(
                conn,
                queue=Queue(pool),
                cipher=url_cipher(config),
                tenant_id=tenant,
                descriptor=OutputDescriptor(
                    provider="sim",
                    provider_task_id="task-1",
                    url=doc["url"],
                    sha256=doc["sha256"],
                    size=doc["size"],
                ),
            )

        doomed = WorkerProcess(config_path, tmp_path / "doomed.log")
        try:
            deadline = time.monotonic() + 20
            while not open_uploads(s3_endpoint, prefix) and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            await anyio.sleep(1.0)  # a part or two in
            assert open_uploads(s3_endpoint, prefix), "no multipart upload was open"
            doomed.kill()
        finally:
            doomed.stop()
        status = await pool.fetchval("SELECT fetch_status FROM provider_outputs")
        assert status == "FETCHING"

        survivor = WorkerProcess(config_path, tmp_path / "survivor.log")
        try:
            await poll(pool, "SELECT fetch_status FROM provider_outputs", "STORED", 60)
            survivor.signal(signal.SIGTERM)
            assert survivor.wait(20) == 0
        finally:
            survivor.stop()

    row = await pool.fetchrow(
        "SELECT source_object_key, source_sha256, source_size_bytes FROM assets"
    )
    assert row["source_size_bytes"] == SIZE
    assert row["source_sha256"] == doc["sha256"]
    client = s3_client(s3_endpoint)
    body = client.get_object(Bucket=BUCKET, Key=f"{prefix}/{row['source_object_key']}")  # type: ignore[attr-defined]
    assert hashlib.sha256(body["Body"].read()).hexdigest() == doc["sha256"]
    assert open_uploads(s3_endpoint, prefix) == []
    job = await pool.fetchrow(
        "SELECT status, attempts FROM job_history WHERE id = $1", recorded.fetch_job_id
    )
    live = await pool.fetch("SELECT id, kind, status, attempts FROM jobs")
    assert job is not None, [dict(r) for r in live]
    assert (job["status"], job["attempts"]) == ("succeeded", 2)
    assert any(e.get("event") == "fetch_aborted_leftover_upload" for e in survivor.events())
