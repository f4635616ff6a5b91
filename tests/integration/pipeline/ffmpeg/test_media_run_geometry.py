"""Geometry through the media DAG, judged from the outputs with ffprobe: an anamorphic
source comes out square-pixelled at its display aspect, a variable-rate one constant-rate
with its audio in sync. (Rotation, odd sizes and video-only sources: test_media_run.py.)"""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio

from aivedio.config.media import MediaConfig, RungConfig
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media.ffmpeg_args import Layout
from tests.support import media_fixtures as mf

MEDIA = MediaConfig(ladder=[RungConfig(height=240), RungConfig(height=144)], segment_seconds=1)


def run(source: Path, root: Path) -> Report:
    async def main() -> Report:
        return await MediaRun(Sandbox(MEDIA), source, root).run(wants=["playback", "hls"])

    report = anyio.run(main)
    assert report.verdict.valid, report.verdict
    assert all(n.status == "done" for n in report.nodes.values()), report.failed()
    return report


def streams(path: Path, kind: str) -> list[dict[str, Any]]:
    return [s for s in mf.ffprobe_streams(path) if s["codec_type"] == kind]


def test_an_anamorphic_source_comes_out_square_pixelled_at_its_display_aspect(
    tmp_path: Path,
) -> None:
    source = mf.anamorphic_mp4(tmp_path, sar="4/3")  # 320x240 shown as 427x240 (16:9)
    [stored] = streams(source, "video")
    assert stored["sample_aspect_ratio"] == "4:3"
    report = run(source, tmp_path / "run")
    assert report.plan is not None and report.plan.mode == "transcode"
    layout = Layout(tmp_path / "run")
    outputs = [layout.playback] + [layout.hls_rung(r) / "index.m3u8" for r in report.plan.rungs]
    for path in outputs:
        [video] = streams(path, "video")
        assert video.get("sample_aspect_ratio", "1:1") in ("1:1", "0:1"), path
        aspect = Fraction(int(video["width"]), int(video["height"]))
        assert abs(float(aspect) - 16 / 9) < 0.02, (path, aspect)
        assert int(video["width"]) % 2 == 0 and int(video["height"]) % 2 == 0


def test_a_variable_rate_source_comes_out_constant_rate_with_its_audio_in_sync(
    tmp_path: Path,
) -> None:
    source = mf.vfr_with_audio(tmp_path)
    [stored] = streams(source, "video")
    assert Fraction(stored["avg_frame_rate"]) != Fraction(stored["r_frame_rate"])  # variable
    report = run(source, tmp_path / "run")
    assert report.verdict.media is not None and report.verdict.media.variable_frame_rate
    playback = Layout(tmp_path / "run").playback
    [video] = streams(playback, "video")
    [audio] = streams(playback, "audio")
    rate = Fraction(video["avg_frame_rate"])
    assert rate == Fraction(video["r_frame_rate"]) and rate.denominator == 1
    # Constant: every frame one period apart.
    times = mf.frame_times(playback)
    gaps = {round(b - a, 3) for a, b in pairwise(times)}
    assert max(gaps) - min(gaps) <= 0.002, gaps
    # In sync: both tracks start together and last as long (within a frame and an AAC
    # frame), as they did in the source.
    assert abs(float(video["start_time"]) - float(audio["start_time"])) <= 0.05
    video_seconds = float(video["duration"])
    assert abs(video_seconds - float(audio["duration"])) <= 1 / float(rate) + 0.05
    assert abs(video_seconds - 2.0) <= 0.1
