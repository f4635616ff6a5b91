"""The AV1 ladder's rules without ffmpeg: who gets it, its rungs in the plan, the encoder's
argv inside the one decode, the budgets it adds, and the CODECS string read from boxes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from aivedio.config.load import Config
from aivedio.config.media import AV1Config, MediaConfig, RungConfig, validate_media
from aivedio.errors import ConfigError, InvalidMediaError
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.colour import ContentLight, HdrMetadata, MasteringDisplay
from aivedio.pipeline.media.ffmpeg_args import (
    EncodeJob,
    Layout,
    encode_args,
    encode_job,
    rung_scale,
)
from aivedio.pipeline.media.keyframes import Packet
from aivedio.pipeline.media.plan import make_plan
from aivedio.pipeline.media.sniff import MP4
from aivedio.pipeline.revisions import render_timeout
from tests.unit.pipeline.media.test_validate import summary

LADDER = [RungConfig(height=720, crf=23, maxrate_kbps=3500), RungConfig(height=360, crf=25)]


def media(**av1_settings: object) -> MediaConfig:
    return MediaConfig(ladder=LADDER, av1=AV1Config(**av1_settings))  # type: ignore[arg-type]


# -- who gets it ------------------------------------------------------------------------------


def test_av1_is_off_by_default() -> None:
    assert not av1.wanted(MediaConfig(), "acme")
    assert not av1.wanted(MediaConfig(), None)


def test_a_listed_tenant_gets_av1_and_others_do_not() -> None:
    config = media(tenants=["acme"])
    assert av1.wanted(config, "acme")
    assert not av1.wanted(config, "other") and not av1.wanted(config, None)


def test_every_tenant_gets_av1_from_its_pipeline_version_on() -> None:
    before = msgspec.structs.replace(media(from_pipeline_version=3), pipeline_version=2)
    assert not av1.wanted(before, "acme")
    on = msgspec.structs.replace(before, pipeline_version=3)
    assert av1.wanted(on, "acme") and av1.wanted(on, None)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"preset": 14}, "preset"),
        ({"preset": -1}, "preset"),
        ({"bit_depth": 12}, "bit_depth"),
        ({"crf_offset": 41}, "crf_offset"),
        ({"maxrate_ratio": -0.1}, "maxrate_ratio"),
        ({"from_pipeline_version": -1}, "from_pipeline_version"),
        ({"process_timeout_per_media_second": -1.0}, "process_timeout_per_media_second"),
    ],
)
def test_bad_av1_settings_are_refused_by_name(settings: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"media.av1.{key}"):
        validate_media(media(**settings))


# -- the plan ---------------------------------------------------------------------------------


def test_the_plan_has_an_av1_twin_of_every_rung_only_when_asked() -> None:
    source = summary(width=1280, height=720, display_width=1280, display_height=720)
    config = media(crf_offset=12, maxrate_ratio=0.5)
    assert make_plan(source, config).av1_rungs == []
    plan = make_plan(source, config, av1=True)
    assert plan.mode == "remux" and plan.top.copy
    twins = [(r.name, r.width, r.height, r.copy, r.codec) for r in plan.av1_rungs]
    assert twins == [
        ("av1_720p", 1280, 720, False, "av1"),
        ("av1_360p", 640, 360, False, "av1"),
    ]
    # The copied rung's twin takes the top configured rung's settings.
    assert [(r.crf, r.maxrate_kbps) for r in plan.av1_rungs] == [(35, 1750), (37, 2500)]
    assert [r.name for r in plan.renditions] == ["720p", "360p", "av1_720p", "av1_360p"]


def test_a_chunked_plan_has_the_av1_ladder_a_single_pass_would() -> None:
    source = summary(duration_seconds=120.0, video_codec="hevc", video_profile="Main")
    config = msgspec.structs.replace(media(), chunk_threshold_seconds=60.0, chunk_seconds=20.0)
    packets = [Packet(pts=i / 30, dts=i / 30, pos=None, key=i % 60 == 0) for i in range(3600)]
    plan = make_plan(source, config, video_packets=packets, av1=True)
    single = make_plan(source, config, av1=True)
    assert plan.chunking is not None and single.chunking is None
    assert plan.av1_rungs and plan.av1_rungs == single.av1_rungs


# -- the encode -------------------------------------------------------------------------------


def test_the_av1_rungs_share_the_decode_and_each_same_sized_scale(tmp_path: Path) -> None:
    source = summary(video_codec="hevc", video_profile="Main")
    config = media(preset=10)
    plan = make_plan(source, config, av1=True)
    job = encode_job(plan, {"hls"}, has_audio=True)
    assert [r.name for r in job.rungs] == ["720p", "360p", "av1_720p", "av1_360p"]
    args = encode_args(
        plan,
        job,
        config,
        MP4,
        tmp_path / "in.mp4",
        Layout(tmp_path),
        audio_channels=2,
        audio_rate=48000,
    )
    assert args.count("-i") == 1
    graph = args[args.index("-filter_complex") + 1]
    # One split of the decode; each size scaled once, then split between its two encoders.
    assert graph.count("split=2[s_r0][s_r1]") == 1
    assert graph.count("scale=1280:720") == 1 and graph.count("scale=640:360") == 1
    assert "[o_r0][o_r2]" in graph and "[o_r1][o_r3]" in graph
    encoders = [args[i + 1] for i, a in enumerate(args) if a == "-c:v"]
    assert encoders == ["libx264", "libx264", "libsvtav1", "libsvtav1"]
    at = args.index("libsvtav1")
    av1_args = args[at - 1 : args.index("-f", at)]
    assert av1_args[av1_args.index("-preset") + 1] == "10"
    assert av1_args[av1_args.index("-g") + 1] == str(plan.gop_frames)
    assert av1_args[av1_args.index("-pix_fmt") + 1] == "yuv420p"
    assert "-force_key_frames" not in av1_args  # libsvtav1 ignores it: the GOP decides
    assert av1_args[av1_args.index("-color_primaries") + 1] == "bt709"


def test_a_ten_bit_av1_rung_gets_its_own_scale(tmp_path: Path) -> None:
    config = media(bit_depth=10)
    plan = make_plan(summary(video_codec="hevc", video_profile="Main"), config, av1=True)
    job = EncodeJob(
        rungs=(plan.rungs[1], plan.av1_rungs[1]),
        proxy=False,
        poster=False,
        sprite=False,
        pcm=False,
        audio=False,
    )
    args = encode_args(
        plan,
        job,
        config,
        MP4,
        tmp_path / "in.mp4",
        Layout(tmp_path),
        audio_channels=2,
        audio_rate=48000,
    )
    graph = args[args.index("-filter_complex") + 1]
    assert "format=yuv420p10le" in graph and graph.count("scale=640:360") == 2
    assert "yuv420p10le" in args[args.index("libsvtav1") :]


def test_an_av1_ladder_buys_its_render_more_time() -> None:
    config = Config()
    source = summary(duration_seconds=10.0)
    without = make_plan(source, config.media)
    config = msgspec.structs.replace(config, media=media(process_timeout_per_media_second=40.0))
    with_av1 = make_plan(source, config.media, av1=True)
    extra = render_timeout(config, source, with_av1) - render_timeout(config, source, without)
    assert extra == pytest.approx(400.0)
    assert av1.cpu_extra_seconds(media(cpu_seconds_per_media_second=30.0), 10.0) == 300


# -- CODECS -----------------------------------------------------------------------------------


def box(kind: bytes, payload: bytes) -> bytes:
    return (8 + len(payload)).to_bytes(4, "big") + kind + payload


def init_segment(
    tmp_path: Path, config: bytes, colour: tuple[int, int, int, int] | None = None
) -> Path:
    """A sample entry as an init segment holds it: ``av01`` with ``av1C`` (and ``colr``)."""
    inner = box(b"av1C", config)
    if colour is not None:
        primaries, transfer, matrix, full = colour
        nclx = b"nclx" + b"".join(v.to_bytes(2, "big") for v in (primaries, transfer, matrix))
        inner += box(b"colr", nclx + bytes([full << 7]))
    path = tmp_path / "init.mp4"
    path.write_bytes(box(b"ftyp", b"iso6") + box(b"av01", b"\0" * 78 + inner))
    return path


def av1c(profile: int, level: int, flags: int) -> bytes:
    return bytes([0x81, (profile << 5) | level, flags, 0])


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (av1c(0, 8, 0b0000_1100), "av01.0.08M.08"),  # Main 4.0, 8-bit 4:2:0
        (av1c(0, 13, 0b1100_1100), "av01.0.13H.10"),  # high tier, 10-bit
        (av1c(1, 5, 0b0000_0000), "av01.1.05M.08"),  # High profile (4:4:4)
        (av1c(2, 9, 0b0110_1000), "av01.2.09M.12"),  # Professional 12-bit 4:2:2
    ],
)
def test_the_codecs_string_is_read_from_the_av1c_box(
    tmp_path: Path, config: bytes, expected: str
) -> None:
    assert av1.codec_string(init_segment(tmp_path, config, (1, 1, 1, 0))) == expected
    assert av1.codec_string(init_segment(tmp_path, config)) == expected


def test_a_colour_other_than_bt709_limited_is_spelled_out(tmp_path: Path) -> None:
    pq = init_segment(tmp_path, av1c(0, 9, 0b0100_1100), (9, 16, 9, 0))
    assert av1.codec_string(pq) == "av01.0.09M.10.0.110.09.16.09.0"
    full = init_segment(tmp_path, av1c(0, 4, 0b0000_1101), (1, 1, 1, 1))
    assert av1.codec_string(full) == "av01.0.04M.08.0.111.01.01.01.1"


def test_an_init_segment_without_av1c_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "init.mp4"
    path.write_bytes(box(b"ftyp", b"iso6") + box(b"avcC", b"\x01\x64\x00\x1f"))
    with pytest.raises(InvalidMediaError):
        av1.codec_string(path)


# -- the HDR10 rendition ----------------------------------------------------------------------

MASTERING = MasteringDisplay(
    red=("35400/50000", "14600/50000"),
    green=("8500/50000", "39850/50000"),
    blue=("6550/50000", "2300/50000"),
    white_point=("15635/50000", "16450/50000"),
    min_luminance="50/10000",
    max_luminance="10000000/10000",
)
PQ = dict(
    video_codec="hevc",
    video_profile="Main 10",
    pix_fmt="yuv420p10le",
    color_primaries="bt2020",
    color_transfer="smpte2084",
    color_space="bt2020nc",
    color_range="tv",
    hdr=HdrMetadata(
        mastering_display=MASTERING,
        content_light=ContentLight(max_content_nits=1000, max_average_nits=400),
    ),
)


def test_a_pq_source_gets_an_hdr10_rendition_only_when_asked() -> None:
    source = summary(**PQ)
    assert [r.dynamic_range for r in make_plan(source, media(), av1=True).av1_rungs] == [
        "sdr",
        "sdr",
    ]
    plan = make_plan(source, media(hdr10=True), av1=True)
    hdr = plan.av1_rungs[-1]
    assert (hdr.name, hdr.width, hdr.height, hdr.dynamic_range) == (
        "av1_hdr10_720p",
        1280,
        720,
        "pq",
    )
    assert plan.hdr10_colour is not None and plan.hdr10_colour.transfer == "smpte2084"
    assert plan.colour is not None and plan.colour.transfer == "bt709"  # the SDR ladders'
    # An SDR source gets none, hdr10 or not.
    assert all(
        r.dynamic_range == "sdr"
        for r in make_plan(summary(), media(hdr10=True), av1=True).av1_rungs
    )


def test_the_hdr10_parameters_carry_the_mastering_display_and_light_levels() -> None:
    params = av1.hdr10_params(PQ["hdr"])  # type: ignore[arg-type]
    assert params == (
        "enable-hdr=1:mastering-display=G(0.1700,0.7970)B(0.1310,0.0460)"
        "R(0.7080,0.2920)WP(0.3127,0.3290)L(1000.0000,0.0050):content-light=1000,400"
    )
    assert av1.hdr10_params(None) == "enable-hdr=1"


def test_the_hdr10_branch_leaves_the_decode_before_the_tone_map(tmp_path: Path) -> None:
    config = media(hdr10=True)
    plan = make_plan(summary(**PQ), config, av1=True)
    assert "tonemap" in plan.colour_filter
    job = encode_job(plan, {"hls"}, has_audio=False)
    args = encode_args(
        plan,
        job,
        config,
        MP4,
        tmp_path / "in.mp4",
        Layout(tmp_path),
        audio_channels=None,
        audio_rate=None,
    )
    graph = args[args.index("-filter_complex") + 1].split(";")
    hdr_index = len(job.rungs) - 1
    assert graph[0].endswith(f"split=2[v_sdr][v_h{hdr_index}]") and "tonemap" not in graph[0]
    assert graph[1] == f"[v_h{hdr_index}]{rung_scale(plan.av1_rungs[-1], 'yuv420p10le')}" + (
        f"[o_r{hdr_index}]"
    )
    assert graph[2].startswith("[v_sdr]") and "tonemap" in graph[2]
    tail = args[args.index(f"[o_r{hdr_index}]") :]
    assert tail[tail.index("-svtav1-params") + 1].startswith("enable-hdr=1:mastering-display=")
    assert tail[tail.index("-pix_fmt") + 1] == "yuv420p10le"
    assert tail[tail.index("-color_trc") + 1] == "smpte2084"
    assert tail[tail.index("-color_primaries") + 1] == "bt2020"
