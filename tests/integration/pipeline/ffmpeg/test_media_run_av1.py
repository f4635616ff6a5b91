"""The AV1 ladder through the media DAG, judged from the published files with ffprobe:
each AV1 rung's codec, profile, size, pixel format and colour tags read from its own
init + segments, the master playlist's CODECS against what ffprobe reads, the H.264
fallback beside it, no SUPPLEMENTAL-CODECS, and nothing of it when AV1 is off; the HDR10
rendition of a PQ source (10-bit, PQ BT.2020, its HDR10 metadata in the bitstream,
VIDEO-RANGE=PQ beside SDR variants)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from aivedio.config.media import AV1Config, MediaConfig, RungConfig
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import Report
from aivedio.pipeline.ffmpeg.sandbox import Sandbox
from aivedio.pipeline.media import hls
from aivedio.pipeline.media.ffmpeg_args import Layout
from tests.support import media_fixtures as mf
from tests.support.hls_check import check_hls, parse_master, unquote

SMALL = MediaConfig(ladder=[RungConfig(height=240), RungConfig(height=144)], segment_seconds=1)
TEN_BIT = msgspec.structs.replace(SMALL, av1=AV1Config(bit_depth=10, preset=10))
HDR10 = msgspec.structs.replace(SMALL, av1=AV1Config(hdr10=True, preset=10))
BT709_TV = ("bt709", "bt709", "bt709", "tv")

# name -> (source, config, whether the run gets the AV1 ladder)
CASES: dict[str, tuple[Any, MediaConfig, bool]] = {
    "transcode": (mf.hevc_mkv, SMALL, True),
    "remux": (mf.h264_faststart, SMALL, True),
    "pq_ten_bit": (lambda d: mf.colour_tagged(d, transfer="smpte2084"), TEN_BIT, True),
    "off": (mf.h264_faststart, SMALL, False),
    "pq_hdr10": (lambda d: mf.colour_tagged(d, transfer="smpte2084"), HDR10, True),
}


class Made:
    def __init__(self, source: Path, report: Report, root: Path) -> None:
        self.source = source
        self.report = report
        self.layout = Layout(root)

    @property
    def master(self) -> Path:
        return self.layout.hls / "master.m3u8"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("av1")
    cache = mf.MediaCache(root / "sources")
    done: dict[str, Made] = {}

    def get(name: str) -> Made:
        if name not in done:
            make, media, av1 = CASES[name]
            source = cache.get(name, make)
            out = root / "runs" / name

            async def main() -> Report:
                run = MediaRun(Sandbox(media), source, out)
                run.av1 = av1
                return await run.run(wants=["playback", "hls"])

            report = anyio.run(main)
            assert report.verdict.valid, report.verdict
            assert all(n.status == "done" for n in report.nodes.values()), report.failed()
            done[name] = Made(source, report, out)
        return done[name]

    return get


def joined(directory: Path, scratch: Path) -> Path:
    """A rendition's init segment and every media segment, as one file ffprobe reads."""
    playlist = hls.parse_media_playlist(directory / "index.m3u8")
    out = scratch / f"{directory.name}.mp4"
    with out.open("wb") as handle:
        for name in [playlist.init, *(uri for uri, _ in playlist.segments)]:
            handle.write((directory / name).read_bytes())
    return out


def video(path: Path) -> dict[str, Any]:
    streams = [s for s in mf.ffprobe_streams(path) if s["codec_type"] == "video"]
    assert len(streams) == 1, streams
    return streams[0]


def variants(master: Path) -> dict[str, dict[str, str]]:
    """URI -> the variant's attributes (quotes removed)."""
    return {
        entry["uri"]: {k: unquote(v) or "" for k, v in entry["attributes"].items()}
        for entry in parse_master(master)
        if entry["kind"] == "variant"
    }


def fraction(text: str) -> float:
    number, _, denominator = text.partition("/")
    return float(number) / float(denominator or 1)


def expected_av01(stream: dict[str, Any]) -> str:
    """What an ``av01`` CODECS entry must say for what ffprobe read of the bitstream:
    profile (Main 0, High 1, Professional 2), seq_level_idx, tier M, bit depth; the optional
    colour fields only when the colour is not BT.709 limited (the short form's default)."""
    profile = {"Main": 0, "High": 1, "Professional": 2}[stream["profile"]]
    depth = 10 if stream["pix_fmt"].endswith("10le") else 8
    short = f"av01.{profile}.{int(stream['level']):02d}M.{depth:02d}"
    if stream.get("color_transfer") != "smpte2084":
        return short
    # BT.2020 (9), PQ (16), BT.2020 non-constant (9), limited range; 4:2:0 (subsampled
    # across and down: 11) and the chroma sample position (AV1's: 0 unknown, 1 vertical,
    # which ffmpeg calls "left", 2 colocated, "topleft").
    assert stream["color_primaries"] == "bt2020" and stream["color_space"] == "bt2020nc"
    position = {"left": 1, "topleft": 2}.get(stream.get("chroma_location", ""), 0)
    return f"{short}.0.11{position}.09.16.09.0"


@pytest.mark.parametrize("name", ["transcode", "remux", "pq_ten_bit"])
def test_every_av1_rung_is_what_the_plan_says_read_from_its_segments(
    made: Any, name: str, tmp_path: Path
) -> None:
    m = made(name)
    plan = m.report.plan
    assert [r.name for r in plan.av1_rungs] == [f"av1_{r.name}" for r in plan.rungs]
    ten_bit = name == "pq_ten_bit"
    listed = variants(m.master)
    for rung in plan.av1_rungs:
        stream = video(joined(m.layout.hls_rung(rung), tmp_path))
        assert stream["codec_name"] == "av1" and stream["profile"] == "Main", stream
        assert (stream["width"], stream["height"]) == (rung.width, rung.height), stream
        assert stream["pix_fmt"] == ("yuv420p10le" if ten_bit else "yuv420p"), stream
        assert stream.get("sample_aspect_ratio", "1:1") == "1:1", stream
        # An HDR source's AV1 ladder is tone-mapped SDR like the H.264 one, tagged so.
        colour = (
            stream.get("color_primaries"),
            stream.get("color_transfer"),
            stream.get("color_space"),
            stream.get("color_range"),
        )
        assert colour == BT709_TV, stream
        attributes = listed[f"{rung.name}/index.m3u8"]
        video_codec, audio_codec = attributes["CODECS"].split(",")
        assert video_codec == expected_av01(stream), (attributes, stream)
        assert audio_codec == hls.AAC_LC
        assert attributes["RESOLUTION"] == f"{rung.width}x{rung.height}"
    # Every AV1 rendition's segments start on a keyframe, aligned with each other; the
    # whole presentation decodes.
    assert check_hls(m.master) == []


@pytest.mark.parametrize("name", ["transcode", "remux"])
def test_the_master_lists_the_h264_fallback_first_and_no_supplemental_codecs(
    made: Any, name: str
) -> None:
    m = made(name)
    text = m.master.read_text()
    assert "SUPPLEMENTAL-CODECS" not in text
    uris = list(variants(m.master))
    h264 = [f"{rung.name}/index.m3u8" for rung in m.report.plan.rungs]
    av1 = [f"{rung.name}/index.m3u8" for rung in m.report.plan.av1_rungs]
    assert uris == [*h264, *av1]
    for uri in h264:
        assert re.fullmatch(r"avc1\.[0-9A-F]{6},mp4a\.40\.2", variants(m.master)[uri]["CODECS"])
        assert video(m.layout.hls / uri.split("/")[0] / "init.mp4")["codec_name"] == "h264"
    # The playback MP4 stays H.264: the one file every player plays.
    assert video(m.layout.playback)["codec_name"] == "h264"


def test_the_remuxed_top_rung_gets_an_encoded_av1_twin(made: Any) -> None:
    m = made("remux")
    plan = m.report.plan
    assert plan.mode == "remux" and plan.top.copy
    twin = plan.av1_rungs[0]
    assert not twin.copy and (twin.width, twin.height) == (plan.top.width, plan.top.height)


def test_the_ten_bit_ladder_says_so_in_codecs(made: Any) -> None:
    m = made("pq_ten_bit")
    codecs = [a["CODECS"] for a in variants(m.master).values() if a["CODECS"].startswith("av01")]
    assert codecs and all(c.split(",")[0].endswith(".10") for c in codecs), codecs


def test_without_av1_the_presentation_is_h264_alone(made: Any) -> None:
    m = made("off")
    assert m.report.plan.av1_rungs == []
    assert "av01" not in m.master.read_text()
    assert not [p for p in m.layout.hls.iterdir() if p.name.startswith("av1_")]
    assert check_hls(m.master) == []


def test_a_pq_source_gets_an_hdr10_rendition_beside_the_sdr_ladders(
    made: Any, tmp_path: Path
) -> None:
    m = made("pq_hdr10")
    plan = m.report.plan
    hdr = plan.av1_rungs[-1]
    assert (hdr.name, hdr.dynamic_range) == ("av1_hdr10_240p", "pq")
    assert [r.dynamic_range for r in plan.renditions].count("pq") == 1
    joined_hdr = joined(m.layout.hls_rung(hdr), tmp_path)
    stream = video(joined_hdr)
    assert stream["codec_name"] == "av1" and stream["pix_fmt"] == "yuv420p10le", stream
    assert (stream["width"], stream["height"]) == (hdr.width, hdr.height)
    colour = tuple(
        stream.get(k) for k in ("color_primaries", "color_transfer", "color_space", "color_range")
    )
    assert colour == ("bt2020", "smpte2084", "bt2020nc", "tv"), stream
    # The source's HDR10 metadata went into the AV1 bitstream (read back by the decoder).
    frame = mf.ffprobe_json(
        joined_hdr,
        *("-select_streams", "v:0", "-read_intervals", "%+#1", "-show_frames"),
    )["frames"][0]
    side = {entry["side_data_type"]: entry for entry in frame.get("side_data_list", [])}
    mastering = side["Mastering display metadata"]
    source = m.report.verdict.media.hdr.mastering_display
    assert source is not None
    wanted = {
        "red_x": source.red[0],
        "red_y": source.red[1],
        "green_x": source.green[0],
        "blue_y": source.blue[1],
        "white_point_x": source.white_point[0],
        "max_luminance": source.max_luminance,
        "min_luminance": source.min_luminance,
    }
    for key, value in wanted.items():  # each as exact as the AV1 metadata's fixed point
        assert fraction(mastering[key]) == pytest.approx(fraction(value), abs=1e-3), key
    light = side["Content light level metadata"]
    assert (light["max_content"], light["max_average"]) == (1000, 400), light
    # Not tone-mapped: its picture is the source's (PQ), unlike every SDR rendition.
    listed = variants(m.master)
    for rung in plan.renditions:
        attributes = listed[f"{rung.name}/index.m3u8"]
        if rung is hdr:
            assert attributes["VIDEO-RANGE"] == "PQ"
            assert attributes["CODECS"].split(",")[0] == expected_av01(stream)
        else:
            assert attributes["VIDEO-RANGE"] == "SDR", attributes
            sdr = video(joined(m.layout.hls_rung(rung), tmp_path))
            assert sdr.get("color_transfer") == "bt709", (rung.name, sdr)
    assert check_hls(m.master) == []


def test_a_presentation_without_hdr10_says_no_video_range(made: Any) -> None:
    assert "VIDEO-RANGE" not in made("pq_ten_bit").master.read_text()
