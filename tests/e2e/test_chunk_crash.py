"""A worker SIGKILLed in the middle of a chunk encode loses only that chunk's attempt.

Two real ``aivedio worker`` processes share a 36 s source cut into three chunks. When one
of them holds the lease of a ``chunk_encode`` job and its ffmpeg is running, it is
SIGKILLed and a replacement started: the lease is reaped, that piece alone runs again, and
the asset is published from a complete, verified set with nothing left under ``work/``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from aivedio.config.load import Config
from aivedio.pipeline import chunk_pieces
from aivedio.pipeline.media.plan import Plan
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from tests.support.hls_check import check_hls
from tests.support.media_fixtures import counted_av, read_counters
from tests.support.pipeline_rig import Rig, make_rig
from tests.support.processes import WorkerProcess

pytestmark = pytest.mark.anyio

FPS = 24
SECONDS = 36

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

# Listing lanes replaces the default set: the control lane moderates and publishes.
[worker.lanes.media]
slots = 1
[worker.lanes.control]
slots = 4

[queue]
backoff_base_seconds = 0.05
backoff_max_seconds = 0.2

[media]
scratch_dir = "{scratch}"
segment_seconds = 1.0
chunk_threshold_seconds = 30.0
chunk_seconds = 12.0
# Slow enough (over 1 s of CPU per 12 s chunk at 180p) that the kill lands mid-encode.
x264_preset = "medium"
required_outputs = ["playback", "poster"]
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


def descendants(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every live process under ``pid``."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: list[tuple[int, list[str]]] = []
    wanted = {pid}
    for _ in range(4):  # prlimit and unshare exec; a shallow tree
        for child, parent in parents.items():
            if parent in wanted and child not in wanted:
                wanted.add(child)
                try:
                    argv = (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                found.append((child, [a.decode(errors="replace") for a in argv if a]))
    return found


def alive(pid: int) -> bool:
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


async def download_revision(rig: Rig, asset_id: uuid.UUID, target: Path) -> dict[str, str]:
    """The published objects of revision 1 (work objects excluded), by path."""
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    digests = {}
    async for info in rig.store.list(prefix + "/"):
        name = info.key[len(prefix) + 1 :]
        if name.startswith("work/"):
            continue
        body = await rig.store.get_bytes(info.key, max_bytes=1 << 30)
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(body)
        digests[name] = hashlib.sha256(body).hexdigest()
    return digests


@pytest.mark.timeout(240)
async def test_a_worker_killed_mid_chunk_loses_only_that_chunks_attempt(
    rig: Rig, database: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    # yuv420p H.264: a remux whose copied 240p rung comes from the source and whose 180p
    # rung is encoded chunk by chunk.
    source = await anyio.to_thread.run_sync(
        lambda: counted_av(tmp_path, seconds=SECONDS, fps=FPS, keyint=47, pix_fmt="yuv420p")
    )
    config = tmp_path / "worker.toml"
    config.write_text(
        CONFIG.format(dsn=database, objects=tmp_path / "objects", scratch=tmp_path / "scratch")
    )
    for name in ("a", "b"):
        workers.append(WorkerProcess(config, tmp_path / f"{name}.log"))
    by_owner = {w.owner: w for w in workers}

    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)

    # Wait until a worker holds a video piece's lease and that piece's ffmpeg is running.
    victim: tuple[WorkerProcess, int, str, int] | None = None
    deadline = time.monotonic() + 90
    while victim is None and time.monotonic() < deadline:
        running = await rig.pool.fetch(
            "SELECT id, lease_owner, payload->>'piece' AS piece FROM jobs WHERE kind = $1"
            " AND status = 'running' AND payload->>'piece' LIKE 'video:%'",
            chunk_pieces.ENCODE_KIND,
        )
        for row in running:
            worker = by_owner.get(row["lease_owner"])
            if worker is None:
                continue
            _, rung_name, index = row["piece"].split(":")
            output = f"/pieces/{rung_name}/{index}.mp4"
            ffmpeg = [
                pid
                for pid, argv in descendants(worker.proc.pid)
                if any(a.endswith("ffmpeg") for a in argv) and argv[-1].endswith(output)
            ]
            if ffmpeg:
                victim = (worker, row["id"], row["piece"], ffmpeg[0])
                break
        else:
            await anyio.sleep(0.05)
    assert victim is not None, "no chunk encode was seen running"
    doomed, job_id, piece, ffmpeg_pid = victim
    doomed.kill()
    assert not alive(doomed.proc.pid)
    # The doomed worker held that one job and no other.
    held = await rig.pool.fetch(
        "SELECT id FROM jobs WHERE lease_owner = $1 AND status = 'running'", doomed.owner
    )
    assert [r["id"] for r in held] == [job_id]
    # Its ffmpeg does not outlive it for long: its progress pipe has no reader any more.
    gone_by = time.monotonic() + 10
    while alive(ffmpeg_pid) and time.monotonic() < gone_by:
        await anyio.sleep(0.05)
    orphaned = alive(ffmpeg_pid)
    if orphaned:
        os.kill(ffmpeg_pid, signal.SIGKILL)
    assert not orphaned, "the killed worker's ffmpeg kept running"

    workers.append(WorkerProcess(config, tmp_path / "replacement.log"))
    await rig.wait(
        "SELECT status IN ('PLAYABLE', 'ENRICHED', 'PROCESSING_FAILED') FROM assets WHERE id = $1",
        asset_id,
        timeout=150,
    )
    await rig.wait_idle(asset_id, timeout=60)
    asset = await rig.asset(asset_id)
    assert asset["status"] in ("PLAYABLE", "ENRICHED"), asset["last_error_detail"]

    # Only the killed piece ran twice; every other job of the asset ran once.
    jobs = await rig.pool.fetch(
        "SELECT id, kind, status, attempts, lease_owner, payload, result FROM job_history"
        " WHERE payload->>'asset_id' = $1",
        str(asset_id),
    )
    assert {j["status"] for j in jobs} == {"succeeded"}
    again = [(j["kind"], j["payload"].get("piece")) for j in jobs if j["attempts"] != 1]
    assert again == [(chunk_pieces.ENCODE_KIND, piece)]
    killed = next(j for j in jobs if j["id"] == job_id)
    assert killed["attempts"] == 2 and killed["lease_owner"] != doomed.owner
    events = [e for w in workers if w is not doomed for e in w.events()]
    assert any(e.get("event") == "lease_expired" for e in events)
    # A lost piece is not counted as a crash of the source: a long video has many pieces,
    # and poison media is for sources that crash the decoder, not for lost nodes.
    crashes = await rig.pool.fetch("SELECT 1 FROM media_crashes WHERE asset_id = $1", asset_id)
    assert crashes == []

    # Every piece is DONE, committed by exactly one job whose attempt made its object.
    plan = msgspec.convert((await rig.revisions(asset_id))[0]["plan"], Plan)
    assert plan.mode == "remux" and plan.chunking is not None and plan.chunking.count == 3
    pieces = await rig.pool.fetch(
        "SELECT piece, status, object_key FROM media_pieces WHERE asset_id = $1", asset_id
    )
    encoded = [r for r in plan.rungs if not r.copy]
    expected = {chunk_pieces.SPLIT_PIECE, chunk_pieces.AUDIO_PIECE}
    expected |= {chunk_pieces.chunk_piece(i) for i in range(plan.chunking.count)}
    expected |= {
        chunk_pieces.video_piece(r, i) for r in encoded for i in range(plan.chunking.count)
    }
    assert {p["piece"]: p["status"] for p in pieces} == dict.fromkeys(expected, "DONE")
    encodes = [j for j in jobs if j["kind"] == chunk_pieces.ENCODE_KIND]
    outcomes = sorted((j["payload"]["piece"], j["result"]["outcome"]) for j in encodes)
    assert outcomes == sorted(
        (name, "encoded") for name in expected if name.startswith(("video:", "audio"))
    )
    row = next(p for p in pieces if p["piece"] == piece)
    assert row["object_key"].endswith(f".{job_id}-2.mp4")

    # The published HLS is whole: checked, and every source frame once in the encoded rung.
    local = tmp_path / "published"
    await download_revision(rig, asset_id, local)
    assert check_hls(local / "hls" / "master.m3u8") == []
    for rung in encoded:
        playlist = local / "hls" / rung.name / "index.m3u8"
        assert read_counters(playlist, width=rung.width) == list(range(SECONDS * FPS))
    # No work object is left, the lost attempt's included.
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    assert [i.key async for i in rig.store.list(prefix + "/work/")] == []

    for worker in workers:
        if worker is not doomed:
            worker.signal(signal.SIGTERM)
    assert [w.wait(30) for w in workers if w is not doomed] == [0, 0]
