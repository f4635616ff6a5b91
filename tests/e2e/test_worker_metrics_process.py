"""``aivedio worker`` as a process, storing into S3 (each engine): its /metrics counts the
provider's responses by status, times the stored transfer, and meters the store it opened."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families
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
from tests.support.s3_server import BUCKET

pytestmark = pytest.mark.anyio

HOST = "cdn.provider.test"
SIZE = 12 << 20  # three 5 MiB parts


@pytest.fixture
def nameserver() -> Iterator[str]:
    with dns_server() as (zone, ns):
        zone.set(HOST, ["127.0.0.1"])
        yield ns


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_worker_process_exports_fetch_and_object_store_metrics(
    pool: Pool, database: str, tmp_path: Path, s3_endpoint: str, nameserver: str
) -> None:
    _ca, server_ctx, pem = make_test_ca(("localhost", HOST), tmp_path / "ca")
    prefix = f"metrics-{time.monotonic_ns()}"
    async with open_simulated_provider(ssl_context=server_ctx, public_host=HOST) as sim:
        sim.add_output(
            "task-1", 0, size=SIZE, faults=Faults(throttle_requests=1, retry_after_seconds=0.1)
        )
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
poll_interval_seconds = 0.2
[worker.lanes.fetch]
slots = 2
[worker.lanes.control]
slots = 2
[queue]
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2
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
[sweeper]
periodic = false
""")
        config = load_config(config_path, environ={"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY})
        tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
        doc = sim.task_json("task-1")["outputs"][0]
        async with pool.acquire() as conn:
            await record_provider_output(
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
        worker = WorkerProcess(config_path, tmp_path / "worker.log")
        try:
            deadline = time.monotonic() + 60
            status = None
            while time.monotonic() < deadline:
                status = await pool.fetchval("SELECT fetch_status FROM provider_outputs")
                if status == "STORED":
                    break
                await anyio.sleep(0.1)
            assert status == "STORED", worker.log_path.read_text()[-2000:]
            samples = scrape(worker.port)
            worker.signal(signal.SIGTERM)
            assert worker.wait(20) == 0
        finally:
            worker.stop()

    def value(name: str, **labels: str) -> float:
        return samples.get((name, frozenset(labels.items())), 0.0)

    assert value("aivedio_fetch_responses_total", provider="sim", status="429") == 1
    assert value("aivedio_fetch_responses_total", provider="sim", status="200") == 1
    assert value("aivedio_fetch_duration_seconds_count", provider="sim") == 1
    assert value("aivedio_fetch_duration_seconds_sum", provider="sim") > 0
    requests = "aivedio_object_store_requests_total"
    assert value(requests, operation="start_upload", outcome="ok") == 2
    assert value(requests, operation="abort_upload", outcome="ok") == 1  # the 429 attempt
    assert value(requests, operation="complete_upload", outcome="ok") == 1
    assert value(requests, operation="write", outcome="ok") > 0
    assert value(requests, operation="head", outcome="ok") >= 3  # before each attempt, after
    assert value("aivedio_object_store_bytes_total", direction="upload") == SIZE
    # This machine lets ffmpeg have its own network namespace (unshare -n): said at start.
    assert value("aivedio_sandbox_network_isolated", mode="auto") == 1
