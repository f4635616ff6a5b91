"""``aivedio process`` on a source past the chunk threshold with the AV1 ladder on (the
pipeline version has it; the CLI has no tenant): the same plan as the fleet's, so the AV1
renditions come from the chunks too, encoded in each chunk's one decode with its H.264
renditions. A remux source: the AV1 twin of the copied top rung is encoded from the chunks
while its H.264 rung stays the source's own bitstream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from aivedio.pipeline.media.plan import Plan
from tests.support.hls_check import check_hls, parse_master, unquote
from tests.support.media_fixtures import counted_av, read_counters

FPS = 24
SECONDS = 12

CONFIG = """
[worker.lanes.media]
slots = 2

[media]
segment_seconds = 1.0
chunk_threshold_seconds = 6.0
chunk_seconds = 3.0
x264_preset = "ultrafast"
scratch_dir = "{scratch}"

[media.av1]
from_pipeline_version = 1
preset = 12

[[media.ladder]]
height = 240

[[media.ladder]]
height = 180
"""


@pytest.mark.timeout(300)
def test_cli_process_gives_a_chunked_remux_the_av1_ladder_from_the_chunks(
    tmp_path: Path,
) -> None:
    source = counted_av(tmp_path, seconds=SECONDS, fps=FPS, keyint=47, pix_fmt="yuv420p")
    (tmp_path / "scratch").mkdir()
    config = tmp_path / "aivedio.toml"
    config.write_text(CONFIG.format(scratch=tmp_path / "scratch"))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env["AIVEDIO_CONFIG"] = str(config)
    argv = [sys.executable, "-m", "aivedio", "process", str(source), "--out", str(out)]
    argv += ["--only", "playback,hls"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)

    plan = msgspec.convert(summary["plan"], Plan)
    assert (plan.mode, plan.path) == ("remux", "chunked") and plan.top.copy
    assert plan.chunking is not None and plan.chunking.count >= 3
    assert [r.name for r in plan.av1_rungs] == ["av1_240p", "av1_180p"]
    # Each chunk's pieces from one decode of it, the AV1 ones with the H.264 one; one join
    # per rendition made from chunks (the copied rung is the source's own).
    steps = [p["step"] for p in summary["processes"] if p["tool"] == "ffmpeg"]
    pieces = sorted(s for s in steps if s.startswith("encode["))
    expected = [f"encode[180p+av1_240p+av1_180p:{i}]" for i in range(plan.chunking.count)]
    assert pieces == sorted(expected)
    joins = sorted(s for s in steps if s.startswith("join["))
    assert joins == ["join[180p]", "join[av1_180p]", "join[av1_240p]"]

    master = out / "hls" / "master.m3u8"
    assert check_hls(master, decode=True) == []
    codecs = {
        entry["uri"].split("/")[0]: unquote(entry["attributes"]["CODECS"]) or ""
        for entry in parse_master(master)
        if entry["kind"] == "variant"
    }
    assert list(codecs) == ["240p", "180p", "av1_240p", "av1_180p"]
    assert codecs["240p"].startswith("avc1.") and codecs["180p"].startswith("avc1.")
    assert codecs["av1_240p"].startswith("av01.") and codecs["av1_180p"].startswith("av01.")
    every_frame = list(range(SECONDS * FPS))
    for rung in plan.renditions:
        playlist = out / "hls" / rung.name / "index.m3u8"
        assert read_counters(playlist, width=rung.width) == every_frame, rung.name
    assert list((tmp_path / "scratch").iterdir()) == []
