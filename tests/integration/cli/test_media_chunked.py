"""``aivedio process`` on a source past the chunk threshold: the fleet's chunked path, run
by the CLI with local processes, shown in its printed plan and checked frame by frame."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import msgspec
import pytest

from aivedio.pipeline.media.plan import Plan
from tests.support.hls_check import check_hls
from tests.support.media_fixtures import counted_av, read_counters

FPS = 24
SECONDS = 40
PIECE = re.compile(r"encode\[[\w+]+:\d+\]")

CONFIG = """
[worker.lanes.media]
slots = 2

[media]
segment_seconds = 1.0
chunk_threshold_seconds = 30.0
chunk_seconds = 10.0
x264_preset = "ultrafast"
scratch_dir = "{scratch}"

[[media.ladder]]
height = 240

[[media.ladder]]
height = 180
"""


@pytest.mark.timeout(300)
def test_cli_process_takes_the_chunked_path_and_keeps_every_frame(tmp_path: Path) -> None:
    # yuv444p: every rung is encoded, so every rung comes from the chunks.
    source = counted_av(tmp_path, seconds=SECONDS, fps=FPS, keyint=47, pix_fmt="yuv444p")
    (tmp_path / "scratch").mkdir()
    config = tmp_path / "aivedio.toml"
    config.write_text(CONFIG.format(scratch=tmp_path / "scratch"))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env["AIVEDIO_CONFIG"] = str(config)
    argv = [
        sys.executable,
        "-m",
        "aivedio",
        "process",
        str(source),
        "--out",
        str(out),
        "--only",
        "playback,poster,hls,keyframes",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)

    plan = msgspec.convert(summary["plan"], Plan)
    assert plan.mode == "transcode" and plan.path == "chunked"
    assert plan.chunking is not None and plan.chunking.count >= 3
    assert sum(plan.chunking.frames) == SECONDS * FPS
    assert all(summary["nodes"][n]["status"] == "done" for n in ("playback", "hls", "keyframes"))

    # The same steps a fleet runs as jobs: one split, every (chunk, rung) piece of a chunk
    # from one decode of it, the audio once, one join per rung; the encodes ran side by side
    # (two media slots).
    ffmpeg = [p for p in summary["processes"] if p["tool"] == "ffmpeg"]
    pieces = [p for p in ffmpeg if PIECE.fullmatch(p["step"])]
    rungs = "+".join(rung.name for rung in plan.rungs)
    assert sorted(p["step"] for p in pieces) == sorted(
        f"encode[{rungs}:{index}]" for index in range(plan.chunking.count)
    )
    steps = [p["step"] for p in ffmpeg]
    assert steps.count("split") == 1 and steps.count("audio") == 1
    joins = [p for p in ffmpeg if p["step"].startswith("join[")]
    assert sorted(p["step"] for p in joins) == sorted(f"join[{r.name}]" for r in plan.rungs)
    # Two media slots: some encode started before another one had ended.
    spans = sorted(
        (p["started_seconds"], p["started_seconds"] + p["wall_seconds"])
        for p in pieces + [p for p in ffmpeg if p["step"] == "audio"]
    )
    assert any(later[0] < earlier[1] for earlier, later in pairwise(spans)), spans
    # The split came first and each join after every piece.
    split = next(p for p in ffmpeg if p["step"] == "split")
    assert all(split["started_seconds"] + split["wall_seconds"] <= s for s, _ in spans)
    last_piece = max(end for _, end in spans)
    assert all(j["started_seconds"] >= last_piece for j in joins)

    assert check_hls(out / "hls" / "master.m3u8") == []
    every_frame = list(range(SECONDS * FPS))
    for rung in plan.rungs:
        playlist = out / "hls" / rung.name / "index.m3u8"
        assert read_counters(playlist, width=rung.width) == every_frame, rung.name
    assert read_counters(out / "playback.mp4", width=plan.top.width) == every_frame
    # Nothing of the chunked work lands in the outputs.
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert not [name for name in written if "chunk" in name or name.endswith(".nut")]
    assert list((tmp_path / "scratch").iterdir()) == []
