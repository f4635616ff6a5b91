"""Colour through the media DAG, judged from the outputs with ffprobe: HDR (PQ, HLG) comes
out tone-mapped SDR BT.709, an untagged source comes out tagged BT.709 limited, 10-bit SDR
comes out 8-bit 4:2:0 High, and an HDR source is never copied into the SDR playback."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.config.media import MediaConfig, RungConfig
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media.ffmpeg_args import Layout
from tests.support import media_fixtures as mf
from tests.support.hls_check import check_hls

SMALL = MediaConfig(ladder=[RungConfig(height=240), RungConfig(height=144)], segment_seconds=1)
WANTS = ["playback", "poster", "hls", "proxy"]
BT709_TV = ("bt709", "bt709", "bt709", "tv")

SOURCES: dict[str, Any] = {
    "pq": lambda d: mf.colour_tagged(d, transfer="smpte2084"),
    "hlg": lambda d: mf.colour_tagged(d, transfer="arib-std-b67"),
    # 8-bit H.264 that would remux but for its PQ tags.
    "pq_h264": lambda d: mf.colour_tagged(
        d, transfer="smpte2084", codec="libx264", pix_fmt="yuv420p"
    ),
    "sdr10": lambda d: mf.colour_tagged(
        d, transfer="bt709", primaries="bt709", matrix="bt709", codec="libx264"
    ),
    "untagged": mf.h264_faststart,
}


class Made:
    def __init__(self, source: Path, report: Report, root: Path) -> None:
        self.source = source
        self.report = report
        self.layout = Layout(root)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("colour")
    cache = mf.MediaCache(root / "sources")
    done: dict[str, Made] = {}

    def get(name: str) -> Made:
        if name not in done:
            source = cache.get(name, SOURCES[name])
            out = root / "runs" / name

            async def main() -> Report:
                return await MediaRun(Sandbox(SMALL), source, out).run(wants=WANTS)

            report = anyio.run(main)
            assert report.verdict.valid, report.verdict
            assert all(n.status == "done" for n in report.nodes.values()), report.failed()
            done[name] = Made(source, report, out)
        return done[name]

    return get


def video(path: Path) -> dict[str, Any]:
    streams = [s for s in mf.ffprobe_streams(path) if s["codec_type"] == "video"]
    assert len(streams) == 1, streams
    return streams[0]


def tags(stream: dict[str, Any]) -> tuple[str, str, str, str]:
    return (
        stream.get("color_primaries", ""),
        stream.get("color_transfer", ""),
        stream.get("color_space", ""),
        stream.get("color_range", ""),
    )


def outputs(m: Made) -> list[Path]:
    """Every video output a player or editor is given: playback, proxy, each rung."""
    plan = m.report.plan
    assert plan is not None
    rungs = [m.layout.hls_rung(rung) / "index.m3u8" for rung in plan.rungs]
    return [m.layout.playback, m.layout.proxy, *rungs]


def mean_luma(path: Path) -> float:
    """The first frame's average luma, 8-bit scale."""
    proc = subprocess.run(
        [
            *("ffmpeg", "-nostdin", "-v", "error", "-i", str(path), "-frames:v", "1"),
            *("-vf", "format=yuv420p,signalstats,metadata=print:key=lavfi.signalstats.YAVG:file=-"),
            *("-f", "null", "-"),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    values = [line.split("=", 1)[1] for line in proc.stdout.decode().splitlines() if "YAVG" in line]
    return float(values[0])


@pytest.mark.parametrize("name", ["pq", "hlg"])
def test_hdr_comes_out_tone_mapped_sdr_bt709_in_every_output(made: Any, name: str) -> None:
    m = made(name)
    source = video(m.source)
    assert source["color_transfer"] in ("smpte2084", "arib-std-b67")
    assert m.report.plan.mode == "transcode"
    assert f"hdr:{'pq' if name == 'pq' else 'hlg'}" in m.report.plan.transcode_reasons
    for path in outputs(m):
        out = video(path)
        assert tags(out) == BT709_TV, path
        assert (out["pix_fmt"], out["profile"]) == ("yuv420p", "High"), path
    # The pixels were tone-mapped, not only re-tagged: the light they mean changed.
    assert abs(mean_luma(m.layout.playback) - mean_luma(m.source)) > 10
    assert check_hls(m.layout.hls / "master.m3u8") == []


def test_the_probe_records_the_colour_depth_and_hdr10_metadata(made: Any) -> None:
    summary = made("pq").report.verdict.media
    assert (summary.color_primaries, summary.color_transfer, summary.color_space) == (
        "bt2020",
        "smpte2084",
        "bt2020nc",
    )
    assert summary.color_range == "tv" and summary.bit_depth == 10
    assert summary.hdr is not None and summary.hdr.mastering_display is not None
    assert summary.hdr.mastering_display.max_luminance == "10000000/10000"
    assert summary.hdr.content_light is not None
    assert summary.hdr.content_light.max_content_nits == 1000
    assert summary.hdr.content_light.max_average_nits == 400


def test_an_hdr_source_that_could_be_copied_is_transcoded(made: Any) -> None:
    m = made("pq_h264")
    plan = m.report.plan
    assert plan.transcode_reasons == ["hdr:pq"]
    assert plan.mode == "transcode" and not any(rung.copy for rung in plan.rungs)
    assert tags(video(m.layout.playback)) == BT709_TV


def test_ten_bit_sdr_becomes_eight_bit_420_high(made: Any) -> None:
    m = made("sdr10")
    assert video(m.source)["pix_fmt"] == "yuv420p10le"
    assert m.report.verdict.media.bit_depth == 10
    for path in outputs(m):
        out = video(path)
        assert (out["pix_fmt"], out["profile"]) == ("yuv420p", "High"), path
        assert out.get("bits_per_raw_sample", "8") == "8", path
        assert tags(out) == BT709_TV, path


def test_an_untagged_source_is_copied_and_tagged_bt709_limited(made: Any) -> None:
    m = made("untagged")
    assert tags(video(m.source)) == ("", "", "", "")
    plan = m.report.plan
    assert plan.mode == "remux" and plan.top.copy
    assert plan.colour is not None and plan.colour.primaries == "bt709"
    for path in outputs(m):
        assert tags(video(path)) == BT709_TV, path
    # The tags are the container's: the copied bitstream is the source's own.
    assert mf.stream_md5(m.layout.playback, "0:v:0") == mf.stream_md5(m.source, "0:v:0")
