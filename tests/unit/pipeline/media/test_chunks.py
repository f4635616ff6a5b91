"""The chunked path's pure rules: clean keyframes, split choice, frame counts on the output
grid, forced keyframes, the concat list, the [media] keys and the plan's choice of path."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aivedio.config.load import load_config
from aivedio.config.media import MediaConfig, RungConfig
from aivedio.errors import ConfigError
from aivedio.pipeline.media.chunks import (
    SPLIT_EPSILON,
    Chunking,
    choose_splits,
    clean_keyframes,
    concat_list,
    forced_keyframes,
    make_chunking,
    split_args,
    timing_filter,
)
from aivedio.pipeline.media.keyframes import Packet
from aivedio.pipeline.media.plan import make_plan
from aivedio.pipeline.media.sniff import MP4
from aivedio.pipeline.media.validate import MediaSummary
from tests.conftest import TEST_KEY

NTSC = 30000 / 1001


def packets(
    count: int,
    rate: float,
    *,
    keyint: int,
    open_keys: Sequence[int] = (),
    offset: float = 0.0,
    decimals: int | None = None,
) -> list[Packet]:
    """``count`` frames at ``rate`` in decode order, a keyframe every ``keyint`` frames.
    A keyframe in ``open_keys`` (display index) opens its GOP: it is decoded before the two
    pictures displayed just ahead of it (leading B-frames, as an open GOP encodes them)."""
    order = list(range(count))
    for key in open_keys:
        order.remove(key)
        order.insert(order.index(key - 2), key)
    result = []
    for index in order:
        pts = offset + index / rate
        if decimals is not None:
            pts = round(pts, decimals)
        result.append(Packet(pts=pts, dts=None, pos=None, key=index % keyint == 0))
    return result


# -- clean keyframes -------------------------------------------------------------------------


def test_a_keyframe_a_later_packet_displays_before_is_not_clean() -> None:
    def p(pts: float | None, key: bool = False) -> Packet:
        return Packet(pts=pts, dts=None, pos=None, key=key)

    decode_order = [
        p(0.0, key=True),
        p(0.1),
        p(0.2),
        p(0.5, key=True),
        p(0.3),
        p(0.4),  # open GOP: 0.3 and 0.4 lead it
        p(0.6),
        p(0.7),
        p(0.8, key=True),
        p(None),
        p(0.9),  # closed GOP; a packet without pts is ignored
        p(1.0, key=True),  # the last packet: nothing after it
        p(None, key=True),
    ]
    assert clean_keyframes(decode_order) == [0.0, 0.8, 1.0]


def test_leading_pictures_only_disqualify_their_own_keyframe() -> None:
    stream = packets(240, 24.0, keyint=48, open_keys=[96])
    assert clean_keyframes(stream) == [0.0, 2.0, 6.0, 8.0]
    assert clean_keyframes(packets(240, 24.0, keyint=48)) == [0.0, 2.0, 4.0, 6.0, 8.0]


# -- split choice ----------------------------------------------------------------------------


def splits(keys: Sequence[float], end: float, **kw: Any) -> list[float]:
    options: dict[str, Any] = {"origin": 0.0, "chunk_seconds": 20.0, "segment_seconds": 4.0}
    options.update(kw)
    return choose_splits(keys, end=end, **options)


def test_splits_fall_near_each_multiple_of_chunk_seconds() -> None:
    every_second = [float(t) for t in range(70)]
    assert splits(every_second, 70.0) == [0.0, 20.0, 40.0]
    assert splits(every_second, 90.0) == [0.0, 20.0, 40.0, 60.0]


def test_a_keyframe_on_the_segment_grid_wins_over_a_nearer_one() -> None:
    # 19.5 and 21.0 are nearer to 20 but off the 4 s grid; 24 is on it.
    assert splits([0.0, 19.5, 21.0, 24.0, 44.0], 60.0) == [0.0, 24.0, 44.0]
    # Without a grid keyframe the nearest one is taken; of two as near, the earlier.
    assert splits([0.0, 19.5, 21.0], 50.0) == [0.0, 19.5]
    assert splits([0.0, 19.0, 21.0], 50.0) == [0.0, 19.0]


def test_no_keyframe_in_a_window_skips_to_the_next_multiple() -> None:
    # Nothing within 10 s of 20; 50 is the nearest to 40 in its window; nothing near 70.
    assert splits([0.0, 50.0], 100.0) == [0.0, 50.0]
    assert splits([0.0, 5.0, 95.0], 100.0) == [0.0]


def test_a_short_tail_joins_the_chunk_before_it() -> None:
    keys = [float(t) for t in range(0, 60, 2)]
    # 49 s: a 9 s tail after 40 would be under half a chunk, so 40 is no split.
    assert splits(keys, 49.0) == [0.0, 20.0]
    # 51 s: the tail after 40 is 11 s, kept as its own chunk.
    assert splits(keys, 51.0) == [0.0, 20.0, 40.0]


def test_no_chunk_is_shorter_than_one_segment() -> None:
    # chunk_seconds == segment_seconds: a keyframe 3 s after the last split cannot start one.
    assert splits([0.0, 3.0, 4.5], 20.0, chunk_seconds=4.0) == [0.0, 4.5]
    # Nor may the last chunk be under a segment: 28 would leave 3 s before the end at 31.
    assert splits([0.0, 28.0], 31.0) == [0.0]
    assert splits([0.0, 27.0], 31.0) == [0.0, 27.0]


def test_allowed_restricts_splits_to_the_copied_rungs_cut_points() -> None:
    keys = [0.0, 20.0, 21.0, 40.0]
    assert splits(keys, 60.0) == [0.0, 20.0, 40.0]
    # 20.0 is a clean keyframe on the grid, but the copied rung does not cut there.
    assert splits(keys, 60.0, allowed=[0.0, 21.0004, 40.0]) == [0.0, 21.0, 40.0]
    assert splits(keys, 60.0, allowed=[]) == [0.0]


def test_splits_start_at_the_origin() -> None:
    keys = [0.5 + t for t in range(0, 60, 2)]
    assert splits(keys, 60.5, origin=0.5) == [0.5, 20.5, 40.5]


# -- chunking --------------------------------------------------------------------------------


def test_chunking_counts_every_packet_once() -> None:
    stream = packets(70 * 24, 24.0, keyint=47)
    chunking = make_chunking(stream, end=70.0, rate=24.0, chunk_seconds=20.0, segment_seconds=4.0)
    assert chunking is not None
    # Keyframes every 47/24 s, none on the 4 s grid: the nearest to each target.
    assert chunking.starts == [0.0, 470 / 24, 940 / 24, 1410 / 24]
    assert chunking.frames == [470, 470, 470, 70 * 24 - 1410]
    assert chunking.grid_starts == chunking.starts
    assert [chunking.output_frames(i, 24.0) for i in range(chunking.count)] == chunking.frames
    # On a 1 s grid the keyframe at 47.0 is on it and wins its window over a nearer 39.17.
    grid = make_chunking(stream, end=70.0, rate=24.0, chunk_seconds=20.0, segment_seconds=1.0)
    assert grid is not None and grid.starts == [0.0, 470 / 24, 47.0]
    assert grid.frames == [470, 47 * 24 - 470, 70 * 24 - 47 * 24]


def test_open_gop_keyframes_are_never_split_points() -> None:
    closed = packets(90 * 24, 24.0, keyint=48)
    opened = packets(90 * 24, 24.0, keyint=48, open_keys=[20 * 24])
    args: dict[str, Any] = {
        "end": 90.0,
        "rate": 24.0,
        "chunk_seconds": 20.0,
        "segment_seconds": 4.0,
    }
    assert make_chunking(closed, **args).starts == [0.0, 20.0, 40.0, 60.0]  # type: ignore[union-attr]
    chunking = make_chunking(opened, **args)
    assert chunking is not None
    # 16 and 24 are as near to 20 and on the grid; the earlier wins.
    assert chunking.starts == [0.0, 16.0, 36.0, 56.0, 76.0]
    assert chunking.frames == [16 * 24, 20 * 24, 20 * 24, 20 * 24, 14 * 24]


def test_ntsc_rate_chunks_snap_to_the_output_frame_grid() -> None:
    rate = NTSC
    count = 2000  # 66.73 s
    # Millisecond timestamps (a 1/1000 timebase) that start 21 ms in: off the frame grid.
    stream = packets(count, rate, keyint=60, offset=0.021, decimals=3)
    end = max(p.pts or 0.0 for p in stream) + 1 / rate
    chunking = make_chunking(stream, end=end, rate=rate, chunk_seconds=20.0, segment_seconds=4.0)
    assert chunking is not None
    assert chunking.origin == 0.021
    # Frames 600 and 1200 (20.02 s and 40.04 s in): no keyframe is on the 4 s grid.
    assert chunking.starts == [0.021, round(0.021 + 600 / rate, 3), round(0.021 + 1200 / rate, 3)]
    assert chunking.frames == [600, 600, 800]
    for got, frame in zip(chunking.grid_starts, (0, 600, 1200), strict=True):
        assert got == pytest.approx(0.021 + frame * 1001 / 30000, abs=1e-9)
    assert chunking.grid_end == pytest.approx(0.021 + count * 1001 / 30000, abs=1e-9)
    # Each chunk makes exactly its source frames on the output grid, the whole count in all.
    assert [chunking.output_frames(i, rate) for i in range(chunking.count)] == [600, 600, 800]


def test_a_grid_snapped_chunk_makes_its_share_at_another_output_rate() -> None:
    # A 25 fps source made at 24 fps output: the shares follow the output grid.
    stream = packets(70 * 25, 25.0, keyint=50)
    chunking = make_chunking(stream, end=70.0, rate=24.0, chunk_seconds=20.0, segment_seconds=2.0)
    assert chunking is not None and chunking.starts == [0.0, 20.0, 40.0]
    assert chunking.frames == [500, 500, 750]
    assert [chunking.output_frames(i, 24.0) for i in range(3)] == [480, 480, 720]


def test_no_chunking_without_a_usable_split() -> None:
    args: dict[str, Any] = {
        "end": 90.0,
        "rate": 24.0,
        "chunk_seconds": 20.0,
        "segment_seconds": 4.0,
    }
    assert make_chunking([], **args) is None
    assert make_chunking([Packet(None, None, None, True)] * 10, **args) is None
    # One keyframe at the start of 90 s: nothing to cut at.
    assert make_chunking(packets(90 * 24, 24.0, keyint=90 * 24), **args) is None


# -- argv ------------------------------------------------------------------------------------


def ntsc_chunking() -> Chunking:
    rate = NTSC
    starts = [0.0, 600 / rate, 1200 / rate]
    return Chunking(
        starts=starts,
        end=2100 / rate,
        origin=0.0,
        frames=[600, 600, 900],
        grid_starts=starts,
        grid_end=2100 / rate,
        chunk_seconds=20.0,
    )


def forced(chunking: Chunking, index: int, cut_points: list[float] | None = None) -> list[float]:
    option, times = forced_keyframes(chunking, index, segment_seconds=4.0, cut_points=cut_points)
    assert option == "-force_key_frames"
    return [float(t) for t in times.split(",")]


def test_forced_keyframes_follow_the_segment_grid_inside_each_chunk() -> None:
    chunking = ntsc_chunking()
    eps = SPLIT_EPSILON
    # Each grid time a hair early (ffmpeg forces the first frame at or after it); the first
    # is clamped at zero. Chunk 1 starts at 20.02: its own first frame is a keyframe anyway.
    grid = pytest.approx
    assert forced(chunking, 0) == grid([0.0] + [t - eps for t in (4, 8, 12, 16, 20)], abs=1e-6)
    assert forced(chunking, 1) == grid([t - eps for t in (24, 28, 32, 36, 40)], abs=1e-6)
    assert forced(chunking, 2) == grid([t - eps for t in range(44, 70, 4)], abs=1e-6)


def test_forced_keyframes_take_the_copied_rungs_cut_points_instead() -> None:
    chunking = ntsc_chunking()
    cuts = [4.2, 8.1, 600 / NTSC, 24.3, 1200 / NTSC, 44.0, 69.0]
    eps = SPLIT_EPSILON
    assert forced(chunking, 0, cuts) == pytest.approx([4.2 - eps, 8.1 - eps], abs=1e-6)
    assert forced(chunking, 1, cuts) == pytest.approx([600 / NTSC - eps, 24.3 - eps], abs=1e-6)
    assert forced(chunking, 2, cuts) == pytest.approx(
        [1200 / NTSC - eps, 44.0 - eps, 69.0 - eps], abs=1e-6
    )


def test_a_chunk_without_a_grid_time_forces_its_own_start() -> None:
    chunking = Chunking(
        starts=[0.0, 5.0],
        end=7.0,
        origin=0.0,
        frames=[120, 48],
        grid_starts=[0.0, 5.0],
        grid_end=7.0,
        chunk_seconds=4.0,
    )
    assert forced(chunking, 1) == [5.0]


def test_split_args_copy_the_video_and_cut_just_before_each_start(tmp_path: Path) -> None:
    chunking = ntsc_chunking()
    args = split_args(MP4, tmp_path / "source.bin", chunking, "0:0", MediaConfig(), tmp_path)
    assert args[args.index("-map") + 1] == "0:0"
    assert args[args.index("-c") + 1] == "copy"
    assert "-vf" not in args and "-c:v" not in args and "-filter_complex" not in args
    times = [float(t) for t in args[args.index("-segment_times") + 1].split(",")]
    assert times == pytest.approx([s - SPLIT_EPSILON for s in chunking.starts[1:]], abs=1e-6)
    assert all(0 < s - t < 1 / NTSC for s, t in zip(chunking.starts[1:], times, strict=True))
    assert args[args.index("-reset_timestamps") + 1] == "0"
    assert args[-1] == str(tmp_path / "chunk_%04d.nut")


def test_timing_filter_trims_each_chunk_at_the_next_snapped_start() -> None:
    chunking = ntsc_chunking()
    first = timing_filter(chunking, 0, "30000/1001")
    assert "fps=30000/1001:start_time=0.000000" in first
    assert first.endswith(f"trim=end={600 / NTSC:.6f}")
    last = timing_filter(chunking, 2, "30000/1001")
    assert f"setpts=PTS-STARTPTS+{1200 / NTSC:.6f}/TB" in last
    assert last.endswith(f"trim=end={2100 / NTSC:.6f}")


def test_concat_list_quotes_paths_and_gives_exact_durations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    odd = tmp_path / "it's a dir" / "0000.mp4"
    relative = Path("pieces") / "0001.mp4"
    text = concat_list([(odd, 600), (relative, 601)], NTSC)
    lines = text.splitlines()
    assert text.endswith("\n") and lines[0] == "ffconcat version 1.0"
    assert shlex.split(lines[1]) == ["file", f"file:{odd}"]
    assert shlex.split(lines[3]) == ["file", f"file:{tmp_path / 'pieces' / '0001.mp4'}"]
    durations = [float(lines[2].split()[1]), float(lines[4].split()[1])]
    assert lines[2].split()[0] == lines[4].split()[0] == "duration"
    # Each duration is the piece's frames at the output rate, to the nanosecond.
    assert durations[0] == pytest.approx(600 * 1001 / 30000, abs=1e-9)
    assert durations[1] == pytest.approx(601 * 1001 / 30000, abs=1e-9)
    assert len(lines) == 5


# -- [media] keys ----------------------------------------------------------------------------


def media_error(tmp_path: Path, toml: str) -> str:
    path = tmp_path / "aivedio.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path, {"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY})
    return info.value.detail


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[media]\nchunk_seconds = 10\n", "media.chunk_seconds"),  # 2.5 segments of 4 s
        ("[media]\nchunk_seconds = 2\n", "media.chunk_seconds"),  # under one segment
        ("[media]\nchunk_seconds = 0\n", "media.chunk_seconds"),
        ("[media]\nsegment_seconds = 3\nchunk_seconds = 20\n", "media.chunk_seconds"),
        ("[media]\nchunk_threshold_seconds = -1\n", "media.chunk_threshold_seconds"),
    ],
)
def test_chunk_keys_are_validated(tmp_path: Path, toml: str, key: str) -> None:
    assert key in media_error(tmp_path, toml)


@pytest.mark.parametrize(
    "toml",
    [
        "[media]\nchunk_threshold_seconds = 0\n",  # off
        "[media]\nchunk_seconds = 4\n",  # one segment
        "[media]\nsegment_seconds = 2.5\nchunk_seconds = 7.5\n",
        "[media]\nsegment_seconds = 0.1\nchunk_seconds = 0.3\n",  # 2.9999999999999996 steps
    ],
)
def test_whole_multiples_and_a_zero_threshold_are_accepted(tmp_path: Path, toml: str) -> None:
    path = tmp_path / "aivedio.toml"
    path.write_text(toml)
    load_config(path, {"AIVEDIO_URL_ENCRYPTION_KEY": TEST_KEY})


def test_chunking_defaults() -> None:
    media = MediaConfig()
    assert (media.chunk_threshold_seconds, media.chunk_seconds) == (60.0, 20.0)


# -- the plan's path -------------------------------------------------------------------------

MEDIA = MediaConfig(
    ladder=[RungConfig(height=720), RungConfig(height=360)],
    segment_seconds=4.0,
    chunk_threshold_seconds=60.0,
    chunk_seconds=20.0,
)


def summary(seconds: float, **kw: Any) -> MediaSummary:
    """H.264 High yuv420p 1280x720 24 fps CFR with AAC-LC: remuxable unless changed."""
    base = MediaSummary(
        container="mov,mp4,m4a,3gp,3g2,mj2",
        duration_seconds=seconds,
        start_time=0.0,
        width=1280,
        height=720,
        display_width=1280,
        display_height=720,
        rotation=0,
        sar="1:1",
        video_codec="h264",
        video_profile="High",
        video_level=40,
        pix_fmt="yuv420p",
        frame_rate=24.0,
        real_frame_rate=24.0,
        variable_frame_rate=False,
        interlaced=False,
        video_bit_rate=2_000_000,
        video_stream_index=0,
        audio_stream_index=1,
        audio_codec="aac",
        audio_profile="LC",
        audio_sample_rate=48000,
        audio_channels=2,
        audio_channel_layout="stereo",
        video_streams=1,
        audio_streams=1,
        subtitle_streams=0,
        attachment_streams=0,
        data_streams=0,
    )
    return msgspec.structs.replace(base, **kw)


def transcode_path(seconds: float, media: MediaConfig = MEDIA) -> str:
    frames = round(seconds * 24)
    plan = make_plan(
        summary(seconds, pix_fmt="yuv444p"), media, video_packets=packets(frames, 24.0, keyint=48)
    )
    assert plan.mode == "transcode"
    return plan.path


def test_only_a_source_past_the_threshold_is_chunked() -> None:
    assert transcode_path(10.0) == "single_pass"
    assert transcode_path(60.0) == "single_pass"  # past it, not at it
    assert transcode_path(62.0) == "chunked"
    assert transcode_path(62.0, msgspec.structs.replace(MEDIA, chunk_threshold_seconds=0.0)) == (
        "single_pass"
    )
    assert transcode_path(45.0, msgspec.structs.replace(MEDIA, chunk_threshold_seconds=20.0)) == (
        "chunked"
    )


def test_a_chunked_plan_records_its_chunks() -> None:
    plan = make_plan(
        summary(90.0, pix_fmt="yuv444p"), MEDIA, video_packets=packets(90 * 24, 24.0, keyint=48)
    )
    assert plan.path == "chunked" and plan.chunking is not None
    assert plan.chunking.starts == [0.0, 20.0, 40.0, 60.0]
    assert sum(plan.chunking.frames) == 90 * 24
    # The plan survives its JSON round trip (it is stored with the revision).
    decoded = msgspec.json.decode(msgspec.json.encode(plan), type=type(plan))
    assert decoded.chunking == plan.chunking and decoded.path == "chunked"


def test_no_packets_or_no_split_keep_the_single_pass() -> None:
    long = summary(90.0, pix_fmt="yuv444p")
    assert make_plan(long, MEDIA).path == "single_pass"
    one_gop = packets(90 * 24, 24.0, keyint=90 * 24)
    assert make_plan(long, MEDIA, video_packets=one_gop).path == "single_pass"


def test_a_remux_is_chunked_only_when_some_rung_is_encoded() -> None:
    keys = [k / 24 for k in range(0, 90 * 24, 48)]
    stream = packets(90 * 24, 24.0, keyint=48)
    copy_only = msgspec.structs.replace(MEDIA, ladder=[RungConfig(height=720)])
    alone = make_plan(summary(90.0), copy_only, source_keyframes=keys, video_packets=stream)
    assert alone.mode == "remux" and [r.copy for r in alone.rungs] == [True]
    assert alone.path == "single_pass"
    laddered = make_plan(summary(90.0), MEDIA, source_keyframes=keys, video_packets=stream)
    assert laddered.mode == "remux" and [r.copy for r in laddered.rungs] == [True, False]
    assert laddered.path == "chunked"


def test_a_remuxed_source_is_split_only_where_the_copied_rung_is_cut() -> None:
    # Keyframes every 47 frames at 24 fps: the nearest to 20 s (19.58) is no HLS cut point
    # (the muxer cuts at 17.63 and 21.54), so the split moves to 21.54.
    keys = [k / 24 for k in range(0, 90 * 24, 47)]
    stream = packets(90 * 24, 24.0, keyint=47)
    plan = make_plan(summary(90.0), MEDIA, source_keyframes=keys, video_packets=stream)
    assert plan.mode == "remux" and plan.cut_points is not None
    assert plan.chunking is not None
    assert set(plan.chunking.starts[1:]) <= set(plan.cut_points)
    assert plan.chunking.starts[1] == 11 * 47 / 24
    free = make_chunking(stream, end=90.0, rate=24.0, chunk_seconds=20.0, segment_seconds=4.0)
    assert free is not None and free.starts[1] == 10 * 47 / 24
