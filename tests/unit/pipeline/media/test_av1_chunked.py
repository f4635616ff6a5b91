"""The AV1 ladder on the chunked path without ffmpeg: each chunk's GOP, where its keyframes
fall, the pieces' argv (AV1 branches of the chunk's one decode, its GOP, the HDR10 branch
before the tone map), the packaging that cuts at every keyframe, and the pieces' lease."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from aivedio.config.media import AV1Config, MediaConfig, RungConfig
from aivedio.pipeline import chunk_pieces
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.chunks import Chunking
from aivedio.pipeline.media.colour import BT709
from aivedio.pipeline.media.ffmpeg_args import package_args, pieces_args
from aivedio.pipeline.media.keyframes import Packet
from aivedio.pipeline.media.layout import Layout
from aivedio.pipeline.media.plan import Plan, av1_rungs, make_plan
from aivedio.pipeline.media.sniff import MP4
from tests.unit.pipeline.media.test_validate import summary

MEDIA = MediaConfig(ladder=[RungConfig(height=720), RungConfig(height=360)])
CHUNK = Path("/scratch/work/chunks/chunk_0001.nut")


def values(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def chunked_plan(**changes: object) -> Plan:
    """A 40 s 30 fps HEVC source planned with 1 s segments in chunks of about 6 s, its
    keyframes every 47 frames (mostly off the segment grid), with the AV1 ladder."""
    source = summary(duration_seconds=40.0, video_codec="hevc", video_profile="Main")
    config = msgspec.structs.replace(
        MEDIA, segment_seconds=1.0, chunk_threshold_seconds=20.0, chunk_seconds=6.0
    )
    packets = [Packet(pts=i / 30, dts=i / 30, pos=None, key=i % 47 == 0) for i in range(1200)]
    plan = make_plan(source, config, video_packets=packets, av1=True)
    return msgspec.structs.replace(plan, **changes)


# -- the chunk's GOP and keyframes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "gop", "expected"),
    [
        (120, 30, 30),  # whole segments: the plan's GOP
        (30, 30, 30),
        (94, 24, 24),  # 24, 24, 24, 22
        (100, 24, 20),  # 5 x 20, not 4 x 24 and a GOP of 4
        (121, 30, 25),  # 4 x 25 + 21, not 4 x 30 and a GOP of one frame
        (29, 30, 29),  # shorter than a segment: one GOP
        (1, 30, 1),
        (0, 30, 1),
    ],
)
def test_a_chunks_av1_gop_is_the_fewest_gops_of_at_most_a_segment(
    frames: int, gop: int, expected: int
) -> None:
    assert av1.chunk_gop_frames(frames, gop) == expected


def test_no_av1_segment_is_longer_than_one_or_a_sliver() -> None:
    for gop in (24, 30, 48, 120):
        for frames in range(1, 400):
            chunk_gop = av1.chunk_gop_frames(frames, gop)
            groups = math.ceil(frames / chunk_gop)
            last = frames - (groups - 1) * chunk_gop
            assert chunk_gop <= gop
            assert groups == math.ceil(frames / gop)  # no more segments than on the grid
            assert 0 < last <= chunk_gop and chunk_gop - last < groups, (frames, gop)


def test_the_av1_keyframes_fall_every_chunk_gop_from_each_chunks_first_frame() -> None:
    chunking = Chunking(
        starts=[0.0, 3.916667, 7.833333],
        end=12.0,
        origin=0.0,
        frames=[94, 94, 100],
        grid_starts=[0.0, 94 / 24, 188 / 24],
        grid_end=12.0,
        chunk_seconds=3.0,
    )
    keys = av1.chunked_keyframes(chunking, 24.0, 24)
    # Chunk by chunk: 94 frames in GOPs of 24 (the last 22), 94 again, 100 in GOPs of 20.
    expected = [0, 24, 48, 72, 94, 118, 142, 166, 188, 208, 228, 248, 268]
    assert keys == pytest.approx([frame / 24 for frame in expected])


# -- the pieces' argv -------------------------------------------------------------------------


def test_a_chunks_lead_encodes_its_av1_pieces_from_the_same_decode() -> None:
    plan = chunked_plan()
    assert plan.chunking is not None and plan.chunking.count >= 5
    renditions = [r for r in plan.renditions if not r.copy]
    assert [r.name for r in renditions] == ["720p", "360p", "av1_720p", "av1_360p"]
    index = 1
    outputs = [(r, Path(f"/scratch/work/pieces/{r.name}/0001.mp4")) for r in renditions]
    args = pieces_args(plan, plan.chunking, index, outputs, MEDIA, CHUNK)
    assert values(args, "-i") == [f"file:{CHUNK.resolve()}"]  # one decode of the chunk
    [graph] = values(args, "-filter_complex")
    # The re-timing once, then one scale per size, shared by the H.264 rung and its twin.
    assert graph.count("setpts=") == 1 and graph.count("scale=1280:720") == 1
    assert graph.count("scale=640:360") == 1 and graph.count("split=2") == 3
    assert values(args, "-c:v") == ["libx264", "libx264", "libsvtav1", "libsvtav1"]
    frames = plan.chunking.output_frames(index, plan.frame_rate)
    chunk_gop = av1.chunk_gop_frames(frames, plan.gop_frames)
    # x264 keeps its forced keyframes and generous cap; SVT-AV1 gets the chunk's GOP.
    assert values(args, "-g") == [str(max(plan.gop_frames * 10, 250))] * 2 + [str(chunk_gop)] * 2
    assert len(values(args, "-force_key_frames")) == 2
    assert values(args, "-map") == ["[o0]", "[o1]", "[o2]", "[o3]"]
    assert values(args, "-fps_mode") == ["passthrough"] * 4


def test_an_av1_piece_alone_is_the_same_encode_as_in_its_chunks_one_decode() -> None:
    plan = chunked_plan(colour=BT709)
    assert plan.chunking is not None
    twin = plan.av1_rungs[1]
    alone = pieces_args(plan, plan.chunking, 2, [(twin, Path("/p.mp4"))], MEDIA, CHUNK)
    together = pieces_args(
        plan,
        plan.chunking,
        2,
        [(r, Path(f"/{r.name}.mp4")) for r in plan.renditions],
        MEDIA,
        CHUNK,
    )
    [chain] = values(alone, "-vf")
    assert chain.startswith("setpts=") and chain.endswith("format=yuv420p,setsar=1")
    start = alone.index("-c:v")
    encoder = alone[start : alone.index("-fps_mode")]
    at = [i for i, a in enumerate(together) if a == "-c:v"][3]
    assert together[at : at + len(encoder)] == encoder
    assert values(alone, "-color_primaries") == ["bt709"]


def test_the_hdr10_piece_leaves_the_chunks_decode_before_the_tone_map() -> None:
    tonemap = "zscale=t=linear,tonemap=tonemap=hable,zscale=t=bt709"
    twins = av1_rungs(chunked_plan().rungs, MEDIA)
    hdr10 = msgspec.structs.replace(twins[0], name="av1_hdr10_720p", dynamic_range="pq")
    plan = chunked_plan(
        colour_filter=tonemap,
        av1_rungs=[*twins, hdr10],
        hdr10_colour=msgspec.structs.replace(BT709, primaries="bt2020", transfer="smpte2084"),
        hdr10_params="enable-hdr=1",
    )
    assert plan.chunking is not None
    outputs = [(r, Path(f"/{r.name}.mp4")) for r in plan.renditions]
    args = pieces_args(plan, plan.chunking, 0, outputs, MEDIA, CHUNK)
    graph = values(args, "-filter_complex")[0].split(";")
    assert graph[0].startswith("[0:v:0]setpts=") and graph[0].endswith("split=2[v_sdr][v_h4]")
    assert tonemap not in graph[0]
    assert (
        graph[1]
        == "[v_h4]scale=1280:720:flags=bicubic:out_range=tv,format=yuv420p10le,setsar=1[o4]"
    )
    assert graph[2].startswith(f"[v_sdr]{tonemap},split=")
    assert values(args, "-svtav1-params") == ["enable-hdr=1"]
    assert values(args, "-color_trc") == ["bt709"] * 4 + ["smpte2084"]
    alone = pieces_args(plan, plan.chunking, 0, [(hdr10, Path("/h.mp4"))], MEDIA, CHUNK)
    [chain] = values(alone, "-vf")
    assert tonemap not in chain and chain.endswith("format=yuv420p10le,setsar=1")


# -- packaging and the lease ------------------------------------------------------------------


def test_a_chunked_plans_av1_renditions_are_cut_at_every_keyframe(tmp_path: Path) -> None:
    plan = chunked_plan()
    layout = Layout(tmp_path / "job")
    runs = package_args(plan, {"hls"}, MEDIA, MP4, Path("/s.mp4"), layout, has_audio=True)
    times = {run[-1].split("/")[-2]: values(run, "-hls_time") for run in runs}
    assert times == {
        "720p": ["1"],
        "360p": ["1"],
        "av1_720p": [f"{av1.EVERY_KEYFRAME_SECONDS:g}"],
        "av1_360p": [f"{av1.EVERY_KEYFRAME_SECONDS:g}"],
    }
    assert av1.EVERY_KEYFRAME_SECONDS < 1 / 240  # under one frame at any rate we output
    single = msgspec.structs.replace(plan, chunking=None)
    runs = package_args(single, {"hls"}, MEDIA, MP4, Path("/s.mp4"), layout, has_audio=True)
    assert {values(run, "-hls_time")[0] for run in runs} == {"1"}


def test_a_video_pieces_lease_has_the_av1_budget_when_the_plan_has_the_ladder() -> None:
    media = msgspec.structs.replace(MEDIA, av1=AV1Config(process_timeout_per_media_second=40.0))
    plan = chunked_plan()
    without = msgspec.structs.replace(plan, av1_rungs=[])
    base = chunk_pieces.piece_timeout(
        plan, 6.0, media.process_timeout_seconds, media.process_timeout_per_media_second
    )
    assert chunk_pieces.video_piece_timeout(without, 6.0, media) == base
    assert chunk_pieces.video_piece_timeout(plan, 6.0, media) == base + 40.0 * 6.0
