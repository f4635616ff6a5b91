"""Workers SIGKILLed at each hand-off of the fast path still end in one published revision.

Real ``aivedio worker`` processes on real PostgreSQL, the local store and real ffmpeg:

* killed right after the fetch stored the source (its probe, claimed at once by the same
  worker, just started or not yet): the probe job is in the statement that stored it;
* killed mid-render: the probe job's frames pass and the required render are running;
* killed between the verdict and the publish: the probe job's statement recorded the
  revision with the moderator's allow and the made outputs, and its publish is held (the
  test holds the ``releases`` table, so the publish waits inside its transaction), then
  the worker dies and its connections are ended.

* killed mid-enrichment: the probe job published the required set and goes on with the
  optional outputs from its scratch, the revision's render job held for it: the expired
  lease makes the held job due, and it renders them.

Each time a second worker finishes: exactly one release of revision 1, the asset
ENRICHED (its enrichment published as revision 2), no dead job.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.e2e.test_chunk_crash import alive, descendants
from tests.support.media_fixtures import MediaCache, h264_moov_at_end
from tests.support.pipeline_rig import Rig, make_rig
from tests.support.processes import WorkerProcess

pytestmark = pytest.mark.anyio

CONFIG = """
[database]
url = "{dsn}"
pool_max_size = 6

[storage]
url = "file://{objects}"

[worker]
http_port = 0
lease_seconds = 3
heartbeat_interval_seconds = 1
poll_interval_seconds = 0.2

[queue]
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2

[media]
scratch_dir = "{scratch}"
segment_seconds = 1.0
optional_outputs = ["hls", "keyframes"]

[[media.ladder]]
height = 240

[[media.ladder]]
height = 180

[moderation]
backend = "local"
[moderation.local]
allow_all = true

[sweeper]
periodic = false
"""


@pytest.fixture(scope="module")
def media_cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def long_source(media_cache: MediaCache) -> bytes:
    # Long enough (a whole decode of 24 s of 480p) that a kill lands while it runs.
    path = media_cache.get("h264-24s", h264_moov_at_end, width=854, height=480, seconds=24)
    return path.read_bytes()


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


def worker_config(database: str, tmp_path: Path) -> Path:
    path = tmp_path / "worker.toml"
    path.write_text(
        CONFIG.format(dsn=database, objects=tmp_path / "objects", scratch=tmp_path / "scratch")
    )
    return path


async def doomed_worker_with_its_asset(
    rig: Rig, database: str, tmp_path: Path, workers: list[WorkerProcess], source: bytes
) -> tuple[Path, WorkerProcess, uuid.UUID]:
    """The worker to kill, started, and an asset in quarantine with its probe job (what the
    fetch's stored statement leaves): the config, that worker, the asset."""
    config = worker_config(database, tmp_path)
    doomed = WorkerProcess(config, tmp_path / "doomed.log")
    workers.append(doomed)
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    return config, doomed, asset_id


async def published_once(rig: Rig, asset_id: uuid.UUID) -> None:
    """ENRICHED, exactly one release of revision 1, nothing dead, nothing left running."""
    await rig.wait("SELECT 1 FROM assets WHERE id = $1 AND status = 'ENRICHED'", asset_id)
    await rig.wait_idle(asset_id)
    releases = await rig.pool.fetch(
        "SELECT revision FROM releases WHERE asset_id = $1 ORDER BY revision", asset_id
    )
    assert [r["revision"] for r in releases] == [1, 2]
    assert not await rig.pool.fetchval(
        "SELECT count(*) FROM job_history WHERE status = 'dead' AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    first = (await rig.revisions(asset_id))[0]
    assert first["moderation_verdict"] == "allow"
    ready = [e for e in await rig.events(asset_id) if e["event_type"] == "asset.ready"]
    assert len(ready) == 2  # the publish and the enrichment, each once


@pytest.mark.timeout(180)
async def test_killed_as_its_probe_starts_right_after_the_source_is_stored(
    rig: Rig, database: str, tmp_path: Path, workers: list[WorkerProcess], long_source: bytes
) -> None:
    # The fetch's own statement stores the source with its probe job; the quarantined
    # asset and that job are what it leaves. The kill comes as soon as they exist.
    config, doomed, asset_id = await doomed_worker_with_its_asset(
        rig, database, tmp_path, workers, long_source
    )
    await rig.wait("SELECT 1 FROM jobs WHERE kind = 'probe' AND status = 'running'")
    doomed.kill()
    assert not alive(doomed.proc.pid)
    assert (await rig.asset(asset_id))["status"] in ("QUARANTINED", "PROBING")
    workers.append(WorkerProcess(config, tmp_path / "survivor.log"))
    await published_once(rig, asset_id)


@pytest.mark.timeout(180)
async def test_killed_mid_render_of_the_fast_path(
    rig: Rig, database: str, tmp_path: Path, workers: list[WorkerProcess], long_source: bytes
) -> None:
    config, doomed, asset_id = await doomed_worker_with_its_asset(
        rig, database, tmp_path, workers, long_source
    )
    # The probe job's frames pass (the whole decode) running in the doomed worker's sandbox.
    deadline = time.monotonic() + 60
    seen = False
    while not seen and time.monotonic() < deadline:
        seen = any(
            any(a.endswith("ffmpeg") for a in argv) and any("scene_times" in a for a in argv)
            for _, argv in descendants(doomed.proc.pid)
        )
        if not seen:
            await anyio.sleep(0.02)
    assert seen, "the fast path's frames pass was never seen running"
    doomed.kill()
    assert (await rig.asset(asset_id))["status"] == "PROBING"
    assert await rig.revisions(asset_id) == []
    workers.append(WorkerProcess(config, tmp_path / "survivor.log"))
    await published_once(rig, asset_id)
    probe = await rig.pool.fetchrow(
        "SELECT attempts, result FROM job_history WHERE kind = 'probe'"
        " AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    assert probe["attempts"] == 2 and probe["result"]["fast_path"] is True


@pytest.mark.timeout(180)
async def test_killed_between_the_verdict_and_the_publish(
    rig: Rig, database: str, tmp_path: Path, workers: list[WorkerProcess], long_source: bytes
) -> None:
    async with rig.pool.acquire() as hold:
        tx = hold.transaction()
        await tx.start()
        # Reads of releases go on; the publish's insert waits, inside its transaction.
        await hold.execute("LOCK TABLE releases IN EXCLUSIVE MODE")
        config, doomed, asset_id = await doomed_worker_with_its_asset(
            rig, database, tmp_path, workers, long_source
        )
        waiting = (
            "SELECT array_agg(l.pid) FROM pg_locks l WHERE NOT l.granted"
            " AND l.relation = 'releases'::regclass"
        )
        await rig.wait(waiting, timeout=90)
        doomed.kill()
        assert not alive(doomed.proc.pid)
        # Its connections end with it (the server would notice only at its next read).
        await rig.pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks"
            " WHERE relation = 'releases'::regclass AND NOT granted"
        )
        await tx.rollback()
    # What the kill left: the revision recorded with its allow and its required set, no
    # release, the asset not yet playable.
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING" and asset["current_revision"] is None
    (revision,) = [r for r in await rig.revisions(asset_id) if r["revision"] == 1]
    assert revision["status"] == "BUILDING" and revision["moderation_verdict"] == "allow"
    variants = await rig.variants(asset_id)
    assert variants["playback"]["status"] == variants["poster"]["status"] == "SUCCEEDED"
    assert not await rig.pool.fetchval("SELECT count(*) FROM releases")
    workers.append(WorkerProcess(config, tmp_path / "survivor.log"))
    await published_once(rig, asset_id)


@pytest.mark.timeout(180)
async def test_killed_mid_enrichment_in_the_probe_job(
    rig: Rig, database: str, tmp_path: Path, workers: list[WorkerProcess], long_source: bytes
) -> None:
    config, doomed, asset_id = await doomed_worker_with_its_asset(
        rig, database, tmp_path, workers, long_source
    )
    # Published by the probe job, which renders the ladder and keyframes next.
    await rig.wait(
        "SELECT 1 FROM assets WHERE id = $1 AND status = 'PLAYABLE'", asset_id, timeout=90
    )
    doomed.kill()
    assert not alive(doomed.proc.pid)
    assert (await rig.asset(asset_id))["status"] == "PLAYABLE"
    probe_id = await rig.pool.fetchval(
        "SELECT id FROM jobs WHERE kind = 'probe' AND payload->>'asset_id' = $1", str(asset_id)
    )
    held = await rig.pool.fetchrow(
        "SELECT status, held_by FROM jobs WHERE kind = 'render' AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    assert held["status"] == "waiting" and held["held_by"] == probe_id
    workers.append(WorkerProcess(config, tmp_path / "survivor.log"))
    await published_once(rig, asset_id)
    # The held job came back when the probe's lease expired (not when its hold would end)
    # and made the enrichment; the probe's second delivery found the asset published.
    render = await rig.pool.fetchrow(
        "SELECT attempts, result FROM job_history WHERE kind = 'render'"
        " AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    assert render["attempts"] == 1 and render["result"]["outcome"] == "rendered"
    probe = await rig.pool.fetchrow(
        "SELECT attempts, result FROM job_history WHERE kind = 'probe'"
        " AND payload->>'asset_id' = $1",
        str(asset_id),
    )
    assert probe["attempts"] == 2 and probe["result"]["outcome"] == "already_probed"
