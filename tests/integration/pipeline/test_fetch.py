"""The fetch stage end to end through the worker: intake, fetch, store, every error class."""

from __future__ import annotations

import hashlib
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anyio
import msgspec
import pytest
from aiohttp import web

from aivedio.config.load import Config, NetConfig, ProviderConfig
from aivedio.errors import AivedioError
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.intake import OutputDescriptor, Recorded, record_provider_output
from aivedio.pipeline.services import open_fetch_stage, url_cipher
from aivedio.sim.provider import Faults, SimulatedProvider, open_simulated_provider
from aivedio.sim.tls import make_test_ca
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Job, Queue
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry
from tests.support.dns_server import dns_server
from tests.support.s3_server import s3_config

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()
HOST = "cdn.provider.test"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    _ca, server_ctx, pem = make_test_ca(("localhost", HOST), tmp_path_factory.mktemp("ca"))
    return server_ctx, pem


@pytest.fixture
def nameserver() -> Iterator[str]:
    with dns_server() as (zone, ns):
        zone.set(HOST, ["127.0.0.1"])
        yield ns


@dataclass
class Rig:
    sim: SimulatedProvider
    config: Config
    pool: Pool
    tenant_id: int

    async def ingest(self, task_id: str, index: int = 0, **fields: Any) -> Recorded:
        url = fields.pop("url", None) or self.sim.signed_url(task_id, index)
        doc = self.sim.task_json(task_id)["outputs"][index]
        descriptor = OutputDescriptor(
            provider="sim",
            provider_task_id=task_id,
            output_index=index,
            url=url,
            expires_at=fields.pop("expires_at", datetime.fromisoformat(doc["expires_at"])),
            sha256=fields.pop("sha256", doc["sha256"]),
            size=fields.pop("size", doc["size"]),
        )
        async with self.pool.acquire() as conn:
            return await record_provider_output(
                conn,
                queue=Queue(self.pool),
                cipher=url_cipher(self.config),
                tenant_id=self.tenant_id,
                descriptor=descriptor,
            )

    async def output(self, recorded: Recorded) -> dict[str, Any]:
        row = await self.pool.fetchrow(
            "SELECT * FROM provider_outputs WHERE id = $1", recorded.provider_output_id
        )
        assert row is not None
        return dict(row.items())

    async def wait_final(self, recorded: Recorded, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = await self.pool.fetchrow(
                "SELECT status FROM job_history WHERE id = $1", recorded.fetch_job_id
            )
            if job is not None:
                return await self.output(recorded)
            await anyio.sleep(0.05)
        raise AssertionError(f"fetch job not finished: {await self.output(recorded)}")


@pytest.fixture
async def rig(
    config: Config,
    pool: Pool,
    ca: tuple[ssl.SSLContext, Path],
    nameserver: str,
    tmp_path: Path,
) -> AsyncIterator[Rig]:
    server_ctx, pem = ca
    async with open_simulated_provider(ssl_context=server_ctx, public_host=HOST) as sim:
        net = NetConfig(
            allowed_ports=[sim.port],
            allow_cidrs=["127.0.0.0/8"],
            nameservers=[nameserver],
            ca_file=str(pem),
            max_bytes=64 << 20,
            idle_read_timeout_seconds=2,
        )
        cfg = msgspec.structs.replace(
            config,
            net=net,
            providers={"sim": ProviderConfig(api_base_url=sim.base_url)},
            storage=msgspec.structs.replace(config.storage, url=f"file://{tmp_path}/objects"),
            queue=msgspec.structs.replace(
                config.queue, backoff_base_seconds=0.05, backoff_max_seconds=0.2
            ),
        )
        tenant_id = await pool.fetchval("INSERT INTO tenants (name) VALUES ('acme') RETURNING id")
        yield Rig(sim, cfg, pool, tenant_id)


@asynccontextmanager
async def running_worker(rig: Rig) -> AsyncIterator[Worker]:
    queue = Queue(rig.pool)
    async with (
        open_fetch_stage(rig.config, rig.pool, queue) as stage,
        anyio.create_task_group() as tg,
    ):
        w = Worker(rig.config, rig.pool, REGISTRY, services={"fetch": stage})
        tg.start_soon(lambda: w.run(install_signal_handlers=False))
        yield w
        w.request_drain(force=True)


@pytest.fixture
async def worker(rig: Rig) -> AsyncIterator[Worker]:
    async with running_worker(rig) as w:
        yield w


async def stored_bytes(rig: Rig, key: str) -> bytes:
    async with open_object_store(rig.config.storage) as store:
        return b"".join([chunk async for chunk in store.get(key)])


async def test_a_provider_output_is_fetched_into_quarantine(rig: Rig, worker: Worker) -> None:
    body = b"\x00\x00\x00\x18ftypmp42" + b"frame" * 50_000
    rig.sim.add_output("task-1", 0, body)
    recorded = await rig.ingest("task-1")
    output = await rig.wait_final(recorded)
    assert output["fetch_status"] == "STORED"
    asset = await rig.pool.fetchrow(
        "SELECT * FROM assets WHERE source_provider_output_id = $1", recorded.provider_output_id
    )
    assert asset is not None
    assert asset["status"] == "QUARANTINED"
    assert asset["source_sha256"] == hashlib.sha256(body).hexdigest()
    key = keys.quarantine_source(rig.tenant_id, recorded.provider_output_id, recorded.fetch_job_id)
    assert asset["source_object_key"] == key
    assert await stored_bytes(rig, key) == body
    # This worker has no media stage: the probe job retries (due retries are promoted at
    # once) and may be dead by now; it was enqueued either way.
    probe = await rig.pool.fetchrow(
        "SELECT kind, payload FROM jobs WHERE kind = 'probe'"
        " UNION ALL SELECT kind, payload FROM job_history WHERE kind = 'probe'"
    )
    assert probe is not None
    assert probe["payload"] == {"asset_id": str(asset["id"])}
    attempts = await rig.pool.fetch("SELECT outcome, sha256 FROM fetch_attempts")
    assert [(a["outcome"], a["sha256"]) for a in attempts] == [
        ("stored", hashlib.sha256(body).hexdigest())
    ]
    task = await rig.pool.fetchrow("SELECT provider_status FROM generation_tasks")
    assert task is not None
    assert task["provider_status"] == "PROVIDER_SUCCEEDED"


async def test_the_url_never_reaches_a_job_payload_or_a_row_in_clear(rig: Rig) -> None:
    rig.sim.add_output("task-1", 0, b"x" * 100)
    recorded = await rig.ingest("task-1")
    url = rig.sim.signed_url("task-1", 0)
    sig = url.split("sig=")[1]
    job = await rig.pool.fetchrow(
        "SELECT payload::text AS p FROM jobs WHERE id = $1", recorded.fetch_job_id
    )
    assert job is not None
    assert sig not in job["p"]
    blob = await rig.pool.fetchval("SELECT source_url_ciphertext FROM provider_outputs")
    assert sig.encode() not in blob


async def test_duplicate_callbacks_give_one_job_one_object_one_asset(
    rig: Rig, worker: Worker
) -> None:
    rig.sim.add_output("task-1", 0, b"clip" * 10_000)
    first = await rig.ingest("task-1")
    again = [await rig.ingest("task-1") for _ in range(3)]
    assert {r.fetch_job_id for r in again} == {first.fetch_job_id}
    assert {r.provider_output_id for r in again} == {first.provider_output_id}
    await rig.wait_final(first)
    late = await rig.ingest("task-1")  # a callback after the fetch finished
    assert not late.job_created
    assert await rig.pool.fetchval("SELECT count(*) FROM assets") == 1
    assert await rig.pool.fetchval("SELECT count(*) FROM provider_outputs") == 1
    assert rig.sim.requests["download"] == 1


async def test_not_ready_404_is_retried_until_ready(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output("task-1", 0, b"late" * 1000, faults=Faults(not_ready_requests=2))
    output = await rig.wait_final(await rig.ingest("task-1"))
    assert output["fetch_status"] == "STORED"
    assert rig.sim.requests["download"] == 3


async def test_expired_url_is_refreshed_never_regenerated(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output("task-1", 0, b"fresh" * 1000)
    stale = rig.sim.signed_url("task-1", 0, ttl_seconds=-60)  # the provider refuses it: 403
    output = await rig.wait_final(
        await rig.ingest("task-1", url=stale, expires_at=datetime.now(UTC) + timedelta(hours=1))
    )
    assert output["fetch_status"] == "STORED"
    assert output["descriptor_version"] == 2
    assert rig.sim.requests["refresh"] == 1


async def test_an_expiry_already_past_refreshes_before_downloading(
    rig: Rig, worker: Worker
) -> None:
    rig.sim.add_output("task-1", 0, b"fresh" * 1000)
    recorded = await rig.ingest(
        "task-1",
        url=rig.sim.signed_url("task-1", 0, ttl_seconds=-60),
        expires_at=datetime.now(UTC) - timedelta(minutes=1),
    )
    output = await rig.wait_final(recorded)
    assert output["fetch_status"] == "STORED"
    assert rig.sim.requests["refresh"] == 1
    assert rig.sim.requests["download"] == 1


async def test_a_gone_output_ends_in_output_lost_with_an_event(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output("task-1", 0, b"x" * 100, faults=Faults(gone=True, expired=True))
    recorded = await rig.ingest("task-1")
    output = await rig.wait_final(recorded)
    assert output["fetch_status"] == "OUTPUT_LOST"
    event = await rig.pool.fetchrow("SELECT event_type, payload FROM outbox_events")
    assert event is not None
    assert event["event_type"] == "output.lost"
    assert event["payload"]["provider_task_id"] == "task-1"
    assert await rig.pool.fetchval("SELECT count(*) FROM assets") == 0


async def test_429_honours_retry_after(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output(
        "task-1", 0, b"x" * 100, faults=Faults(throttle_requests=1, retry_after_seconds=1.5)
    )
    started = time.monotonic()
    output = await rig.wait_final(await rig.ingest("task-1"))
    assert output["fetch_status"] == "STORED"
    assert time.monotonic() - started >= 1.4
    attempts = await rig.pool.fetch(
        "SELECT error_class, http_status FROM fetch_attempts ORDER BY id"
    )
    assert [(a["error_class"], a["http_status"]) for a in attempts] == [
        ("throttled", 429),
        (None, None),
    ]


async def test_5xx_bursts_back_off_and_recover(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output("task-1", 0, b"x" * 100, faults=Faults(error_requests=2))
    output = await rig.wait_final(await rig.ingest("task-1"))
    assert output["fetch_status"] == "STORED"
    assert rig.sim.requests["download"] == 3


async def test_a_wrong_checksum_is_retried_a_little_then_invalid(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output("task-1", 0, b"x" * 100, faults=Faults(advertise_wrong_sha256=True))
    recorded = await rig.ingest("task-1")
    output = await rig.wait_final(recorded)
    assert output["fetch_status"] == "INVALID_RESPONSE"
    assert output["last_error_class"] == "checksum_mismatch"
    job = await rig.pool.fetchrow(
        "SELECT status, attempts FROM job_history WHERE id = $1", recorded.fetch_job_id
    )
    assert job is not None
    assert (job["status"], job["attempts"]) == ("dead", 3)
    # Nothing of the bad body is left in storage.
    async with open_object_store(rig.config.storage) as store:
        assert [o async for o in store.list("quarantine/")] == []


async def test_too_large_is_never_retried(rig: Rig, worker: Worker) -> None:
    rig.sim.add_output("task-1", 0, size=65 << 20)
    recorded = await rig.ingest("task-1")
    output = await rig.wait_final(recorded)
    assert output["fetch_status"] == "INVALID_RESPONSE"
    assert output["last_error_class"] == "too_large"
    assert rig.sim.requests["download"] == 1


async def test_a_stored_object_from_a_lost_attempt_is_reused_not_downloaded(rig: Rig) -> None:
    body = b"already-there" * 1000
    rig.sim.add_output("task-1", 0, body)
    recorded = await rig.ingest("task-1")
    # The previous attempt uploaded the object, then died before its transaction.
    key = keys.quarantine_source(rig.tenant_id, recorded.provider_output_id, recorded.fetch_job_id)
    async with open_object_store(rig.config.storage) as store:
        await store.put_bytes(key, body, content_type="video/mp4")
    async with running_worker(rig):
        output = await rig.wait_final(recorded)
    assert rig.sim.requests["download"] == 0
    assert output["fetch_status"] == "STORED"
    asset = await rig.pool.fetchrow("SELECT source_sha256 FROM assets")
    assert asset is not None
    assert asset["source_sha256"] == hashlib.sha256(body).hexdigest()


async def test_a_run_whose_lease_was_taken_over_cannot_commit(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At-least-once: the first run's lease expires mid-download and a second worker claims
    # the job. Whatever the first run does after that, only the second one's work counts.
    body = b"twice" * 200_000
    rig.sim.add_output("task-1", 0, body, faults=Faults(drip_bytes_per_second=2 << 20))
    # The provider holds the first download after its first chunk until the takeover is done
    # (the client's idle-read timeout raised to 30 s so that a slow host cannot end it first),
    # then sends the rest; the second download is not held.
    rig.config = msgspec.structs.replace(
        rig.config, net=msgspec.structs.replace(rig.config.net, idle_read_timeout_seconds=30)
    )
    mid_download = anyio.Event()
    taken_over = anyio.Event()
    write = SimulatedProvider._write

    async def write_then_hold(resp: web.StreamResponse, data: memoryview, rate: int | None) -> None:
        await write(resp, data, rate)
        if not taken_over.is_set():
            mid_download.set()
            await taken_over.wait()

    monkeypatch.setattr(SimulatedProvider, "_write", staticmethod(write_then_hold))
    recorded = await rig.ingest("task-1")
    queue = Queue(rig.pool)
    (first,) = await queue.claim("fetch", 1, "first", 60)
    outcomes: dict[str, object] = {}
    async with open_fetch_stage(rig.config, rig.pool, queue) as stage:

        async def run(name: str, job: Job) -> None:
            try:
                outcomes[name] = await stage.handle(None, job)  # type: ignore[arg-type]
            except AivedioError as exc:
                outcomes[name] = exc.error_class

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "first", first)
            with anyio.fail_after(10):
                await mid_download.wait()
            assert (await rig.output(recorded))["fetch_status"] == "FETCHING"
            assert "first" not in outcomes  # still downloading
            await rig.pool.execute("UPDATE jobs SET lease_until = now() - interval '1 s'")
            await queue.reap()
            (second,) = await queue.claim("fetch", 1, "second", 60)
            assert second.lease_token == first.lease_token + 1
            assert "first" not in outcomes  # the lease was taken over mid-download
            taken_over.set()
            tg.start_soon(run, "second", second)
    assert outcomes["second"] == {
        "outcome": "stored",
        "asset_id": ANY,
        "bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "resumes": 0,
        "restarts": 0,
    }
    assert outcomes["first"] in ("transient", "lease_lost")
    assert await rig.pool.fetchval("SELECT count(*) FROM assets") == 1
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'probe'") == 1
    assert (await rig.output(recorded))["fetch_status"] == "STORED"
    assert (
        await stored_bytes(
            rig,
            keys.quarantine_source(
                rig.tenant_id, recorded.provider_output_id, recorded.fetch_job_id
            ),
        )
        == body
    )


async def test_a_fresh_url_revives_a_fetch_job_that_gave_up(rig: Rig) -> None:
    rig.config = msgspec.structs.replace(
        rig.config, fetch=msgspec.structs.replace(rig.config.fetch, breaker_failures=1000)
    )
    rig.sim.add_output("task-1", 0, b"late" * 1000, faults=Faults(error_requests=1000))
    recorded = await rig.ingest("task-1")
    async with running_worker(rig):
        output = await rig.wait_final(recorded, timeout=30)
        assert output["fetch_status"] == "RETRY_WAIT"
        job = await rig.pool.fetchrow(
            "SELECT status FROM job_history WHERE id = $1", recorded.fetch_job_id
        )
        assert job is not None
        assert job["status"] == "dead"
        # The provider recovers and calls back with a new URL.
        rig.sim.add_output("task-1", 0, b"late" * 1000)
        again = await rig.ingest("task-1", url=rig.sim.signed_url("task-1", 0, ttl_seconds=7200))
        assert again.fetch_job_id == recorded.fetch_job_id
        deadline = time.monotonic() + 20
        while (await rig.output(recorded))["fetch_status"] != "STORED":
            assert time.monotonic() < deadline, await rig.output(recorded)
            await anyio.sleep(0.05)


# -- a body cut short: resumed into the same upload, or started over in a new one ----------

MIB = 1 << 20


async def _fetch_once(rig: Rig, recorded: Recorded) -> tuple[dict[str, Any], WorkerMetrics]:
    queue = Queue(rig.pool)
    (job,) = await queue.claim("fetch", 1, "w", 60)
    metrics = WorkerMetrics()
    async with open_fetch_stage(rig.config, rig.pool, queue) as stage:
        outcome = await stage.handle(None, job, metrics=metrics)  # type: ignore[arg-type]
    assert outcome is not None
    return outcome, metrics


def _on_s3(rig: Rig, s3_endpoint: str, name: str) -> None:
    storage = s3_config(s3_endpoint, f"{name}-{time.monotonic_ns()}")
    net = msgspec.structs.replace(rig.config.net, resume_backoff_seconds=0)
    fetch = msgspec.structs.replace(rig.config.fetch, part_size_bytes=5 * MIB)
    rig.config = msgspec.structs.replace(rig.config, storage=storage, net=net, fetch=fetch)


async def _no_pending_uploads(rig: Rig) -> None:
    async with open_object_store(rig.config.storage) as store:
        assert await store.list_multipart_uploads(prefix="quarantine/") == []


async def test_a_body_cut_twice_resumes_into_the_same_multipart_upload(
    rig: Rig, s3_endpoint: str
) -> None:
    # 13 MiB in 5 MiB parts, the connection dropped at 4 MiB and again 4 MiB later: one
    # download attempt, three requests, one upload whose parts span the cuts.
    _on_s3(rig, s3_endpoint, "resume")
    faults = Faults(truncate_at_bytes=4 * MIB, truncate_requests=2)
    rig.sim.add_output("task-1", 0, size=13 * MIB, faults=faults)
    recorded = await rig.ingest("task-1")
    outcome, metrics = await _fetch_once(rig, recorded)
    expected = rig.sim.task_json("task-1")["outputs"][0]["sha256"]
    assert outcome == {
        "outcome": "stored",
        "asset_id": ANY,
        "bytes": 13 * MIB,
        "sha256": expected,
        "resumes": 2,
        "restarts": 0,
    }
    assert rig.sim.requests["download"] == 3
    assert [h.get("Range") for h in rig.sim.seen_headers] == [
        None,
        "bytes=4194304-",
        "bytes=8388608-",
    ]
    key = keys.quarantine_source(rig.tenant_id, recorded.provider_output_id, recorded.fetch_job_id)
    assert hashlib.sha256(await stored_bytes(rig, key)).hexdigest() == expected
    await _no_pending_uploads(rig)
    sample = metrics.registry.get_sample_value
    assert sample("aivedio_fetch_resumes_total", {"provider": "sim", "kind": "range"}) == 2
    assert sample("aivedio_fetch_resumes_total", {"provider": "sim", "kind": "restart"}) is None
    attempts = await rig.pool.fetch("SELECT outcome, bytes FROM fetch_attempts")
    assert [(a["outcome"], a["bytes"]) for a in attempts] == [("stored", 13 * MIB)]


async def test_an_origin_that_ignores_range_restarts_the_upload_with_no_part_left(
    rig: Rig, s3_endpoint: str
) -> None:
    # Cut at 7 MiB (one 5 MiB part uploaded, 2 MiB buffered); the resume is answered 200:
    # the first upload is aborted with its part and the body goes into a new one.
    _on_s3(rig, s3_endpoint, "restart")
    faults = Faults(truncate_at_bytes=7 * MIB, truncate_requests=1, ignore_range=True)
    rig.sim.add_output("task-1", 0, size=12 * MIB, faults=faults)
    recorded = await rig.ingest("task-1")
    outcome, metrics = await _fetch_once(rig, recorded)
    expected = rig.sim.task_json("task-1")["outputs"][0]["sha256"]
    assert (outcome["sha256"], outcome["bytes"]) == (expected, 12 * MIB)
    assert (outcome["resumes"], outcome["restarts"]) == (0, 1)
    key = keys.quarantine_source(rig.tenant_id, recorded.provider_output_id, recorded.fetch_job_id)
    assert hashlib.sha256(await stored_bytes(rig, key)).hexdigest() == expected
    await _no_pending_uploads(rig)
    sample = metrics.registry.get_sample_value
    assert sample("aivedio_fetch_resumes_total", {"provider": "sim", "kind": "restart"}) == 1


async def test_a_resumed_body_is_still_checked_against_the_providers_checksum(
    rig: Rig, s3_endpoint: str
) -> None:
    _on_s3(rig, s3_endpoint, "checked")
    faults = Faults(truncate_at_bytes=3 * MIB, truncate_requests=1, advertise_wrong_sha256=True)
    rig.sim.add_output("task-1", 0, size=6 * MIB, faults=faults)
    await rig.ingest("task-1")
    queue = Queue(rig.pool)
    (job,) = await queue.claim("fetch", 1, "w", 60)
    async with open_fetch_stage(rig.config, rig.pool, queue) as stage:
        with pytest.raises(AivedioError) as caught:
            await stage.handle(None, job)  # type: ignore[arg-type]
    assert caught.value.error_class == "checksum_mismatch"
    assert rig.sim.requests["download"] == 2  # resumed, then refused whole
    await _no_pending_uploads(rig)
    async with open_object_store(rig.config.storage) as store:
        assert [o async for o in store.list("quarantine/")] == []
