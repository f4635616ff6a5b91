"""The AV1 ladder on the chunked path through the worker, judged from the published files.

Real PostgreSQL, the local object store, real ffmpeg (SVT-AV1). The source carries its own
frame numbers (a binary counter burned into the picture) and has keyframes every 47 frames,
so most splits fall off the segment grid: each chunk's AV1 keyframes then fall every GOP
from the chunk's first frame, not on the grid. What is checked is read back with
ffprobe/ffmpeg from the published init + segments, never from our own records.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aivedio.config.load import Config
from aivedio.config.media import AV1Config
from aivedio.pipeline import chunk_pieces
from aivedio.pipeline.media.plan import Plan
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from tests.support.hls_check import check_hls, parse_master, parse_media_playlist, unquote
from tests.support.media_fixtures import counted_av, read_counters
from tests.support.pipeline_rig import Rig, make_rig, running_worker

pytestmark = pytest.mark.anyio

FPS = 24
SECONDS = 14
# Chunks of about 3 s of a 14 s source (segments of 1 s: the rig's), keyframes every 47
# frames: four chunks, their starts mostly off the segment grid.
MEDIA = {
    "chunk_threshold_seconds": 6.0,
    "chunk_seconds": 3.0,
    "x264_preset": "ultrafast",
    "av1": AV1Config(tenants=["acme"], preset=12),
}


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        media = msgspec.structs.replace(r.config.media, **MEDIA)
        yield dataclasses.replace(r, config=msgspec.structs.replace(r.config, media=media))


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


async def download_revision(rig: Rig, asset_id: uuid.UUID, target: Path) -> set[str]:
    """Every published object of revision 1 (work objects excluded), by path."""
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    names = set()
    async for info in rig.store.list(prefix + "/"):
        name = info.key[len(prefix) + 1 :]
        if name.startswith("work/"):
            continue
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(await rig.store.get_bytes(info.key, max_bytes=1 << 30))
        names.add(name)
    return names


def joined(directory: Path, scratch: Path) -> tuple[Path, list[tuple[str, float]]]:
    """A rendition's init + every segment as one file, and its playlist's segments."""
    playlist = parse_media_playlist(directory / "index.m3u8")
    segments = [(s["uri"], s["duration"]) for s in playlist["segments"]]
    out = scratch / f"{directory.name}.mp4"
    with out.open("wb") as handle:
        for name in [playlist["map_uri"], *(uri for uri, _ in segments)]:
            handle.write((directory / name).read_bytes())
    return out, segments


def ffprobe_json(*args: str) -> Any:
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-of", "json", *args], capture_output=True, check=True
    )
    return json.loads(done.stdout)


def packets(path: Path) -> list[tuple[float, bool]]:
    """(pts, keyframe) of every video packet, in order."""
    found = ffprobe_json(
        "-select_streams", "v:0", "-show_entries", "packet=pts_time,flags", str(path)
    )["packets"]
    return [(float(p["pts_time"]), "K" in p["flags"]) for p in found]


def expected_keyframes(plan: Plan) -> list[float]:
    """Seconds from the first frame: every chunk's GOP from its first output frame, the GOP
    its frames in the fewest GOPs of at most one segment, as equal as a fixed GOP allows."""
    assert plan.chunking is not None
    chunking, rate = plan.chunking, plan.frame_rate
    first = 0
    times: list[float] = []
    for index in range(chunking.count):
        frames = chunking.output_frames(index, rate)
        groups = math.ceil(frames / plan.gop_frames)
        gop = math.ceil(frames / groups)
        times += [(first + k * gop) / rate for k in range(groups)]
        first += frames
    return times


@pytest.mark.timeout(400)
async def test_a_chunked_source_gets_the_av1_ladder_beside_h264_in_one_master(
    rig: Rig, tmp_path: Path
) -> None:
    source = counted_av(tmp_path, seconds=SECONDS, fps=FPS, keyint=47, pix_fmt="yuv444p")
    async with running_worker(rig):
        asset_id = await publish(rig, source)
    asset = await rig.asset(asset_id)
    assert asset["status"] in ("PLAYABLE", "ENRICHED"), asset["last_error_detail"]
    plan = msgspec.convert((await rig.revisions(asset_id))[0]["plan"], Plan)
    assert (plan.path, plan.mode) == ("chunked", "transcode")
    assert plan.chunking is not None and plan.chunking.count >= 3
    assert any(abs(s - round(s)) > 0.01 for s in plan.chunking.starts[1:]), "an off-grid split"
    assert [r.name for r in plan.av1_rungs] == [f"av1_{r.name}" for r in plan.rungs]

    local = tmp_path / "published"
    await download_revision(rig, asset_id, local)
    master = local / "hls" / "master.m3u8"
    assert check_hls(master, decode=True) == []
    # One master: the H.264 variants first (the fallback), then the AV1 ones.
    listed = [
        (entry["uri"], unquote(entry["attributes"]["CODECS"]) or "")
        for entry in parse_master(master)
        if entry["kind"] == "variant"
    ]
    assert [uri for uri, _ in listed] == [f"{r.name}/index.m3u8" for r in plan.renditions]
    assert all(codecs.startswith("avc1.") for _, codecs in listed[: len(plan.rungs)]), listed
    assert all(codecs.startswith("av01.") for _, codecs in listed[len(plan.rungs) :]), listed

    total = SECONDS * FPS
    grid = expected_keyframes(plan)
    for rung, (_, codecs) in zip(plan.av1_rungs, listed[len(plan.rungs) :], strict=True):
        directory = local / "hls" / rung.name
        whole, segments = joined(directory, tmp_path)
        [stream] = ffprobe_json("-select_streams", "v:0", "-show_streams", str(whole))["streams"]
        assert stream["codec_name"] == "av1" and stream["profile"] == "Main", stream
        assert (stream["width"], stream["height"]) == (rung.width, rung.height)
        assert codecs.split(",")[0] == f"av01.0.{int(stream['level']):02d}M.08", codecs
        # Exactly the source's frames, each once, in order, across every chunk boundary.
        assert read_counters(directory / "index.m3u8", width=rung.width) == list(range(total))
        found = packets(whole)
        assert len(found) == total
        first = found[0][0]
        duration = found[-1][0] - first + 1 / FPS
        assert abs(duration - SECONDS) < 2 / FPS, duration
        # Its keyframes: every chunk's GOP from the chunk's first frame, nowhere else.
        keyframes = [pts - first for pts, key in found if key]
        assert keyframes == pytest.approx(grid, abs=1e-3), rung.name
        # Every segment starts on a keyframe, and the playlist's durations are the real ones:
        # each segment is one GOP, the grid above.
        starts = []
        for uri, _ in segments:
            head = tmp_path / f"{rung.name}_{uri}.mp4"
            head.write_bytes((directory / "init.mp4").read_bytes() + (directory / uri).read_bytes())
            pts, key = packets(head)[0]
            assert key, f"{rung.name}/{uri} does not start with a keyframe"
            starts.append(pts - first)
        assert starts == pytest.approx(grid, abs=1e-3)
        ends = [*starts[1:], duration]
        for (uri, extinf), start, end in zip(segments, starts, ends, strict=True):
            assert abs(extinf - (end - start)) < 1e-3, (rung.name, uri, extinf, end - start)
        playlist = parse_media_playlist(directory / "index.m3u8")
        longest = max(extinf for _, extinf in segments)
        assert longest <= plan.segment_seconds + 1e-3
        assert playlist["target_duration"] == round(longest)
        assert abs(sum(extinf for _, extinf in segments) - SECONDS) < 2 / FPS
    # The H.264 ladder is there beside it, every frame of it.
    for rung in plan.rungs:
        playlist = local / "hls" / rung.name / "index.m3u8"
        assert read_counters(playlist, width=rung.width) == list(range(total)), rung.name

    # Each chunk decoded once: its lead piece's job encoded every rendition of it, AV1 too;
    # the piece jobs' leases carry the AV1 budget.
    jobs = await rig.pool.fetch(
        "SELECT kind, payload, result, timeout_seconds FROM job_history"
        " WHERE payload->>'asset_id' = $1 AND status = 'succeeded'",
        str(asset_id),
    )
    video = [j for j in jobs if j["kind"] == "chunk_encode" and j["payload"]["piece"] != "audio"]
    assert len(video) == plan.chunking.count * len(plan.renditions)
    encoded = sorted(
        sorted(j["result"]["pieces"]) for j in video if j["result"]["outcome"] == "encoded"
    )
    assert encoded == sorted(
        sorted(chunk_pieces.video_piece(r, i) for r in plan.renditions)
        for i in range(plan.chunking.count)
    )
    media = rig.config.media
    for job in video:
        index = int(job["payload"]["piece"].rsplit(":", 1)[1])
        span = max(plan.chunking.chunk_seconds, plan.chunking.span(index))
        h264_only = chunk_pieces.piece_timeout(
            plan, span, media.process_timeout_seconds, media.process_timeout_per_media_second
        )
        extra = media.av1.process_timeout_per_media_second * span
        assert job["timeout_seconds"] == pytest.approx(h264_only + extra)
