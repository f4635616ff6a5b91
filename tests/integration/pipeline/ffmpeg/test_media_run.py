"""The media DAG end to end on generated sources: ``MediaRun`` and ``aivedio process``.

Every source is generated once (``MediaCache``) and every DAG run is made once per module
(``Runs``) and inspected by plain synchronous tests; a run is only made when a selected
test asks for it. Most runs use a reduced ladder (360/240, 1 s segments); the 720p case
runs the default ladder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog

from aivedio.cli import main as cli
from aivedio.config.media import LoudnessConfig, MediaConfig, RungConfig
from aivedio.errors import RenderError
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media import ffmpeg_args
from aivedio.pipeline.media.ffmpeg_args import Layout
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.validate import MediaSummary
from tests.support import media_fixtures as mf
from tests.support.hls_check import check_hls

# Loudness normalization off: these runs hold the DAG's copies to the source's own
# bitstreams (test_media_run_loudness.py holds the normalization).
QUIET = LoudnessConfig(normalize=False)
SMALL = MediaConfig(
    ladder=[RungConfig(height=360), RungConfig(height=240)], segment_seconds=1, loudness=QUIET
)
DEFAULT = MediaConfig(loudness=QUIET)
REQUIRED = {"playback", "poster"}
ALL_OUTPUTS = {"playback", "poster", "hls", "proxy", "sprite", "waveform", "keyframes"}


def mpeg4_720p(directory: Path) -> Path:
    """1280x720 MPEG-4 Part 2 + AAC-LC in MP4, 24 fps, 2 s: a 720p source that must be
    transcoded (its video codec), cheap to make."""
    out = directory / "mpeg4_720p.mp4"
    mf.run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=1280x720:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-map", "0:v", "-map", "1:a", "-c:v", "mpeg4", "-q:v", "5", "-g", "24"),
        *("-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


# name -> (generator, media config)
CASES: dict[str, tuple[Any, MediaConfig]] = {
    "remux": (mf.h264_moov_at_end, SMALL),  # 640x360 H.264 + AAC, moov at the end
    "no_audio": (mf.no_audio_mp4, SMALL),  # H.264 only: remuxable
    "hevc": (mf.hevc_mkv, SMALL),
    "vp9": (mf.vp9_webm, SMALL),
    "yuv444p": (mf.yuv444p_mp4, SMALL),  # also the transcode case without audio
    "rotated": (mf.rotated_90_mp4, SMALL),
    "vfr": (mf.vfr_mp4, SMALL),
    "odd": (mf.odd_dimensions_mp4, SMALL),
    "720p": (mpeg4_720p, DEFAULT),
}
# name -> (a transcode reason that must be given, does the source have audio)
TRANSCODE: dict[str, tuple[str, bool]] = {
    "hevc": ("video_codec:hevc", True),
    "vp9": ("video_codec:vp9", True),
    "yuv444p": ("pix_fmt:yuv444p", False),
    "rotated": ("rotation:", True),
    "vfr": ("variable_frame_rate", False),
    "odd": ("odd_dimensions", False),
    "720p": ("video_codec:mpeg4", True),
}
HAS_AUDIO = {"remux": True, "no_audio": False} | {k: v[1] for k, v in TRANSCODE.items()}


# -- running ----------------------------------------------------------------------------------


def run_dag(
    source: Path,
    root: Path,
    media: MediaConfig,
    *,
    wants: list[str] | None = None,
    summary: MediaSummary | None = None,
) -> Report:
    async def main() -> Report:
        run = MediaRun(Sandbox(media), source, root)
        if summary is not None:
            run.assume_valid(summary)
        return await run.run(wants=wants)

    return anyio.run(main)


@dataclass
class Done:
    name: str
    source: Path
    report: Report
    layout: Layout
    media: MediaConfig

    @property
    def out(self) -> Path:
        return self.layout.out

    @property
    def plan(self) -> Plan:
        assert self.report.plan is not None, self.report.verdict
        return self.report.plan

    @property
    def summary(self) -> MediaSummary:
        media = self.report.verdict.media
        assert media is not None
        return media


class Runs:
    """Sources and DAG runs, each made once, on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache = mf.MediaCache(root / "sources")
        self._done: dict[str, Done] = {}

    def source(self, name: str) -> Path:
        generator, _ = CASES[name]
        path: Path = self.cache.get(name, generator)
        return path

    def get(self, name: str) -> Done:
        if name not in self._done:
            _, media = CASES[name]
            source = self.source(name)
            root = self.root / "runs" / name
            report = run_dag(source, root, media)
            self._done[name] = Done(name, source, report, Layout(root), media)
        return self._done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("media-process"))


# -- tools ------------------------------------------------------------------------------------


def probe(path: Path) -> dict[str, Any]:
    return mf.ffprobe_json(path)


def video_stream(info: dict[str, Any]) -> dict[str, Any]:
    videos: list[dict[str, Any]] = [s for s in info["streams"] if s["codec_type"] == "video"]
    assert len(videos) == 1, videos
    return videos[0]


def audio_streams(info: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in info["streams"] if s["codec_type"] == "audio"]


stream_md5 = mf.stream_md5


def video_packet_flags(path: Path) -> list[str]:
    argv = [mf.FFPROBE, "-v", "error", "-select_streams", "v:0"]
    argv += ["-show_entries", "packet=flags", "-of", "csv=p=0", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return [line.strip().rstrip(",") for line in proc.stdout.splitlines() if line.strip()]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_jpeg(path: Path) -> bool:
    return path.read_bytes()[:3] == b"\xff\xd8\xff"


def image_size(path: Path) -> tuple[int, int]:
    video = video_stream(probe(path))
    return int(video["width"]), int(video["height"])


def moov_before_mdat(path: Path) -> bool:
    boxes = mf.top_level_boxes(path)
    return "moov" in boxes and "mdat" in boxes and boxes.index("moov") < boxes.index("mdat")


def steps(done: Done | Report) -> list[str]:
    report = done.report if isinstance(done, Done) else done
    return [p.step for p in report.processes]


def assert_no_rotation(video: dict[str, Any]) -> None:
    assert "rotate" not in video.get("tags", {}), video.get("tags")
    for side in video.get("side_data_list", []):
        assert side.get("rotation", 0) in (0, 0.0), side
        assert side.get("side_data_type") != "Display Matrix", side


# -- the remux path ---------------------------------------------------------------------------


def test_remux_plan_and_faststart_playback(runs: Runs) -> None:
    done = runs.get("remux")
    assert done.report.verdict.valid
    assert done.plan.mode == "remux", done.plan.transcode_reasons
    assert done.plan.transcode_reasons == []
    assert [(r.name, r.copy) for r in done.plan.rungs] == [("360p", True), ("240p", False)]
    # The source has moov at the end; the playback copy is faststart.
    assert not moov_before_mdat(done.source)
    assert moov_before_mdat(done.layout.playback)
    assert done.report.required_done
    for name in REQUIRED:
        assert done.report.nodes[name].status == "done"
    assert done.layout.playback.is_file() and done.layout.poster.is_file()
    assert {n for n, o in done.report.nodes.items() if o.status == "done"} == ALL_OUTPUTS
    # The required set needs no encode: the first step after the scans copies the playback
    # and seeks the poster, in one process.
    after_scan = [s for s in steps(done) if not s.startswith(("inspect:", "keyframe", "audio_"))]
    assert after_scan[0] == "package+poster_seek"
    before = steps(done)[: steps(done).index(after_scan[0])]
    assert not any(step.startswith("encode") for step in before)


def test_remux_keeps_the_bitstreams(runs: Runs) -> None:
    done = runs.get("remux")
    playback = done.layout.playback
    assert stream_md5(done.source, "0:v:0") == stream_md5(playback, "0:v:0")
    assert stream_md5(done.source, "0:a:0") == stream_md5(playback, "0:a:0")
    source_video = video_stream(probe(done.source))
    video = video_stream(probe(playback))
    assert (video["width"], video["height"]) == (source_video["width"], source_video["height"])
    assert video["codec_name"] == "h264"


def test_remux_hls_copied_and_lower_rungs_are_aligned_and_decode(runs: Runs) -> None:
    done = runs.get("remux")
    master = done.layout.hls / "master.m3u8"
    assert check_hls(master, decode=True) == []
    # The copied rung carries the source's own video bitstream.
    copied = done.layout.hls / "360p"
    assert (copied / "init.mp4").is_file()
    assert sorted(copied.glob("seg_*.m4s"))


def test_remux_hls_offset_takes_the_sources_start_from_the_probe(runs: Runs) -> None:
    done = runs.get("remux")
    # What a scan of the source's first packets (every stream) finds, the plan recorded.
    argv = [
        mf.FFPROBE,
        "-v",
        "error",
        "-read_intervals",
        "%+#48",
        "-show_entries",
        "packet=pts_time,dts_time",
        "-of",
        "csv=p=0",
        str(done.source),
    ]
    text = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    stamps = [
        float(v)
        for line in text.splitlines()
        for v in line.strip().split(",")[:2]
        if v not in ("", "N/A")
    ]
    assert done.plan.source_earliest == pytest.approx(min(stamps), abs=1e-6)
    assert done.plan.source_earliest < 0  # B-frames and AAC priming: the offset matters
    # So the render scans only what it encoded: the 240p rung's video and the audio file.
    assert steps(done).count("ts_scan") == 2


def test_a_plan_recorded_without_the_sources_start_scans_it_and_gets_the_same_offset(
    runs: Runs,
) -> None:
    done = runs.get("remux")
    old = msgspec.structs.replace(done.plan, source_earliest=None)

    async def main() -> tuple[Report, list[str], float, float]:
        run = MediaRun(Sandbox(done.media), done.source, runs.root / "runs" / "old-plan")
        run.assume_valid(done.summary)
        report = await run.run(wants=["hls"], plan=old)
        ran = steps(report)
        recorded = await run._hls_offset(done.plan, has_audio=True)
        return report, ran, await run._hls_offset(old, has_audio=True), recorded

    report, ran, scanned, recorded = anyio.run(main)
    assert report.nodes["hls"].status == "done", report.failed()
    # The source too, its planned video and audio streams one scan each.
    assert ran.count("ts_scan") == 4
    assert scanned == recorded > 0


def two_audio_tracks(directory: Path) -> Path:
    """640x360 H.264 + two AAC tracks, 2 s: a remuxable source with a track nobody uses."""
    out = directory / "two_audio.mp4"
    mf.run_ffmpeg(
        *("-f", "lavfi", "-i", "testsrc2=s=640x360:r=24:d=2"),
        *("-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=2"),
        *("-f", "lavfi", "-i", "sine=frequency=880:sample_rate=48000:duration=2"),
        *("-map", "0:v", "-map", "1:a", "-map", "2:a", "-c:v", "libx264", "-bf", "2"),
        *("-c:a", "aac", "-b:a", "64k"),
        str(out),
    )
    return out


def test_the_probe_scans_every_stream_at_once_only_when_there_are_just_the_two_it_uses(
    runs: Runs,
) -> None:
    async def probe_plan(source: Path, root: Path) -> tuple[Plan | None, list[str]]:
        report = await MediaRun(Sandbox(SMALL), source, root).run(plan_only=True)
        return report.plan, steps(report)

    plan, ran = anyio.run(probe_plan, runs.get("remux").source, runs.root / "runs" / "scan-1")
    assert [s for s in ran if "scan" in s] == ["keyframe_scan"]  # video and audio together
    assert plan == runs.get("remux").plan
    source = runs.cache.get("two_audio", two_audio_tracks)
    plan, ran = anyio.run(probe_plan, source, runs.root / "runs" / "scan-2")
    # Another track's packets are never printed: a scan per stream used.
    assert [s for s in ran if "scan" in s] == ["keyframe_scan", "audio_start_scan"]
    assert plan is not None and plan.mode == "remux" and plan.source_earliest is not None
    assert plan.source_earliest < 0 and plan.cut_points is not None


def test_no_audio_remux_has_no_audio_and_a_silent_waveform(runs: Runs) -> None:
    done = runs.get("no_audio")
    assert done.plan.mode == "remux"
    assert done.plan.audio == "none"
    assert audio_streams(probe(done.layout.playback)) == []
    assert_silent_waveform(done)
    assert check_hls(done.layout.hls / "master.m3u8", decode=True) == []


# -- the transcode path -----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TRANSCODE))
def test_transcode_playback_properties(runs: Runs, name: str) -> None:
    done = runs.get(name)
    reason, has_audio = TRANSCODE[name]
    plan = done.plan
    assert plan.mode == "transcode"
    assert any(r.startswith(reason) for r in plan.transcode_reasons), plan.transcode_reasons
    assert done.report.required_done, done.report.failed()
    assert all(o.status == "done" for o in done.report.nodes.values()), done.report.failed()
    assert set(done.report.nodes) == ALL_OUTPUTS
    info = probe(done.layout.playback)
    video = video_stream(info)
    assert video["codec_name"] == "h264"
    assert video["pix_fmt"] == "yuv420p"
    width, height = int(video["width"]), int(video["height"])
    assert width % 2 == 0 and height % 2 == 0
    assert (width, height) == (plan.top.width, plan.top.height)
    assert video.get("sample_aspect_ratio", "1:1") in ("1:1", "0:1", "N/A")
    assert_no_rotation(video)
    assert Fraction(video["avg_frame_rate"]) == Fraction(video["r_frame_rate"]), video
    assert abs(float(Fraction(video["avg_frame_rate"])) - plan.frame_rate) < 0.01
    audio = audio_streams(info)
    if has_audio:
        [track] = audio
        assert (track["codec_name"], track["profile"]) == ("aac", "LC")
        assert plan.audio == "aac"
    else:
        assert audio == []
        assert plan.audio == "none"
    assert moov_before_mdat(done.layout.playback)


@pytest.mark.parametrize("name", list(TRANSCODE))
def test_transcode_hls_passes_the_checker(runs: Runs, name: str) -> None:
    done = runs.get(name)
    assert check_hls(done.layout.hls / "master.m3u8", decode=True) == []


def test_rotated_source_becomes_portrait_without_rotation_metadata(runs: Runs) -> None:
    done = runs.get("rotated")
    source = video_stream(probe(done.source))
    assert int(source["width"]) > int(source["height"])  # stored landscape
    assert done.summary.rotation in (90, 270)
    video = video_stream(probe(done.layout.playback))
    assert int(video["width"]) < int(video["height"])  # displayed portrait
    assert_no_rotation(video)
    for rung in done.plan.rungs:
        assert rung.width < rung.height
    assert image_size(done.layout.poster)[0] < image_size(done.layout.poster)[1]


def test_vfr_source_becomes_constant_frame_rate(runs: Runs) -> None:
    done = runs.get("vfr")
    assert done.summary.variable_frame_rate
    flags = video_packet_flags(done.layout.playback)
    video = video_stream(probe(done.layout.playback))
    rate = Fraction(video["avg_frame_rate"])
    assert rate == Fraction(video["r_frame_rate"])
    assert rate.denominator == 1
    # Constant: the frame count matches rate x duration.
    assert abs(len(flags) - float(rate) * done.plan.duration_seconds) <= 2


def test_odd_dimensions_become_even(runs: Runs) -> None:
    done = runs.get("odd")
    assert (done.summary.width, done.summary.height) == (639, 359)
    for rung in done.plan.rungs:
        assert rung.width % 2 == 0 and rung.height % 2 == 0
    video = video_stream(probe(done.layout.playback))
    assert int(video["width"]) % 2 == 0 and int(video["height"]) % 2 == 0


def test_720p_source_with_the_default_ladder(runs: Runs) -> None:
    done = runs.get("720p")
    assert done.media.ladder == MediaConfig().ladder
    plan = done.plan
    assert [r.name for r in plan.rungs] == ["720p", "480p", "360p"]
    assert not any(r.copy for r in plan.rungs)
    assert (plan.top.width, plan.top.height) == (1280, 720)
    assert image_size(done.layout.playback) == (1280, 720)
    assert sorted(p.name for p in done.layout.hls.iterdir() if p.is_dir()) == [
        "360p",
        "480p",
        "720p",
    ]
    assert image_size(done.layout.poster) == (1280, 720)


# -- outputs content --------------------------------------------------------------------------

CONTENT_CASES = ["remux", "hevc", "yuv444p", "rotated", "720p"]
_STREAM_INF = re.compile(
    r"^#EXT-X-STREAM-INF:BANDWIDTH=(\d+),AVERAGE-BANDWIDTH=(\d+),"
    r'CODECS="(avc1\.[0-9A-F]{6})(,mp4a\.40\.2)?",RESOLUTION=(\d+)x(\d+),'
    r"FRAME-RATE=(\d+\.\d{3})$"
)


@pytest.mark.parametrize("name", CONTENT_CASES)
def test_master_playlist_lines(runs: Runs, name: str) -> None:
    done = runs.get(name)
    lines = (done.layout.hls / "master.m3u8").read_text().splitlines()
    assert lines[0] == "#EXTM3U"
    variants = [(i, line) for i, line in enumerate(lines) if line.startswith("#EXT-X-STREAM-INF")]
    assert len(variants) == len(done.plan.rungs)
    for (index, line), rung in zip(variants, done.plan.rungs, strict=True):
        match = _STREAM_INF.match(line)
        assert match, line
        peak, average = int(match.group(1)), int(match.group(2))
        assert peak >= average > 0
        assert (match.group(4) is not None) == HAS_AUDIO[name], line
        assert (int(match.group(5)), int(match.group(6))) == (rung.width, rung.height)
        assert float(match.group(7)) > 0
        uri = lines[index + 1]
        assert uri == f"{rung.name}/index.m3u8"
        playlist = done.layout.hls / uri
        assert playlist.is_file()
        for entry in playlist.read_text().splitlines():
            if entry and not entry.startswith("#"):
                assert (playlist.parent / entry).is_file(), entry
        assert (playlist.parent / "init.mp4").is_file()


def _vtt_seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@pytest.mark.parametrize("name", CONTENT_CASES)
def test_sprite_sheets_and_vtt(runs: Runs, name: str) -> None:
    done = runs.get(name)
    sprites = done.layout.sprites
    text = (sprites / "thumbnails.vtt").read_text()
    assert text.startswith("WEBVTT")
    cues = re.findall(
        r"(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})\n(\S+)#xywh=(\d+),(\d+),(\d+),(\d+)",
        text,
    )
    assert cues
    sizes: dict[str, tuple[int, int]] = {}
    previous_end = 0.0
    for start, end, sheet, x, y, w, h in cues:
        assert abs(_vtt_seconds(start) - previous_end) < 0.0015
        previous_end = _vtt_seconds(end)
        assert previous_end > _vtt_seconds(start)
        path = sprites / sheet
        if sheet not in sizes:
            assert is_jpeg(path), sheet
            sizes[sheet] = image_size(path)
        sheet_w, sheet_h = sizes[sheet]
        x0, y0, width, height = int(x), int(y), int(w), int(h)
        assert width > 0 and height > 0
        assert x0 + width <= sheet_w and y0 + height <= sheet_h, (sheet, x, y, w, h)
    assert _vtt_seconds(cues[0][0]) == 0.0
    assert abs(previous_end - done.plan.duration_seconds) < 0.0015
    on_disk = sorted(p.name for p in sprites.glob("sprite_*.jpg"))
    assert on_disk == sorted(sizes)


def _waveforms(done: Done) -> dict[int, dict[str, Any]]:
    found = {}
    for zoom in done.plan.waveform_zooms:
        path = done.layout.waveform / f"waveform_{zoom}.json"
        found[zoom] = json.loads(path.read_text())
    return found


@pytest.mark.parametrize("name", CONTENT_CASES)
def test_waveform_documents(runs: Runs, name: str) -> None:
    done = runs.get(name)
    documents = _waveforms(done)
    assert len(documents) >= 2
    for zoom, doc in documents.items():
        assert (doc["version"], doc["channels"], doc["bits"]) == (2, 1, 8)
        assert doc["samples_per_pixel"] == zoom
        assert doc["sample_rate"] == done.plan.waveform_sample_rate
        assert len(doc["data"]) == 2 * doc["length"]
        expected = done.plan.duration_seconds * doc["sample_rate"] / zoom
        assert abs(doc["length"] - expected) <= 3 + 0.02 * expected, (zoom, doc["length"])
        assert all(-128 <= v <= 127 for v in doc["data"])
        if HAS_AUDIO[name]:
            assert any(v != 0 for v in doc["data"])  # a 440 Hz sine is not silence
    if not HAS_AUDIO[name]:
        assert_silent_waveform(done)


def assert_silent_waveform(done: Done) -> None:
    documents = _waveforms(done)
    assert len(documents) >= 2
    for zoom, doc in documents.items():
        samples = round(done.plan.duration_seconds * doc["sample_rate"])
        assert doc["length"] == math.ceil(samples / zoom)
        assert len(doc["data"]) == 2 * doc["length"]
        assert set(doc["data"]) == {0}


@pytest.mark.parametrize("name", CONTENT_CASES)
def test_keyframes_index(runs: Runs, name: str) -> None:
    done = runs.get(name)
    index = json.loads(done.layout.keyframes.read_text())
    times = [k["t"] for k in index["keyframes"]]
    assert times
    assert times == sorted(times) and len(set(times)) == len(times)
    assert abs(times[0]) < 0.05
    assert times[-1] <= done.plan.duration_seconds
    assert index["duration"] == pytest.approx(done.plan.duration_seconds)
    # The index is the playback file's key packets.
    flags = video_packet_flags(done.layout.playback)
    assert len(times) == sum(1 for f in flags if f.startswith("K"))


@pytest.mark.parametrize("name", CONTENT_CASES)
def test_poster_is_a_jpeg_of_the_top_rung_size(runs: Runs, name: str) -> None:
    done = runs.get(name)
    assert is_jpeg(done.layout.poster)
    assert image_size(done.layout.poster) == (done.plan.top.width, done.plan.top.height)


@pytest.mark.parametrize("name", CONTENT_CASES)
def test_proxy_is_faststart_with_a_short_gop(runs: Runs, name: str) -> None:
    done = runs.get(name)
    proxy = done.layout.proxy
    assert moov_before_mdat(proxy)
    assert done.plan.proxy is not None
    assert image_size(proxy) == (done.plan.proxy.width, done.plan.proxy.height)
    flags = video_packet_flags(proxy)
    keys = [i for i, f in enumerate(flags) if f.startswith("K")]
    assert keys and keys[0] == 0
    gaps = [b - a for a, b in zip(keys, [*keys[1:], len(flags)], strict=True)]
    assert max(gaps) <= done.media.proxy_gop_frames, gaps
    assert (len(audio_streams(probe(proxy))) == 1) == HAS_AUDIO[name]


@pytest.mark.parametrize("name", [*CONTENT_CASES, "no_audio", "vp9", "vfr", "odd"])
def test_output_records_match_the_files(runs: Runs, name: str) -> None:
    done = runs.get(name)
    assert set(done.report.outputs) == ALL_OUTPUTS
    for node, record in done.report.outputs.items():
        assert record.variant_type == node
        assert record.required == (node in REQUIRED)
        paths = [f.path for f in record.files]
        assert record.primary in paths
        assert len(set(paths)) == len(paths)
        for entry in record.files:
            path = done.out / entry.path
            assert path.is_file(), entry.path
            assert path.stat().st_size == entry.size > 0
            assert sha256(path) == entry.sha256, entry.path
    report = done.report.to_json()
    assert report["required_done"] is True
    json.dumps(report)  # serialisable as the CLI prints it


# -- the CLI ----------------------------------------------------------------------------------


@dataclass
class Cli:
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.stdout)
        return result


def aivedio(*args: str) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    argv = [sys.executable, "-m", "aivedio", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    return Cli(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def cli_run(runs: Runs) -> tuple[Cli, Path]:
    out = runs.root / "cli-out"
    return aivedio("process", str(runs.source("hevc")), "--out", str(out)), out


def test_cli_process_prints_plan_outputs_nodes_and_processes(cli_run: tuple[Cli, Path]) -> None:
    run, out = cli_run
    assert run.code == 0, run.stderr
    summary = run.summary
    assert summary["plan"]["mode"] == "transcode"
    assert summary["required_done"] is True
    assert Path(summary["out"]) == out.resolve()
    assert set(summary["outputs"]) == ALL_OUTPUTS
    assert set(summary["nodes"]) == ALL_OUTPUTS
    for node in summary["nodes"].values():
        assert node["status"] == "done"
        assert isinstance(node["seconds"], int | float) and node["seconds"] >= 0
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    listed = set()
    for record in summary["outputs"].values():
        for entry in record["files"]:
            listed.add(entry["path"])
            path = out / entry["path"]
            assert path.stat().st_size == entry["size"]
            assert sha256(path) == entry["sha256"]
    assert written == listed
    ffmpeg = [p for p in summary["processes"] if p["tool"] == "ffmpeg"]
    assert ffmpeg and any(p["step"].startswith("encode[") for p in ffmpeg)
    for process in summary["processes"]:
        assert process["wall_seconds"] > 0
        assert process["returncode"] == 0
    for process in ffmpeg:
        assert isinstance(process["cpu_seconds"], int | float) and process["cpu_seconds"] >= 0
        assert isinstance(process["max_rss_bytes"], int) and process["max_rss_bytes"] > 0
    assert summary["wall_seconds"] > 0


def test_cli_process_refuses_an_html_page_and_writes_nothing(runs: Runs) -> None:
    source = runs.cache.get("html", mf.html_error_page)
    out = runs.root / "cli-html"
    run = aivedio("process", str(source), "--out", str(out))
    assert run.code == 5, run.stderr
    summary = run.summary
    assert summary["verdict"]["verdict"] == "invalid"
    assert summary["verdict"]["error_class"] == "invalid_media"
    assert summary["outputs"] == {}
    assert not out.exists() or list(out.iterdir()) == []


def test_cli_process_runs_the_decode_check_beside_the_outputs_and_keeps_none_that_fail_it(
    runs: Runs,
) -> None:
    source = runs.cache.get("tail", mf.tail_corrupted)
    out = runs.root / "cli-tail"
    run = aivedio("process", str(source), "--out", str(out), "--only", "playback,poster")
    assert run.code == 5, run.stderr
    summary = run.summary
    assert summary["verdict"]["reasons"] == ["decode_failed"]
    assert summary["outputs"] == {}
    assert not out.exists() or list(out.iterdir()) == []
    # The check ran beside the outputs: started with them, after the probe.
    steps = {p["step"]: p for p in summary["processes"]}
    assert "inspect:ffmpeg" in steps and "inspect:ffprobe" in steps


def test_cli_process_refuses_a_non_empty_out(runs: Runs) -> None:
    out = runs.root / "cli-busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run = aivedio("process", str(runs.source("no_audio")), "--out", str(out))
    assert run.code == 2
    assert run.stdout == ""
    assert "not empty" in run.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"


def test_cli_process_only_writes_the_selected_outputs(runs: Runs) -> None:
    out = runs.root / "cli-only"
    run = aivedio(
        "process", str(runs.source("remux")), "--out", str(out), "--only", "playback,poster"
    )
    assert run.code == 0, run.stderr
    summary = run.summary
    assert set(summary["outputs"]) == {"playback", "poster"}
    assert set(summary["nodes"]) == {"playback", "poster"}
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == ["playback.mp4", "poster.jpg"]
    assert not any(p["step"].startswith("encode[") for p in summary["processes"])


# -- failure isolation ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sprite_finalize_fails(runs: Runs) -> Report:
    """The HEVC source with sprite verification forced to fail."""
    source = runs.source("hevc")

    async def broken(self: MediaRun, *args: object, **kwargs: object) -> Any:
        raise RenderError("sprite: forced failure for the test")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MediaRun, "_finalize_sprite", broken)
        report = run_dag(source, runs.root / "runs" / "sprite-finalize", SMALL)
    return report  # the patch ends here, not at the end of the module


def test_failed_optional_node_does_not_block_the_required_set(
    sprite_finalize_fails: Report,
) -> None:
    report = sprite_finalize_fails
    assert report.required_done
    sprite = report.nodes["sprite"]
    assert (sprite.status, sprite.error_class) == ("failed", "render_failed")
    assert "forced failure" in (sprite.detail or "")
    assert "sprite" not in report.outputs
    names = steps(report)
    combined = "encode[hls,keyframes,playback,poster,proxy,sprite,waveform]"
    assert names.count(combined) == 1
    # Sprite is retried alone after the combined pass, and fails alone.
    assert "encode[sprite]" in names[names.index(combined) + 1 :]
    for node in ("playback", "poster", "hls", "proxy", "keyframes"):
        assert report.nodes[node].status == "done", report.nodes[node]


def test_every_other_optional_node_is_done_when_sprite_fails(sprite_finalize_fails: Report) -> None:
    report = sprite_finalize_fails
    failed = {n.name: n.detail for n in report.failed()}
    assert failed.keys() == {"sprite"}, failed


@pytest.fixture(scope="module")
def sprite_encode_fails(runs: Runs) -> Report:
    """The HEVC source with the sprite branch of the filter graph made invalid, so that
    every ffmpeg encode pass that includes the sprite fails."""
    source = runs.source("hevc")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ffmpeg_args, "sprite_filter", lambda **_: "no_such_filter_for_the_test")
        report = run_dag(source, runs.root / "runs" / "sprite-encode", SMALL)
    return report


def test_failed_shared_pass_is_retried_required_first_then_one_by_one(
    sprite_encode_fails: Report,
) -> None:
    report = sprite_encode_fails
    records = [p for p in report.processes if p.step.startswith("encode[")]
    names = [p.step for p in records]
    assert names == [
        "encode[hls,keyframes,playback,poster,proxy,sprite,waveform]",
        "encode[playback,poster]",
        "encode[hls]",
        "encode[proxy]",
        "encode[sprite]",
        "encode[waveform]",
    ]
    assert records[0].returncode != 0
    assert records[1].returncode == 0
    assert report.required_done
    assert report.nodes["sprite"].status == "failed"
    assert report.nodes["sprite"].error_class == "render_failed"
    for node in ("playback", "poster", "waveform", "keyframes"):
        assert report.nodes[node].status == "done", report.nodes[node]


def test_optional_nodes_retried_alone_succeed(sprite_encode_fails: Report) -> None:
    report = sprite_encode_fails
    failed = {n.name: n.detail for n in report.failed()}
    assert failed.keys() == {"sprite"}, failed


def test_required_node_failing_makes_the_cli_exit_4(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in [k for k in os.environ if k.startswith("AIVEDIO_")]:
        monkeypatch.delenv(key)
    original = MediaRun._finalize

    async def finalize(self: MediaRun, node: str, plan: Plan, summary: MediaSummary) -> Any:
        if node == "playback":
            raise RenderError("playback: forced failure for the test")
        return await original(self, node, plan, summary)

    monkeypatch.setattr(MediaRun, "_finalize", finalize)
    out = runs.root / "cli-required-fails"
    saved = structlog.get_config()
    try:
        code = cli.main(["process", str(runs.source("no_audio")), "--out", str(out)])
    finally:
        structlog.configure(**saved)  # the CLI configures structlog for the whole process
    summary = json.loads(capsys.readouterr().out)
    assert code == 1
    assert summary["required_done"] is False
    assert summary["nodes"]["playback"]["status"] == "failed"
    assert summary["nodes"]["playback"]["error_class"] == "render_failed"
    assert "playback" not in summary["outputs"]
    assert not (out / "playback.mp4").exists()


# -- resource exhaustion ----------------------------------------------------------------------

TIGHT = MediaConfig(
    ladder=[RungConfig(height=360), RungConfig(height=240)],
    segment_seconds=1,
    process_timeout_seconds=0.03,  # below an encode of the 720p clip on a fast host
    process_timeout_per_media_second=0,
    loudness=QUIET,
)


@pytest.fixture(scope="module")
def deadline_run(runs: Runs) -> Report:
    # The verdict is taken under the ordinary deadlines; only the render gets 0.03 s.
    summary = runs.get("720p").summary
    return run_dag(runs.source("720p"), runs.root / "runs" / "deadline", TIGHT, summary=summary)


def test_deadline_kills_the_encode_and_is_not_invalid_media(deadline_run: Report) -> None:
    report = deadline_run
    assert report.verdict.valid
    assert not report.required_done
    first = next(p for p in report.processes if p.step.startswith("encode["))
    assert first.step == "encode[hls,keyframes,playback,poster,proxy,sprite,waveform]"
    assert first.returncode < 0  # killed at the deadline
    assert report.nodes["playback"].status == "failed"
    classes = {n.error_class for n in report.failed()}
    assert "invalid_media" not in classes


def test_deadline_failures_are_resource_exhausted(deadline_run: Report) -> None:
    report = deadline_run
    playback = report.nodes["playback"]
    assert playback.error_class == "resource_exhausted", playback.detail
    for node in report.failed():
        if node.name != "keyframes":  # keyframes fails for want of a playback file
            assert node.error_class == "resource_exhausted", (node.name, node.detail)


# -- scratch directories ----------------------------------------------------------------------


def test_relative_scratch_dir_works(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    media = msgspec.structs.replace(SMALL, scratch_dir="scratch")
    source = runs.source("hevc")

    async def main() -> Report:
        sandbox = Sandbox(media)
        with sandbox.scratch() as root:
            run = MediaRun(sandbox, source, root)
            return await run.run(wants=["playback", "poster"])

    report = anyio.run(main)
    assert report.required_done, [(n.name, n.detail) for n in report.failed()]


# -- regressions from review ------------------------------------------------------------------


def _lavfi_h264(path: Path, *extra: str, seconds: int = 6) -> Path:
    subprocess.run(
        [
            "ffmpeg",
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            f"testsrc2=s=320x240:r=24:d={seconds}",
            "-f",
            "lavfi",
            "-i",
            f"sine=d={seconds}",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
            "-x264-params",
            "cabac=1:8x8dct=1",
            *extra,
            "-c:a",
            "aac",
            "-shortest",
            str(path),
        ],
        check=True,
    )
    return path


def test_sparse_source_keyframes_still_align_every_rendition(tmp_path: Path) -> None:
    # One keyframe in 6 s: the copied rung has one segment, and the encoded rungs must not
    # grow keyframes (and so segments) of their own.
    source = _lavfi_h264(tmp_path / "sparse.mp4", "-g", "1000", "-sc_threshold", "0")
    media = MediaConfig(
        ladder=[RungConfig(height=240), RungConfig(height=180)], segment_seconds=2.0
    )
    report = run_dag(source, tmp_path / "run", media, wants=["playback", "hls"])
    assert report.plan is not None and report.plan.mode == "remux"
    assert report.required_done and report.nodes["hls"].status == "done"
    assert check_hls(Layout(tmp_path / "run").hls / "master.m3u8") == []


def test_a_source_not_starting_at_zero_is_transcoded_and_aligned(tmp_path: Path) -> None:
    # Cut points are source times and forced keyframes output times: a remux is only
    # planned when they agree (start within half a frame of zero).
    shifted = _lavfi_h264(tmp_path / "plain.mp4", "-g", "24")
    late = tmp_path / "late.mp4"
    subprocess.run(
        [
            "ffmpeg",
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-itsoffset",
            "0.2",
            "-i",
            str(shifted),
            "-c",
            "copy",
            str(late),
        ],
        check=True,
    )
    media = MediaConfig(
        ladder=[RungConfig(height=240), RungConfig(height=180)], segment_seconds=2.0
    )
    report = run_dag(late, tmp_path / "run", media, wants=["playback", "hls"])
    assert report.plan is not None and report.verdict.media is not None
    assert report.verdict.media.start_time > 0.1
    assert "start_time" in report.plan.transcode_reasons
    assert report.nodes["hls"].status == "done"
    assert check_hls(Layout(tmp_path / "run").hls / "master.m3u8") == []


# -- which streams: the verdict's choice, in every output --------------------------------------


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv444p"], ids=["remux", "transcode"])
def test_of_twenty_audio_tracks_the_default_one_is_in_every_output(
    runs: Runs, pix_fmt: str
) -> None:
    # The third audio track (stream 3) has the default disposition; its sine is 500 Hz and
    # its language "deu", every other track's differs.
    source = runs.cache.get(f"tagged_x20_{pix_fmt}", mf.tagged_audio_streams, pix_fmt=pix_fmt)
    root = runs.root / "runs" / f"tagged_{pix_fmt}"
    report = run_dag(source, root, SMALL)
    assert report.verdict.valid, report.verdict
    assert report.plan is not None and report.plan.audio_stream == 3
    assert report.plan.mode == ("remux" if pix_fmt == "yuv420p" else "transcode")
    assert all(node.status == "done" for node in report.nodes.values()), report.failed()
    layout = Layout(root)
    want = mf.audio_tone_hz(2)
    for output in (layout.playback, layout.proxy):
        [track] = audio_streams(probe(output))
        assert track["tags"]["language"] == "deu", output
        assert mf.tone_of(output) == pytest.approx(want, abs=10), output
    assert report.plan.rungs
    for rung in report.plan.rungs:
        assert mf.tone_of(layout.hls_rung(rung) / "index.m3u8") == pytest.approx(want, abs=10)
    assert check_hls(layout.hls / "master.m3u8") == []


def test_of_two_video_streams_the_default_one_is_published(runs: Runs) -> None:
    source = runs.cache.get("two_videos", mf.two_video_streams)
    root = runs.root / "runs" / "two_videos"
    report = run_dag(source, root, SMALL, wants=["playback", "poster", "hls"])
    assert report.plan is not None and report.plan.video_stream == 1
    assert report.required_done and report.nodes["hls"].status == "done", report.failed()
    layout = Layout(root)
    assert image_size(layout.playback) == (480, 270)  # stream 0 is 320x240
    assert stream_md5(layout.playback, "0:v:0") == stream_md5(source, "0:1")  # remuxed
    assert image_size(layout.poster) == (480, 270)


def test_a_16x16_source_makes_every_output(runs: Runs) -> None:
    source = runs.cache.get("sized_16x16", mf.sized_video, width=16, height=16)
    root = runs.root / "runs" / "sized_16x16"
    report = run_dag(source, root, SMALL)
    assert report.verdict.valid, report.verdict
    assert all(node.status == "done" for node in report.nodes.values()), report.failed()
    assert image_size(Layout(root).playback) == (16, 16)


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [
        ("1x1", lambda d: mf.sized_video(d, width=1, height=1), "dimensions_too_small:1x1"),
        (
            "4000x2",
            lambda d: mf.sized_video(d, width=4000, height=2),
            "dimensions_too_small:4000x2",
        ),
        ("0.05s", lambda d: mf.short_clip(d, video_seconds=0.05), "duration_too_short"),
        # A 2x2 playback and a failed proxy (1x1), and a poster from past the one frame of
        # a 3 s file: refused before any of it now.
        (
            "frame_under_audio",
            lambda d: mf.short_clip(d, video_seconds=0.04, audio_seconds=3),
            "video_duration_too_short",
        ),
    ],
)
def test_a_source_under_the_minimums_is_refused_before_any_render(
    runs: Runs, name: str, make: Any, reason: str
) -> None:
    source = runs.cache.get(f"small_{name}", make)
    root = runs.root / "runs" / f"small_{name}"
    report = run_dag(source, root, SMALL)
    assert report.verdict.reasons == [reason]
    assert report.plan is None and report.nodes == {}
    assert not Layout(root).out.exists() or not any(Layout(root).out.iterdir())


# -- what the caller's recording of an output may raise ---------------------------------------


def _run_recording(source: Path, root: Path, raised: Exception) -> Report:
    async def on_done(record: Any) -> None:
        if record.variant_type == "poster":
            raise raised

    async def main() -> Report:
        run = MediaRun(Sandbox(SMALL), source, root, on_done=on_done)
        return await run.run(wants=["playback", "poster"])

    return anyio.run(main)


def test_an_output_its_caller_cannot_record_fails_alone(runs: Runs) -> None:
    report = _run_recording(
        runs.source("remux"), runs.root / "runs" / "record-fails", RenderError("upload refused")
    )
    assert report.nodes["poster"].status == "failed"
    assert "poster" not in report.outputs
    assert report.nodes["playback"].status == "done"


def test_a_database_failure_while_recording_stops_the_run_instead_of_failing_the_output(
    runs: Runs,
) -> None:
    """The database being down is not the output's fault: the run stops with the error (the
    job retries it with the database's retry class) and no node is marked failed for it."""
    from aivedio.errors import DatabaseError

    with pytest.raises(DatabaseError, match="checking the revision"):
        _run_recording(
            runs.source("remux"),
            runs.root / "runs" / "record-database",
            DatabaseError("checking the revision: connection lost"),
        )


def test_cli_process_draws_its_progress_on_a_terminal_only(runs: Runs) -> None:
    """On a TTY the render's percentage is redrawn on one line, then cleared before the
    summary; piped (every other test here), stdout is the JSON alone."""
    import pty

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    out = runs.root / "cli-tty"
    argv = [sys.executable, "-m", "aivedio", "process", str(runs.source("hevc")), "--out", str(out)]
    argv += ["--only", "playback,poster"]
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(argv, stdout=secondary, stderr=subprocess.DEVNULL, env=env)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert proc.wait(timeout=120) == 0
    text = seen.decode()
    drawn = [int(p) for p in re.findall(r"\rrendering +(\d+)%", text)]
    assert drawn and drawn == sorted(set(drawn)) and all(0 <= p <= 99 for p in drawn)
    progress, _, summary = text.rpartition("\r\x1b[K")
    assert progress and json.loads(summary)["required_done"] is True
