"""Chunked transcoding through the worker: split, (chunk, rendition) jobs, assembly.

Real PostgreSQL, the local object store, real ffmpeg. The sources carry their own frame
numbers (a binary counter burned into the picture) and a tone that changes every second,
so the outputs can be checked frame by frame and second by second.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import itertools
import math
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from aivedio.config.load import Config
from aivedio.errors import RenderError
from aivedio.pipeline import chunk_pieces, chunk_stage
from aivedio.pipeline.ffmpeg.chunk_steps import ChunkSteps
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media_stage import open_media_stage
from aivedio.pipeline.revisions import will_retry
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.queue import Queue
from tests.support.caption_media import clip_with_mov_text
from tests.support.hls_check import check_hls
from tests.support.media_fixtures import MediaCache, counted_av, read_counters, tone_hz
from tests.support.pipeline_rig import Rig, fake_job, make_rig, registry_without, running_worker

pytestmark = pytest.mark.anyio

FPS = 24
RATE = 48000
LONG = 40  # seconds: the long source, ten chunks of about 4 s
SHORT = 20  # seconds: the short ones, four chunks of about 5 s with ``short_chunks``


@pytest.fixture(scope="module")
def media_cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("media"))


def chunked(rig: Rig, **media: Any) -> Rig:
    settings: dict[str, Any] = {
        "chunk_threshold_seconds": 60.0,
        "chunk_seconds": 20.0,
        "x264_preset": "ultrafast",
    }
    settings.update(media)
    config = msgspec.structs.replace(
        rig.config, media=msgspec.structs.replace(rig.config.media, **settings)
    )
    return dataclasses.replace(rig, config=config)


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield chunked(r)


async def publish(rig: Rig, source: Path, timeout: float = 240) -> uuid.UUID:
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    await rig.wait(
        "SELECT status IN ('PLAYABLE', 'ENRICHED', 'PROCESSING_FAILED') FROM assets WHERE id = $1",
        asset_id,
        timeout=timeout,
    )
    await rig.wait_idle(asset_id, timeout=timeout)
    return asset_id


async def download_revision(rig: Rig, asset_id: uuid.UUID, target: Path) -> dict[str, str]:
    """Every object of revision 1 (work objects excluded) by path, with its SHA-256."""
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    digests = {}
    async for info in rig.store.list(prefix + "/"):
        name = info.key[len(prefix) + 1 :]
        if name.startswith("work/"):
            continue
        body = await rig.store.get_bytes(info.key, max_bytes=1 << 30)
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        digests[name] = hashlib.sha256(body).hexdigest()
    return digests


async def history(rig: Rig, asset_id: uuid.UUID) -> list[dict[str, Any]]:
    rows = await rig.pool.fetch(
        "SELECT kind, status, attempts, payload, result FROM job_history"
        " WHERE payload->>'asset_id' = $1",
        str(asset_id),
    )
    return [dict(r) for r in rows]


def frame_times(playlist: Path) -> list[float]:
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "frame=pts_time",
            "-of",
            "csv=p=0",
            str(playlist),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [float(line.strip(",")) for line in out.split() if line.strip(",")]


def audio_pcm(playlist: Path) -> tuple[float, array.array[int]]:
    """(time of the first decoded sample, mono 48 kHz samples) of the playlist's audio."""
    start = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-select_streams",
            "a:0",
            "-show_entries",
            "frame=pts_time",
            "-read_intervals",
            "%+#1",
            "-of",
            "csv=p=0",
            str(playlist),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    raw = subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(playlist),
            "-map",
            "0:a:0",
            "-ac",
            "1",
            "-ar",
            str(RATE),
            "-f",
            "s16le",
            "-",
        ],
        capture_output=True,
        check=True,
    ).stdout
    samples = array.array("h")
    samples.frombytes(raw)
    return float(start.strip(",")), samples


def goertzel(samples: array.array[int], start: int, length: int, hz: float) -> float:
    coeff = 2 * math.cos(2 * math.pi * hz / RATE)
    s1 = s2 = 0.0
    for x in samples[start : start + length]:
        s1, s2 = x + coeff * s1 - s2, s1
    return s1 * s1 + s2 * s2 - coeff * s1 * s2


def tone_change(samples: array.array[int], second: int, t0: float) -> float:
    """When the tone of ``second - 1`` gives way to that of ``second`` (seconds, 10 ms
    windows every 1 ms, looked for within 100 ms of where it should be)."""
    before, after = tone_hz(second - 1), tone_hz(second)
    window = RATE // 100
    expected = round((second - t0) * RATE)
    for offset in range(-RATE // 10, RATE // 10, RATE // 1000):
        begin = expected + offset
        if goertzel(samples, begin, window, after) > goertzel(samples, begin, window, before):
            return t0 + (begin + window / 2) / RATE
    raise AssertionError(f"no tone change found near second {second}")


def longest_silence_ms(samples: array.array[int]) -> float:
    """The longest run of 2.5 ms windows whose peak stays under 5% of full scale, away
    from the first and last 50 ms (the decoder's start and the encoder's padding)."""
    window = RATE // 400
    longest = run = 0
    edge = RATE // 20
    for begin in range(edge, len(samples) - window - edge, window):
        chunk = samples[begin : begin + window]
        if max(max(chunk), -min(chunk)) < 0.05 * 32767:
            run += 1
            longest = max(longest, run)
        else:
            run = 0
    return longest * 2.5


@pytest.mark.timeout(600)
async def test_a_long_source_through_the_chunked_path_gives_exact_frames_in_sync(
    rig: Rig, media_cache: MediaCache, tmp_path: Path
) -> None:
    # Keyframes every 47 frames: most fall off the 1 s segment grid (47/24 s apart). 40 s in
    # chunks of about 4 s: ten chunks, nine boundaries to check.
    source = media_cache.get(f"counted_{LONG}", counted_av, seconds=LONG, fps=FPS, keyint=47)
    rig = chunked(rig, chunk_threshold_seconds=30.0, chunk_seconds=4.0)
    async with running_worker(rig):
        asset_id = await publish(rig, source)
    asset = await rig.asset(asset_id)
    assert asset["status"] in ("PLAYABLE", "ENRICHED"), asset["last_error_detail"]
    revision = (await rig.revisions(asset_id))[0]
    plan = msgspec.convert(revision["plan"], Plan)
    assert plan.mode == "transcode" and plan.path == "chunked"
    assert plan.chunking is not None
    chunking = plan.chunking
    assert chunking.count >= 8
    assert any(abs(s - round(s)) > 0.01 for s in chunking.starts[1:]), "an off-grid split"

    jobs = await history(rig, asset_id)
    kinds = [j["kind"] for j in jobs if j["status"] == "succeeded"]
    rungs = [r.name for r in plan.rungs]
    assert kinds.count("chunk_split") == 1
    assert kinds.count("chunk_encode") == chunking.count * len(rungs) + 1  # + the audio
    assert kinds.count("chunk_assemble") == 1
    # Each chunk decoded once: its lead piece's job encoded every rendition of it, the
    # other pieces' jobs found theirs done.
    encoded = [
        j["result"]["pieces"]
        for j in jobs
        if j["kind"] == "chunk_encode"
        and j["result"]["outcome"] == "encoded"
        and j["payload"]["piece"].startswith("video:")
    ]
    assert sorted(map(sorted, encoded)) == sorted(
        sorted(chunk_pieces.video_piece(r, i) for r in plan.rungs) for i in range(chunking.count)
    )
    rendered = {j["payload"]["variant_type"] for j in jobs if j["kind"] == "render"}
    assert not rendered & set(chunk_pieces.CHUNK_OUTPUTS)
    pieces = await rig.pool.fetch(
        "SELECT piece, status, frames FROM media_pieces WHERE asset_id = $1", asset_id
    )
    assert {p["status"] for p in pieces} == {"DONE"}

    local = tmp_path / "out"
    names = await download_revision(rig, asset_id, local)
    assert check_hls(local / "hls" / "master.m3u8") == []
    total = LONG * FPS
    for rung in plan.rungs:
        playlist = local / "hls" / rung.name / "index.m3u8"
        # Exactly the source's frames, each once, in order.
        assert read_counters(playlist, width=rung.width) == list(range(total)), rung.name
        # Continuous timestamps: no gap or overlap anywhere, chunk boundaries included.
        times = frame_times(playlist)
        assert len(times) == total
        steps = [b - a for a, b in itertools.pairwise(times)]
        assert max(abs(step - 1 / FPS) for step in steps) < 0.002, rung.name
        # Audio and video in sync within one frame at every chunk boundary.
        t0, samples = audio_pcm(playlist)
        for boundary in chunking.starts[1:]:
            second = round(boundary)
            video_at = times[second * FPS]
            audio_at = tone_change(samples, second, t0)
            assert abs(video_at - audio_at) < 1 / FPS, (rung.name, boundary, video_at, audio_at)
        # No audio gap at all (the track is encoded once, never cut).
        assert longest_silence_ms(samples) < 5.0
        assert abs(len(samples) / RATE - LONG) < 0.1
    playback = local / "playback.mp4"
    assert read_counters(playback, width=plan.top.width) == list(range(total))
    assert "keyframes.json" in names
    # The work objects were removed after the assembly.
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    assert [i.key async for i in rig.store.list(prefix + "/work/")] == []


@pytest.fixture
def short_source(media_cache: MediaCache) -> Path:
    # yuv420p H.264: a remux (the copied top rung plus one encoded rung).
    return media_cache.get(
        f"counted_{SHORT}", counted_av, seconds=SHORT, fps=FPS, keyint=47, pix_fmt="yuv420p"
    )


def short_chunks(rig: Rig) -> Rig:
    return chunked(rig, chunk_threshold_seconds=10.0, chunk_seconds=5.0)


async def test_a_chunk_failing_twice_then_succeeding_changes_nothing(
    rig: Rig, short_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = short_chunks(rig)
    async with running_worker(rig):
        clean = await publish(rig, short_source)
    plan = msgspec.convert((await rig.revisions(clean))[0]["plan"], Plan)
    assert plan.mode == "remux" and plan.path == "chunked" and plan.top.copy
    encoded = [r for r in plan.rungs if not r.copy]
    assert encoded
    target = (encoded[0].name, 1)
    failures = []
    original = ChunkSteps.encode_many

    async def flaky(self: ChunkSteps, rungs: list[Any], index: int, chunk: Path) -> Any:
        if any((rung.name, index) == target for rung in rungs) and len(failures) < 2:
            failures.append(index)
            raise RenderError("injected encoder failure")
        return await original(self, rungs, index, chunk)

    monkeypatch.setattr(ChunkSteps, "encode_many", flaky)
    async with running_worker(rig):
        retried = await publish(rig, short_source)
    assert len(failures) == 2
    assert (await rig.asset(retried))["status"] in ("PLAYABLE", "ENRICHED")
    piece = chunk_pieces.video_piece(encoded[0], 1)
    jobs = {
        j["payload"].get("piece"): j
        for j in await history(rig, retried)
        if j["kind"] == "chunk_encode"
    }
    assert jobs[piece]["attempts"] == 3
    assert all(j["attempts"] == 1 for name, j in jobs.items() if name != piece)
    first = await download_revision(rig, clean, tmp_path / "a")
    second = await download_revision(rig, retried, tmp_path / "b")
    chunk_made = {n: d for n, d in first.items() if n.startswith("hls/") or n == "playback.mp4"}
    assert chunk_made and all(second[n] == d for n, d in chunk_made.items())
    assert check_hls(tmp_path / "b" / "hls" / "master.m3u8") == []


async def test_a_chunked_sources_own_subtitles_are_published_as_a_track(
    rig: Rig, tmp_path: Path
) -> None:
    rig = short_chunks(rig)
    srt = (
        "1\n00:00:01,000 --> 00:00:02,500\nEarly cue\n\n"
        "2\n00:00:09,000 --> 00:00:10,500\nLate <b>cue</b>\n"
    )
    # A transcode: every rung is encoded from the chunks, so the assembly reads the source
    # for its subtitle stream alone.
    clip = clip_with_mov_text(tmp_path / "clip", srt, seconds=12.0, pix_fmt="yuv444p")
    async with running_worker(rig):
        asset_id = await publish(rig, clip)
    plan = msgspec.convert((await rig.revisions(asset_id))[0]["plan"], Plan)
    assert (plan.path, plan.mode) == ("chunked", "transcode")
    assert not any(rung.copy for rung in plan.rungs)
    # The assembly had the source at hand for its subtitle stream: the track is published
    # with the HLS output, cleaned WebVTT at the times of the source's cues.
    local = tmp_path / "published"
    names = await download_revision(rig, asset_id, local)
    vtts = [n for n in names if n.startswith("hls/") and n.endswith(".vtt")]
    assert len(vtts) == 1, sorted(names)
    vtt = (local / vtts[0]).read_text()
    assert re.findall(r"^(\S+) --> (\S+)", vtt, re.M) == [
        ("00:00:01.000", "00:00:02.500"),
        ("00:00:09.000", "00:00:10.500"),
    ]
    assert "Early cue" in vtt and "Late <b>cue</b>" in vtt
    master = (local / "hls" / "master.m3u8").read_text()
    media = [line for line in master.splitlines() if line.startswith("#EXT-X-MEDIA:")]
    assert len(media) == 1 and "TYPE=SUBTITLES" in media[0] and 'LANGUAGE="eng"' in media[0]
    assert check_hls(local / "hls" / "master.m3u8") == []


async def test_renditions_from_one_decode_match_those_encoded_one_by_one(
    rig: Rig, media_cache: MediaCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = short_chunks(rig)
    # yuv444p: a transcode, every rung encoded from the chunks.
    source = media_cache.get(
        f"counted_{SHORT}_444", counted_av, seconds=SHORT, fps=FPS, keyint=47, pix_fmt="yuv444p"
    )
    async with running_worker(rig):
        together = await publish(rig, source)
    plan = msgspec.convert((await rig.revisions(together))[0]["plan"], Plan)
    assert plan.mode == "transcode" and len(plan.rungs) >= 2 and plan.chunking is not None

    def made_by(jobs: list[dict[str, Any]]) -> list[list[str]]:
        return sorted(
            sorted(j["result"]["pieces"])
            for j in jobs
            if j["kind"] == "chunk_encode"
            and j["result"]["outcome"] == "encoded"
            and j["payload"]["piece"].startswith("video:")
        )

    count = plan.chunking.count
    assert made_by(await history(rig, together)) == sorted(
        sorted(chunk_pieces.video_piece(r, i) for r in plan.rungs) for i in range(count)
    )

    async def hold_nothing(self: Queue, keys: Any, seconds: float, conn: Any = None) -> list[str]:
        return []

    monkeypatch.setattr(Queue, "hold", hold_nothing)
    async with running_worker(rig):
        alone = await publish(rig, source)
    assert made_by(await history(rig, alone)) == sorted(
        [chunk_pieces.video_piece(r, i)] for r in plan.rungs for i in range(count)
    )
    first = await download_revision(rig, together, tmp_path / "a")
    second = await download_revision(rig, alone, tmp_path / "b")
    chunk_made = {n: d for n, d in first.items() if n.startswith("hls/") or n == "playback.mp4"}
    assert chunk_made and all(second[n] == d for n, d in chunk_made.items())


async def test_a_source_that_cannot_be_split_takes_the_single_pass(
    rig: Rig, short_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = short_chunks(rig)

    async def refuse(self: ChunkSteps, sniff: Any, source: Path) -> list[Path]:
        raise RenderError("split: injected failure")

    monkeypatch.setattr(ChunkSteps, "split", refuse)
    async with running_worker(rig):
        asset_id = await publish(rig, short_source)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "ENRICHED", asset["last_error_detail"]
    plan = msgspec.convert((await rig.revisions(asset_id))[0]["plan"], Plan)
    assert plan.path == "chunked"  # the plan as made; the split then failed for good
    split = await rig.pool.fetchrow(
        "SELECT status, detail FROM media_pieces WHERE asset_id = $1 AND piece = 'split'",
        asset_id,
    )
    assert split["status"] == "FAILED" and "injected" in split["detail"]
    jobs = await history(rig, asset_id)
    (split_job,) = [j for j in jobs if j["kind"] == "chunk_split"]
    assert split_job["status"] == "dead" and split_job["attempts"] > 1  # retried, then gave up
    assert not [j for j in jobs if j["kind"] == chunk_pieces.ASSEMBLE_KIND]
    assert not [
        j
        for j in jobs
        if j["kind"] == chunk_pieces.ENCODE_KIND and j["payload"]["piece"].startswith("video:")
    ]
    rendered = {
        j["payload"]["variant_type"]
        for j in jobs
        if j["kind"] == "render" and j["status"] == "succeeded"
    }
    assert set(chunk_pieces.chunk_outputs(plan)) <= rendered
    local = tmp_path / "out"
    await download_revision(rig, asset_id, local)
    assert check_hls(local / "hls" / "master.m3u8") == []
    every_frame = list(range(SHORT * FPS))
    for rung in plan.rungs:
        playlist = local / "hls" / rung.name / "index.m3u8"
        assert read_counters(playlist, width=rung.width) == every_frame, rung.name
    assert read_counters(local / "playback.mp4", width=plan.top.width) == every_frame


async def test_a_duplicate_chunk_job_keeps_one_output(rig: Rig, short_source: Path) -> None:
    rig = short_chunks(rig)
    # Split, but leave the pieces to this test.
    registry = registry_without(chunk_pieces.ENCODE_KIND, chunk_pieces.ASSEMBLE_KIND)
    asset_id = await rig.quarantine(short_source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig, registry):
        await rig.wait(
            "SELECT count(*) > 0 FROM media_pieces WHERE asset_id = $1 AND piece LIKE 'video:%'",
            asset_id,
        )
    plan = msgspec.convert((await rig.revisions(asset_id))[0]["plan"], Plan)
    rung = next(r for r in plan.rungs if not r.copy)
    piece = chunk_pieces.video_piece(rung, 0)
    payload = {"asset_id": str(asset_id), "revision": 1, "piece": piece}
    async with open_media_stage(rig.config, rig.pool, Queue(rig.pool), rig.store) as media:
        stage = chunk_stage.ChunkStage(media.revisions, will_retry)
        results: list[dict[str, Any]] = []

        async def run(job_id: int) -> None:
            job = fake_job(payload, chunk_pieces.ENCODE_KIND, job_id=job_id)
            results.append(await stage.encode(job))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, 1001)
            tg.start_soon(run, 1002)
        again = await stage.encode(fake_job(payload, chunk_pieces.ENCODE_KIND, job_id=1003))
    assert sorted(r["outcome"] for r in results) == ["already_done", "encoded"]
    assert again["outcome"] == "already_done"
    row = await rig.pool.fetchrow(
        "SELECT * FROM media_pieces WHERE asset_id = $1 AND piece = $2", asset_id, piece
    )
    assert row["status"] == "DONE"
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    stored = [i.key async for i in rig.store.list(f"{prefix}/work/pieces/{rung.name}/")]
    assert stored == [row["object_key"]]
    assert row["frames"] == plan.chunking.output_frames(0, plan.frame_rate)  # type: ignore[union-attr]


async def test_a_long_videos_later_chunks_wait_behind_a_short_video_enqueued_after_them(
    pool: Pool,
) -> None:
    """Claim order: a chunk is due as far after the default deadline as it lies into its
    video, so the short video's render (enqueued 30 s later) goes before the chunks that lie
    more than 30 s in, and after those that do not."""
    from aivedio.pipeline.revisions import render_spec
    from tests.unit.pipeline.media.test_ffmpeg_args import make_plan

    tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
    plan = make_plan()
    queue = Queue(pool)
    long_id, short_id = uuid.uuid4(), uuid.uuid4()
    start = datetime.now(UTC)
    async with pool.acquire() as conn:
        specs = [
            chunk_pieces.piece_spec(
                chunk_pieces.ENCODE_KIND,
                long_id,
                tenant,
                1,
                plan,
                f"video:720p:{i:04d}",
                60.0,
                later=20.0 * i,
            )
            for i in range(6)
        ]
        await queue.enqueue(conn, specs, now=start)
        short = render_spec(short_id, tenant, 1, "playback", plan, 60.0)
        await queue.enqueue(conn, [short], now=start + timedelta(seconds=30))
    order = []
    while jobs := await queue.claim("media", 1, "test", 30.0):
        order.append(jobs[0].payload.get("piece") or "short:" + jobs[0].payload["variant_type"])
    assert order == [
        "video:720p:0000",
        "video:720p:0001",
        "short:playback",
        "video:720p:0002",
        "video:720p:0003",
        "video:720p:0004",
        "video:720p:0005",
    ]
