"""Degradation under backlog (degrade before falling over), over real PostgreSQL, the local
object store and real ffmpeg: the pressure read from rows, optional outputs deferred and
published later by enrichment, new uploads refused with Retry-After, the fetch lane ahead of
the media lane, and poison media quarantined after two crashes."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest

from aivedio.config.backlog import BacklogConfig
from aivedio.config.load import Config
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.upkeep.backlog import MEDIA_OLDEST, NEAR_EXPIRY, BacklogMonitor, read_signals
from aivedio.pipeline.upkeep.sweep_report import SweepReport
from aivedio.pipeline.upkeep.sweep_stuck_assets import StuckAssets
from aivedio.store.database import Pool
from aivedio.store.queue import JobSpec, Queue
from aivedio.worker.daemon import Worker
from tests.support.api_rig import open_api
from tests.support.media_fixtures import MediaCache, h264_faststart
from tests.support.pipeline_rig import REGISTRY, Rig, make_rig, running_worker

pytestmark = pytest.mark.anyio

OPTIONAL = {"hls", "proxy", "sprite", "waveform", "keyframes"}
REQUIRED = {"playback", "poster"}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    cache = MediaCache(tmp_path_factory.mktemp("media"))
    return cache.get("h264", h264_faststart, width=320, height=240, seconds=2).read_bytes()


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


def with_backlog(config: Config, **settings: Any) -> Config:
    base = {
        "check_interval_seconds": 0.1,
        "defer_seconds": 0.3,
        "media_oldest_job_seconds": 0.0,
        "near_expiry_outputs": 1,
    }
    base.update(settings)
    return msgspec.structs.replace(config, backlog=BacklogConfig(**base))


async def tenant(pool: Pool, name: str = "acme") -> int:
    return int(
        await pool.fetchval(
            "INSERT INTO tenants (name) VALUES ($1) ON CONFLICT (name) DO UPDATE"
            " SET name = excluded.name RETURNING id",
            name,
        )
    )


async def output(
    pool: Pool, tenant_id: int, *, status: str = "FETCH_PENDING", expires_in: float = 60.0
) -> uuid.UUID:
    """A provider output in ``status`` whose URL expires ``expires_in`` seconds from now."""
    task, out = uuid.uuid4(), uuid.uuid4()
    await pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status) VALUES ($1, $2, 'sim', $3, 'PROVIDER_SUCCEEDED')",
        task,
        tenant_id,
        f"t-{task.hex[:8]}",
    )
    await pool.execute(
        "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
        " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
        " source_url_expires_at, fetch_status) VALUES ($1, $2, $3, 'sim', $4, 0, '\\x00',"
        " 'k1', now() + make_interval(secs => $5), $6)",
        out,
        tenant_id,
        task,
        f"t-{task.hex[:8]}",
        expires_in,
        status,
    )
    return out


async def clear_expiry_pressure(pool: Pool) -> None:
    await pool.execute("UPDATE provider_outputs SET fetch_status = 'STORED'")


async def metrics_text(port: int | None) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        return await resp.text()


async def eventually(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            assert value, "condition never held"
            return value
        await anyio.sleep(0.1)


# -- the pressure, from rows --------------------------------------------------------------------


async def test_pressure_is_computed_from_the_queue_and_the_outputs(
    config: Config, pool: Pool
) -> None:
    tenant_id = await tenant(pool)
    assert await read_signals(pool, 900) == (0.0, 0)
    queue = Queue(pool)
    async with pool.acquire() as conn:
        for key, lane in (("old-media", "media"), ("old-fetch", "fetch"), ("new-media", "media")):
            await queue.enqueue_one(conn, JobSpec(kind="diag.noop", lane=lane, idempotency_key=key))
    # Queued 400 s ago in the media lane; the fetch lane's older job does not count, nor
    # does a waiting (not yet due) media job.
    await pool.execute(
        "UPDATE jobs SET run_after = now() - interval '400 s' WHERE idempotency_key = 'old-media'"
    )
    await pool.execute(
        "UPDATE jobs SET run_after = now() - interval '900 s' WHERE idempotency_key = 'old-fetch'"
    )
    await pool.execute(
        "INSERT INTO jobs (id, kind, lane, idempotency_key, status, sort_at, run_after,"
        " max_attempts, timeout_seconds) VALUES (nextval('jobs_id_seq'), 'diag.noop', 'media',"
        " 'waiting-media', 'waiting', now(), now() - interval '2 h', 3, 60)"
    )
    # Near expiry: only unstored outputs whose URL expires within the window, not yet expired.
    await output(pool, tenant_id, expires_in=60)
    await output(pool, tenant_id, status="RETRY_WAIT", expires_in=600)
    await output(pool, tenant_id, status="STORED", expires_in=60)
    await output(pool, tenant_id, expires_in=-10)
    await output(pool, tenant_id, expires_in=7200)
    oldest, near = await read_signals(pool, 900)
    assert 399 <= oldest < 460
    assert near == 2

    metrics = WorkerMetrics()
    cfg = BacklogConfig(
        media_oldest_job_seconds=300, near_expiry_outputs=3, check_interval_seconds=60
    )
    monitor = BacklogMonitor(cfg, pool, metrics.backlog)
    reading = await monitor.current()
    assert reading.active == {MEDIA_OLDEST} and monitor.pressure
    text = metrics.render().decode()
    assert 'aivedio_backlog_pressure{signal="media_oldest_job"} 1.0' in text
    assert 'aivedio_backlog_pressure{signal="outputs_near_expiry"} 0.0' in text
    assert 'aivedio_backlog_pressure{signal="any"} 1.0' in text
    assert "aivedio_outputs_near_expiry 2.0" in text
    assert "aivedio_media_oldest_job_age_seconds 4" in text  # 4xx seconds
    # Cached: a new row changes nothing until the interval passes.
    await output(pool, tenant_id, expires_in=30)
    assert (await monitor.current()).near_expiry == 2
    assert (await monitor.refresh()).active == {MEDIA_OLDEST, NEAR_EXPIRY}
    # Hysteresis: on at the threshold, off only below clear_ratio of it (0.5 x 300 s).
    await pool.execute(
        "UPDATE jobs SET run_after = now() - interval '200 s' WHERE idempotency_key = 'old-media'"
    )
    await clear_expiry_pressure(pool)
    assert (await monitor.refresh()).active == {MEDIA_OLDEST}
    await pool.execute(
        "UPDATE jobs SET run_after = now() - interval '100 s' WHERE idempotency_key = 'old-media'"
    )
    assert not (await monitor.refresh()).pressure
    assert 'aivedio_backlog_pressure{signal="any"} 0.0' in metrics.render().decode()


# -- optional outputs deferred, published later ---------------------------------------------------


async def test_under_pressure_only_the_required_set_is_made_then_enrichment_after(
    rig: Rig, source: bytes
) -> None:
    rig.config = with_backlog(rig.config)
    await output(rig.pool, rig.tenant_id)  # one output near URL expiry: pressure
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig) as worker:
        await rig.wait(
            "SELECT 1 FROM assets WHERE id = $1 AND status = 'PLAYABLE'", asset_id, timeout=120
        )

        async def optional_jobs_deferred() -> bool:
            rows = await rig.pool.fetch(
                "SELECT payload->>'variant_type' AS output, last_error_class FROM jobs"
                " WHERE payload->>'asset_id' = $1 AND kind = 'render'",
                str(asset_id),
            )
            # One job waits for them all (its first run renders every pending output), not
            # one per output: a long backlog costs one job's looks per revision.
            return (
                len(rows) == 1
                and rows[0]["output"] in OPTIONAL
                and rows[0]["last_error_class"] == "backlog_deferred"
            )

        await eventually(optional_jobs_deferred, timeout=60)
        await anyio.sleep(1.0)  # several deferral rounds: still nothing optional made
        variants = await rig.variants(asset_id)
        assert {n for n, v in variants.items() if v["status"] == "SUCCEEDED"} == REQUIRED
        assert all(
            variants[n]["status"] == "PENDING" and variants[n]["deferred_at"] for n in OPTIONAL
        )
        assert (await rig.asset(asset_id))["status"] == "PLAYABLE"
        # The sweeper's stuck-enrichment scan leaves deferred work alone, however late.
        stuck = StuckAssets(rig.config.sweeper, pool=rig.pool, queue=Queue(rig.pool))
        report = SweepReport()
        await stuck.stuck(report, datetime.now(UTC) + timedelta(days=2))
        assert report.stuck_assets == []
        text = await metrics_text(worker.http_port)
        for name in OPTIONAL:
            assert f'aivedio_outputs_deferred_total{{output="{name}"}} 1.0' in text
        assert 'aivedio_backlog_pressure{signal="outputs_near_expiry"} 1.0' in text
        assert "aivedio_outputs_near_expiry 1.0" in text
        # The pressure clears: the deferred outputs are made and released by enrichment.
        await clear_expiry_pressure(rig.pool)
        await rig.wait(
            "SELECT 1 FROM assets WHERE id = $1 AND status = 'ENRICHED'", asset_id, timeout=120
        )
        await rig.wait_idle(asset_id, timeout=120)
        text = await metrics_text(worker.http_port)
        assert 'aivedio_backlog_pressure{signal="any"} 0.0' in text
    variants = await rig.variants(asset_id)
    assert all(v["status"] == "SUCCEEDED" for v in variants.values())
    releases = await rig.pool.fetch(
        "SELECT revision, outputs FROM releases WHERE asset_id = $1 ORDER BY revision", asset_id
    )
    assert [sorted(r["outputs"]) for r in releases] == [
        sorted(REQUIRED),
        sorted(REQUIRED | OPTIONAL),
    ]
    rendered = await rig.pool.fetch(
        "SELECT result FROM job_history WHERE payload->>'asset_id' = $1 AND kind = 'render'"
        " AND result->>'outcome' = 'rendered'",
        str(asset_id),
    )
    # The required set made by the probe job (the fast path) under pressure, then every
    # deferred output together in one DAG run.
    assert [sorted(r["result"]["done"]) for r in rendered] == [sorted(OPTIONAL)]
    probe = await rig.pool.fetchval(
        "SELECT result FROM job_history WHERE payload->>'asset_id' = $1 AND kind = 'probe'",
        str(asset_id),
    )
    assert sorted(probe["made"]) == sorted(REQUIRED)


# -- uploads refused ---------------------------------------------------------------------------


async def test_new_uploads_are_refused_with_retry_after_under_pressure(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    cfg = with_backlog(config, retry_after_seconds=17)
    body = {"size_bytes": 10, "sha256": hashlib.sha256(b"0123456789").hexdigest()}
    async with open_api(cfg, pool, tmp_path) as api:
        await api.json("POST", "/v1/videos", json=body, expect=201)
        await output(pool, api.rig.tenant_id)
        await anyio.sleep(0.2)  # past the cached reading
        async with api.http.post(api.base + "/v1/videos", json=body, headers=api.auth()) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "17"
            error = (await resp.json())["error"]
        assert error["code"] == "overloaded"
        assert "near URL expiry" in error["detail"]
        async with api.http.get(api.base + "/metrics") as resp:
            text = await resp.text()
        assert "aivedio_uploads_refused_total 1.0" in text
        assert 'aivedio_backlog_pressure{signal="any"} 1.0' in text
        await clear_expiry_pressure(pool)
        await anyio.sleep(0.2)
        await api.json("POST", "/v1/videos", json=body, expect=201)


# -- the fetch lane first ----------------------------------------------------------------------


async def test_outputs_near_expiry_shrink_the_media_lane_and_grow_the_fetch_lane(
    config: Config, pool: Pool
) -> None:
    cfg = with_backlog(
        config, media_slots_under_expiry_pressure=1, fetch_extra_slots_under_expiry_pressure=4
    )
    tenant_id = await tenant(pool)
    await output(pool, tenant_id)
    queue = Queue(pool)
    async with pool.acquire() as conn:
        specs = [
            JobSpec(
                kind="diag.sleep",
                lane=lane,
                idempotency_key=f"{lane}-{i}",
                payload={"seconds": 0.6},
            )
            for lane, n in (("media", 4), ("fetch", 8))
            for i in range(n)
        ]
        await queue.enqueue(conn, specs)
    peak = {"media": 0, "fetch": 0}

    worker = Worker(cfg, pool, REGISTRY)

    async def sample_until_done() -> None:
        # Slots in use as the worker counts them (the database may still show a job as
        # running while its acknowledgement is being batched).
        while await pool.fetchval("SELECT count(*) FROM jobs WHERE lane IN ('media', 'fetch')"):
            for lane in peak:
                peak[lane] = max(peak[lane], worker._lanes[lane].busy)
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        with anyio.fail_after(30):
            await sample_until_done()
        text = await metrics_text(worker.http_port)
        # Pressure gone: the media lane has its two slots again.
        await clear_expiry_pressure(pool)
        async with pool.acquire() as conn:
            await queue.enqueue(
                conn,
                [
                    JobSpec(
                        kind="diag.sleep",
                        lane="media",
                        idempotency_key=f"after-{i}",
                        payload={"seconds": 0.6},
                    )
                    for i in range(4)
                ],
            )
        after = {"media": 0, "fetch": 0}
        peak, before = after, peak
        with anyio.fail_after(30):
            await sample_until_done()
        worker.request_drain(force=True)
    assert before["media"] == 1  # one media slot while outputs near expiry wait
    assert before["fetch"] > 4  # more than its 4 configured slots (4 + 4)
    assert peak["media"] == 2
    assert 'aivedio_lane_slot_limit{lane="media"} 1.0' in text
    assert 'aivedio_lane_slot_limit{lane="fetch"} 8.0' in text


# -- poison media --------------------------------------------------------------------------------


def crashing_ffmpeg(tmp_path: Path) -> tuple[Path, Path]:
    """An "ffmpeg" that logs its call and dies of SIGSEGV, as a decoder crashing on its input."""
    log = tmp_path / "ffmpeg-calls.log"
    script = tmp_path / "crashing-ffmpeg"
    script.write_text(f"#!/bin/sh\necho called >> {log}\nkill -SEGV $$\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script, log


def calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


async def test_a_source_crashing_the_decoder_twice_is_quarantined_with_no_third_attempt(
    rig: Rig, source: bytes, tmp_path: Path
) -> None:
    script, log = crashing_ffmpeg(tmp_path)
    # The probe uses ffprobe only (no decode check, no fast path), so the source is planned;
    # every render then crashes. (The fast path's crashes: test_fast_path.)
    media = msgspec.structs.replace(
        rig.config.media, ffmpeg=str(script), decode_check="none", fast_path=False
    )
    rig.config = msgspec.structs.replace(
        with_backlog(rig.config, near_expiry_outputs=0), media=media
    )
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig) as worker:
        await rig.wait(
            "SELECT 1 FROM assets WHERE id = $1 AND status = 'PROCESSING_FAILED'", asset_id
        )
        await rig.wait_idle(asset_id, timeout=120)
        made = calls(log)
        await anyio.sleep(1.0)
        assert calls(log) == made  # nothing runs ffmpeg on it any more
        text = await metrics_text(worker.http_port)
    assert 'aivedio_poison_quarantined_total{kind="render"} 1.0' in text
    asset = await rig.asset(asset_id)
    assert asset["last_error_class"] == "poison_media"
    assert "crashed its media jobs 2 times" in asset["last_error_detail"]
    crashes = await rig.pool.fetch("SELECT * FROM media_crashes WHERE asset_id = $1", asset_id)
    assert [c["cause"] for c in crashes] == ["decoder_crashed", "decoder_crashed"]
    assert all("signal 11" in c["detail"] for c in crashes)
    # Exactly two attempts ran ffmpeg (two job attempts, each one crash row), no third.
    attempts_run = await rig.pool.fetchval(
        "SELECT count(DISTINCT (job_id, lease_token)) FROM media_crashes WHERE asset_id = $1",
        asset_id,
    )
    assert attempts_run == 2
    revision = (await rig.revisions(asset_id))[0]
    assert revision["status"] == "FAILED"
    assert all(v["status"] == "FAILED" for v in (await rig.variants(asset_id)).values())
    dead = await rig.pool.fetch(
        "SELECT last_error_class FROM job_history WHERE payload->>'asset_id' = $1"
        " AND status = 'dead'",
        str(asset_id),
    )
    assert [d["last_error_class"] for d in dead] == ["poison_media"]
    # The source stays in quarantine storage for inspection.
    assert await rig.store.head(asset["source_object_key"]) is not None


async def test_a_source_whose_worker_died_twice_is_quarantined_before_a_third_run(
    rig: Rig, source: bytes
) -> None:
    rig.config = with_backlog(rig.config, near_expiry_outputs=0)
    asset_id = await rig.quarantine(source)
    job_id = await rig.enqueue_probe(asset_id)
    queue = Queue(rig.pool)
    for death in range(2):  # a worker claims the probe and dies: its lease expires
        (claimed,) = await queue.claim("media", 1, f"doomed-worker-{death}", 0.05)
        assert claimed.id == job_id
        await anyio.sleep(0.1)
        assert [(r[0], r[3]) for r in await queue.reap()] == [(job_id, "queued")]
    crashes = await rig.pool.fetch("SELECT * FROM media_crashes WHERE asset_id = $1", asset_id)
    assert [(c["cause"], c["kind"], c["job_id"]) for c in crashes] == [
        ("lease_expired", "probe", job_id)
    ] * 2
    assert {c["lease_token"] for c in crashes} == {1, 2}
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM job_history WHERE id = $1", job_id)
    asset = await rig.asset(asset_id)
    # A valid source: had the third attempt run, it would be PROCESSING now.
    assert asset["status"] == "PROCESSING_FAILED"
    assert asset["last_error_class"] == "poison_media"
    assert asset["probe"] is None
    job = await rig.pool.fetchrow(
        "SELECT status, last_error_class, attempts FROM job_history WHERE id = $1", job_id
    )
    assert (job["status"], job["last_error_class"], job["attempts"]) == ("dead", "poison_media", 3)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")
async def test_the_crashing_ffmpeg_really_dies_of_a_crash_signal(tmp_path: Path) -> None:
    """The test double above is what the sandbox calls a crash (SIGSEGV)."""
    from aivedio.config.media import MediaConfig
    from aivedio.pipeline.ffmpeg.sandbox import Sandbox

    script, log = crashing_ffmpeg(tmp_path)
    sandbox = Sandbox(MediaConfig(ffmpeg=str(script)))
    result = await sandbox.run("ffmpeg", ["-version"], cwd=tmp_path, deadline_seconds=10)
    assert result.crashed and calls(log) == 1
    assert os.path.exists(log)


async def test_a_worker_that_died_holding_two_jobs_of_a_source_is_one_crash(
    rig: Rig, source: bytes
) -> None:
    # The fast path's probe job and the render of its enrichment run at once on one worker:
    # its death expires both leases, which is one crash of the source, not two (two would
    # quarantine a valid source after a single lost node), in one reap or in two.
    from aivedio.store import media_crashes

    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    spec = REGISTRY.spec(
        "render",
        f"render:{asset_id}:1:hls:v1",
        tenant_id=rig.tenant_id,
        payload={"asset_id": str(asset_id), "revision": 1, "variant_type": "hls"},
    )
    queue = Queue(rig.pool)
    async with rig.pool.acquire() as conn:
        await queue.enqueue_one(conn, spec)
    assert len(await queue.claim("media", 1, "doomed-worker", 0.05)) == 1
    await anyio.sleep(0.1)
    assert len(await queue.reap()) == 1
    assert len(await queue.claim("media", 1, "doomed-worker", 0.05)) == 1
    await anyio.sleep(0.1)
    assert len(await queue.reap()) == 1
    rows = await rig.pool.fetch("SELECT * FROM media_crashes WHERE asset_id = $1", asset_id)
    assert len(rows) == 2  # each job's expiry is on record
    assert len(await media_crashes.of_asset(rig.pool, asset_id)) == 1
    # The death of another worker (a restarted one is another owner) is a second crash.
    assert len(await queue.claim("media", 1, "doomed-worker-2", 0.05)) == 1
    await anyio.sleep(0.1)
    await queue.reap()
    assert len(await media_crashes.of_asset(rig.pool, asset_id)) == 2
