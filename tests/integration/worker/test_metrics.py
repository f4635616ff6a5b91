"""The operator's metrics on a worker's /metrics, scraped over HTTP after real work: fetch
durations and responses by provider, object store calls and bytes, the oldest running job,
and the media real-time factor on both plan paths."""

from __future__ import annotations

import dataclasses
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aivedio.config.load import Config, NetConfig, ProviderConfig
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.intake import OutputDescriptor, Recorded, record_provider_output
from aivedio.pipeline.jobs import Contract, JobContext, Registry
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.services import open_fetch_stage, open_fetch_store, url_cipher
from aivedio.sim.provider import Faults, SimulatedProvider, open_simulated_provider
from aivedio.sim.tls import make_test_ca
from aivedio.store.database import Pool
from aivedio.store.objects.metered import MeteredObjectStore
from aivedio.store.queue import Job, Queue
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry
from tests.support.dns_server import dns_server
from tests.support.media_fixtures import MediaCache, counted_av, h264_faststart
from tests.support.pipeline_rig import Rig, make_rig, running_worker

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()
HOST = "cdn.provider.test"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(worker: Worker) -> Samples:
    """Every sample of the worker's /metrics, by name and labels."""
    while worker.http_port is None:
        await anyio.sleep(0.01)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{worker.http_port}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# -- fetch and object store -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    _ca, server_ctx, pem = make_test_ca(("localhost", HOST), tmp_path_factory.mktemp("ca"))
    return server_ctx, pem


@pytest.fixture
def nameserver() -> Iterator[str]:
    with dns_server() as (zone, ns):
        zone.set(HOST, ["127.0.0.1"])
        yield ns


@asynccontextmanager
async def provider(
    config: Config, ca: tuple[ssl.SSLContext, Path], nameserver: str, tmp_path: Path
) -> AsyncIterator[tuple[SimulatedProvider, Config]]:
    server_ctx, pem = ca
    async with open_simulated_provider(ssl_context=server_ctx, public_host=HOST) as sim:
        cfg = msgspec.structs.replace(
            config,
            net=NetConfig(
                allowed_ports=[sim.port],
                allow_cidrs=["127.0.0.0/8"],
                nameservers=[nameserver],
                ca_file=str(pem),
                idle_read_timeout_seconds=2,
            ),
            providers={"sim": ProviderConfig(api_base_url=sim.base_url)},
            storage=msgspec.structs.replace(config.storage, url=f"file://{tmp_path}/objects"),
            queue=msgspec.structs.replace(
                config.queue, backoff_base_seconds=0.05, backoff_max_seconds=0.2
            ),
        )
        yield sim, cfg


async def ingest(
    sim: SimulatedProvider,
    config: Config,
    pool: Pool,
    tenant_id: int,
    task_id: str,
    url: str | None = None,
) -> Recorded:
    doc = sim.task_json(task_id)["outputs"][0]
    descriptor = OutputDescriptor(
        provider="sim",
        provider_task_id=task_id,
        output_index=0,
        url=url or sim.signed_url(task_id, 0),
        expires_at=datetime.fromisoformat(doc["expires_at"]),
        sha256=doc["sha256"],
        size=doc["size"],
    )
    async with pool.acquire() as conn:
        return await record_provider_output(
            conn,
            queue=Queue(pool),
            cipher=url_cipher(config),
            tenant_id=tenant_id,
            descriptor=descriptor,
        )


@asynccontextmanager
async def fetch_worker(config: Config, pool: Pool) -> AsyncIterator[Worker]:
    """Wired as ``aivedio worker`` wires it: the store it opens, metered on its metrics."""
    metrics = WorkerMetrics()
    async with (
        open_fetch_store(config) as opened,
        open_fetch_stage(
            config, pool, Queue(pool), MeteredObjectStore(opened, metrics.store)
        ) as stage,
        anyio.create_task_group() as tg,
    ):
        worker = Worker(config, pool, REGISTRY, services={"fetch": stage}, metrics=metrics)
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        try:
            yield worker
        finally:
            worker.request_drain(force=True)


async def wait_value(pool: Pool, sql: str, *args: object, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await pool.fetchval(sql, *args)
        if found:
            return found
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {sql} {args}")


async def test_fetches_count_responses_by_provider_and_status_and_time_stored_transfers(
    config: Config,
    pool: Pool,
    ca: tuple[ssl.SSLContext, Path],
    nameserver: str,
    tmp_path: Path,
) -> None:
    async with provider(config, ca, nameserver, tmp_path) as (sim, cfg):
        tenant_id = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
        bodies = {"plain": b"a" * 300_000, "throttled": b"b" * 200_000, "busy": b"c" * 100_000}
        sim.add_output("plain", 0, bodies["plain"])
        sim.add_output(
            "throttled",
            0,
            bodies["throttled"],
            faults=Faults(throttle_requests=1, retry_after_seconds=0.05),
        )
        sim.add_output("busy", 0, bodies["busy"], faults=Faults(error_requests=1))
        sim.add_output("blocked", 0, b"d" * 1000)
        for task in bodies:
            await ingest(sim, cfg, pool, tenant_id, task)
        # A port outside [net] allowed_ports: refused by policy before any request.
        blocked_url = sim.signed_url("blocked", 0).replace(f":{sim.port}/", ":8443/")
        await ingest(sim, cfg, pool, tenant_id, "blocked", url=blocked_url)
        async with fetch_worker(cfg, pool) as worker:
            await wait_value(
                pool,
                "SELECT count(*) = 4 FROM provider_outputs"
                " WHERE fetch_status IN ('STORED', 'INVALID_RESPONSE')",
            )
            samples = await scrape(worker)
        rows = await pool.fetch("SELECT provider_task_id, fetch_status FROM provider_outputs")
        statuses = {row["provider_task_id"]: row["fetch_status"] for row in rows}
    assert statuses == {
        "plain": "STORED",
        "throttled": "STORED",
        "busy": "STORED",
        "blocked": "INVALID_RESPONSE",
    }

    responses = "aivedio_fetch_responses_total"
    assert value(samples, responses, provider="sim", status="200") == 3
    assert value(samples, responses, provider="sim", status="429") == 1
    assert value(samples, responses, provider="sim", status="503") == 1
    assert value(samples, responses, provider="sim", status="none") == 1
    # Only transfers that stored their bytes are timed.
    assert value(samples, "aivedio_fetch_duration_seconds_count", provider="sim") == 3
    total = value(samples, "aivedio_fetch_duration_seconds_sum", provider="sim")
    assert 0 < total < 30
    assert value(samples, "aivedio_fetch_duration_seconds_bucket", provider="sim", le="+Inf") == 3

    requests = "aivedio_object_store_requests_total"
    assert value(samples, requests, operation="complete_upload", outcome="ok") == 3
    # Each attempt that failed on the provider's side aborted its upload: 429, 503, policy.
    assert value(samples, requests, operation="abort_upload", outcome="ok") == 3
    assert value(samples, requests, operation="start_upload", outcome="ok") == 6
    assert value(samples, requests, operation="write", outcome="ok") > 0
    failed = {
        k: v for k, v in samples.items() if k[0] == requests and ("outcome", "ok") not in k[1]
    }
    assert failed == {}
    uploaded = value(samples, "aivedio_object_store_bytes_total", direction="upload")
    assert uploaded == sum(len(b) for b in bodies.values())


# -- the oldest running job -------------------------------------------------------------------


async def test_the_oldest_running_job_age_is_read_at_scrape_time(
    config: Config, pool: Pool
) -> None:
    started, release = anyio.Event(), anyio.Event()

    async def hold(_ctx: JobContext, _job: Job) -> None:
        started.set()
        await release.wait()

    async def quick(_ctx: JobContext, _job: Job) -> None:
        return None

    registry = Registry()
    registry.bind(Contract("t.hold", "control", 300.0, 8), hold)
    registry.bind(Contract("t.quick", "control", 300.0, 8), quick)
    async with pool.acquire() as conn:
        held = (await Queue(pool).enqueue_one(conn, registry.spec("t.hold", "held"))).job_id
    worker = Worker(config, pool, registry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        with anyio.fail_after(15):
            await started.wait()
        await anyio.sleep(0.6)
        first = await scrape(worker)
        await anyio.sleep(0.4)
        second = await scrape(worker)
        release.set()
        await wait_value(pool, "SELECT count(*) FROM job_history WHERE id = $1", held)
        after = await scrape(worker)
        worker.request_drain(force=True)
    age = "aivedio_jobs_running_oldest_age_seconds"
    assert 0.6 <= value(first, age, kind="t.hold") < 10
    assert value(second, age, kind="t.hold") >= value(first, age, kind="t.hold") + 0.4
    # A kind this worker runs but is not running shows 0, as does the held one once done.
    assert (age, frozenset({("kind", "t.quick")})) in first
    assert value(first, age, kind="t.quick") == 0
    assert (age, frozenset({("kind", "t.hold")})) in after
    assert value(after, age, kind="t.hold") == 0


# -- media real-time factor -------------------------------------------------------------------


@pytest.fixture(scope="module")
def media_cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("media"))


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


async def published(rig: Rig, source: Path, timeout: float = 180) -> tuple[Samples, Plan, int]:
    """Run ``source`` to a final state; the worker's samples, the plan, the renders run."""
    async with running_worker(rig) as worker:
        asset_id = await rig.quarantine(source.read_bytes())
        await rig.enqueue_probe(asset_id)
        await rig.wait(
            "SELECT status IN ('PLAYABLE', 'ENRICHED', 'PROCESSING_FAILED') FROM assets"
            " WHERE id = $1",
            asset_id,
            timeout=timeout,
        )
        await rig.wait_idle(asset_id, timeout=timeout)
        samples = await scrape(worker)
    asset = await rig.asset(asset_id)
    assert asset["status"] in ("PLAYABLE", "ENRICHED"), asset["last_error_detail"]
    plan = msgspec.convert((await rig.revisions(asset_id))[0]["plan"], Plan)
    # Every run that made outputs from the source: the renders, and the probe job that
    # made the required set itself (the fast path), and then the enrichment (inline).
    renders = await rig.pool.fetchval(
        "SELECT count(*) + count(*) FILTER (WHERE kind = 'probe'"
        " AND result->>'enrichment' = 'inline') FROM job_history WHERE status = 'succeeded'"
        " AND payload->>'asset_id' = $1 AND ((kind = 'render'"
        " AND result->>'outcome' = 'rendered') OR (kind = 'probe'"
        " AND (result->>'fast_path')::boolean))",
        str(asset_id),
    )
    return samples, plan, renders


async def test_a_single_pass_render_adds_its_tool_seconds_and_the_source_seconds(
    rig: Rig, media_cache: MediaCache
) -> None:
    source = media_cache.get("h264", h264_faststart, width=320, height=240, seconds=2)
    samples, plan, renders = await published(rig, source)
    assert plan.path == "single_pass"
    assert renders >= 1
    labels = {"path": "single_pass", "mode": plan.mode}
    processing = value(samples, "aivedio_media_processing_seconds_total", **labels)
    covered = value(samples, "aivedio_media_source_seconds_total", **labels)
    assert covered == pytest.approx(renders * plan.duration_seconds)
    assert 0 < processing < 120
    other = {"path": "chunked", "mode": plan.mode}
    assert value(samples, "aivedio_media_source_seconds_total", **other) == 0


@pytest.mark.timeout(400)
async def test_chunk_pieces_add_their_spans_on_the_chunked_path(
    rig: Rig, media_cache: MediaCache
) -> None:
    media = msgspec.structs.replace(
        rig.config.media,
        chunk_threshold_seconds=8.0,
        chunk_seconds=4.0,
        x264_preset="ultrafast",
    )
    rig = dataclasses.replace(rig, config=msgspec.structs.replace(rig.config, media=media))
    source = media_cache.get("counted_12", counted_av, seconds=12, fps=24, keyint=24)
    samples, plan, renders = await published(rig, source, timeout=300)
    assert plan.path == "chunked" and plan.mode == "transcode"
    assert plan.chunking is not None
    chunking = plan.chunking
    assert len([rung for rung in plan.rungs if not rung.copy]) >= 2
    spans = chunking.grid_end - chunking.grid_starts[0]
    # Each chunk is encoded once for all its rungs (one process, one decode, as a render
    # counts its source once for all the rungs it makes): the encodes cover the chunk grid
    # once; the audio piece, and each render of the outputs made from the source, cover the
    # whole duration.
    expected = spans + (1 + renders) * plan.duration_seconds
    labels = {"path": "chunked", "mode": "transcode"}
    covered = value(samples, "aivedio_media_source_seconds_total", **labels)
    assert covered == pytest.approx(expected)
    assert value(samples, "aivedio_media_processing_seconds_total", **labels) > 0
    assert (
        value(samples, "aivedio_media_source_seconds_total", path="single_pass", mode="transcode")
        == 0
    )
