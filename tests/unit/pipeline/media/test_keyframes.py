from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from aivedio.pipeline.media.keyframes import (
    Packet,
    by_stream,
    keyframe_index,
    keyframe_pts,
    parse_packets,
    segment_boundaries,
)

FFMPEG = shutil.which("ffmpeg")
FFPROBE = shutil.which("ffprobe")
needs_ffmpeg = pytest.mark.skipif(
    FFMPEG is None or FFPROBE is None, reason="ffmpeg/ffprobe not installed"
)

FORCED = "0,0.5,1.7,2.1,4.9,5.2,8.0,8.1,9.5"
# Where x264 puts those forced keyframes at 24 fps (what ffprobe reports for the file below).
KEYFRAMES = [0.0, 0.5, 1.708333, 2.083333, 4.916667, 5.208333, 8.0, 8.083333, 9.5]


def _run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        list(args), check=True, capture_output=True, text=True, timeout=30, cwd=cwd
    )
    return done.stdout


# ---------------------------------------------------------------- parse_packets


def test_parse_packets_fields_and_na() -> None:
    text = (
        "0.000000,-0.083333,48,K_\n"
        "0.125000,-0.041667,4165,__\n"
        "\n"
        "N/A,N/A,0,K__\r\n"
        "packet,0.042000,N/A,N/A,K_\n"
        "-0.023220,-0.023220,48,KD,\n"  # side data: empty sub-section and a blank line
        "\n"
        "packet,-0.023220,-0.023220,48,KD,side_data,\n"
    )
    assert parse_packets(text) == [
        Packet(pts=0.0, dts=-0.083333, pos=48, key=True),
        Packet(pts=0.125, dts=-0.041667, pos=4165, key=False),
        Packet(pts=None, dts=None, pos=0, key=True),
        Packet(pts=0.042, dts=None, pos=None, key=True),
        Packet(pts=-0.02322, dts=-0.02322, pos=48, key=True),
        Packet(pts=-0.02322, dts=-0.02322, pos=48, key=True),
    ]
    assert parse_packets("") == []


@pytest.mark.parametrize(
    "line", ["0.0,0.0,K_", "abc,0.0,1,K_", "0.0,0.0,1.5,K_", "nan,0,1,K_", "0,0,1,K_,7"]
)
def test_parse_packets_rejects_other_shapes(line: str) -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_packets("0.0,0.0,1,K_\n" + line)


@needs_ffmpeg
def test_ffprobe_prints_its_own_column_order(tmp_path: Path) -> None:
    src = tmp_path / "a.mkv"
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc2=s=64x36:r=24:d=1"),
        *("-c:v", "libx264", "-preset", "veryfast", "-g", "12", "-sc_threshold", "0", str(src)),
    )
    probe = (FFPROBE or "ffprobe", "-v", "error", "-select_streams", "v:0")
    reversed_ = _run(
        *probe, "-show_entries", "packet=flags,pos,dts_time,pts_time", "-of", "csv=p=0", str(src)
    )
    asked = _run(
        *probe, "-show_entries", "packet=pts_time,dts_time,pos,flags", "-of", "csv=p=0", str(src)
    )
    assert asked == reversed_
    packets = parse_packets(asked)
    assert len(packets) == 24
    assert [p.pts for p in packets if p.key] == [0.0, 0.5]
    assert packets[0].dts is None  # Matroska: first dts is N/A
    assert all(p.pos is not None for p in packets)


# ---------------------------------------------------------------- keyframe_index


def test_keyframe_index() -> None:
    packets = [
        Packet(4.0, 3.9, 400, True),
        Packet(0.0, -0.1, 48, True),
        Packet(0.5, 0.4, 90, False),
        Packet(4.0, 3.9, 999, True),  # duplicate pts: first byte offset wins
        Packet(None, None, 5, True),  # no pts: not seekable, left out
        Packet(1.5, 1.4, None, True),
    ]
    index = keyframe_index(packets, duration_seconds=10.0)
    assert index == {
        "version": 1,
        "duration": 10.0,
        "keyframes": [{"t": 0.0, "pos": 48}, {"t": 1.5, "pos": None}, {"t": 4.0, "pos": 400}],
        "max_gap": 6.0,  # last keyframe to the end
    }
    assert keyframe_pts(packets) == [0.0, 1.5, 4.0]


def test_keyframe_index_gap_rounding_and_edges() -> None:
    packets = [Packet(t, t, i, True) for i, t in enumerate(KEYFRAMES)]
    assert keyframe_index(packets, duration_seconds=10.0)["max_gap"] == 2.833334
    assert keyframe_index([], duration_seconds=7.0) == {
        "version": 1,
        "duration": 7.0,
        "keyframes": [],
        "max_gap": 7.0,
    }
    # a duration shorter than the last keyframe (bad metadata) never gives a negative gap
    assert keyframe_index([Packet(5.0, 5.0, 1, True)], duration_seconds=3.0)["max_gap"] == 0.0
    with pytest.raises(ValueError, match="duration"):
        keyframe_index([], duration_seconds=float("nan"))


# ---------------------------------------------------------------- segment_boundaries


def test_segment_boundaries_hand_checked() -> None:
    # number counts cuts: targets 2, 4, 6, 8 -> cuts at 2.083, 4.917, 8.0 and again 8.083
    assert segment_boundaries(KEYFRAMES, segment_seconds=2) == [2.083333, 4.916667, 8.0, 8.083333]
    assert segment_boundaries(KEYFRAMES, segment_seconds=3) == [4.916667, 8.0, 9.5]
    assert segment_boundaries(KEYFRAMES, segment_seconds=4) == [4.916667, 8.0]
    assert segment_boundaries([0.0], segment_seconds=2) == []
    assert segment_boundaries([], segment_seconds=2) == []


def test_segment_boundaries_exact_threshold_and_order() -> None:
    grid = [i / 24 for i in range(0, 24 * 6, 12)]  # every 0.5 s, float noise included
    assert segment_boundaries(grid, segment_seconds=2) == [2.0, 4.0]
    assert segment_boundaries(list(reversed(grid)) + grid, segment_seconds=2) == [2.0, 4.0]
    # one tick below the target is not a cut
    assert segment_boundaries([0.0, 1.999989, 2.5], segment_seconds=2) == [2.5]


def test_segment_boundaries_long_gap_does_not_skip_targets() -> None:
    # after the 9 s gap the next target is 4 s, so 9.1 and 9.2 both cut
    assert segment_boundaries([0, 9.0, 9.1, 9.2, 9.3], segment_seconds=2) == [9.0, 9.1, 9.2, 9.3]


def test_segment_boundaries_start_offset() -> None:
    # AAC priming packet at -0.02322 s is the muxer's start_pts: targets move 23 ms earlier
    assert segment_boundaries([0, 1.98, 4.0], segment_seconds=2) == [4.0]
    assert segment_boundaries([0, 1.98, 4.0], segment_seconds=2, start=-0.02322) == [1.98, 4.0]
    with pytest.raises(ValueError, match="segment_seconds"):
        segment_boundaries([0, 1], segment_seconds=0)


def _hls_boundaries(src: Path, out_dir: Path, hls_time: int) -> list[float]:
    out_dir.mkdir()
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error", "-i", str(src), "-c", "copy", "-f", "hls"),
        *("-hls_time", str(hls_time), "-hls_segment_type", "fmp4"),
        *("-hls_playlist_type", "vod", "out.m3u8"),
        cwd=out_dir,
    )
    durations = [
        float(line.removeprefix("#EXTINF:").rstrip(","))
        for line in (out_dir / "out.m3u8").read_text().splitlines()
        if line.startswith("#EXTINF:")
    ]
    total, cuts = 0.0, []
    for d in durations[:-1]:
        total += d
        cuts.append(total)
    return cuts


def _probe_packets(src: Path, stream: str) -> list[Packet]:
    return parse_packets(
        _run(
            *(FFPROBE or "ffprobe", "-v", "error", "-select_streams", stream),
            *("-show_entries", "packet=pts_time,dts_time,pos,flags", "-of", "csv=p=0", str(src)),
        )
    )


@needs_ffmpeg
def test_segment_boundaries_match_the_real_hls_muxer(tmp_path: Path) -> None:
    src = tmp_path / "kf.mp4"
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc2=s=160x90:r=24:d=10"),
        *("-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"),  # with B-frames
        *("-force_key_frames", FORCED, "-x264-params", "keyint=1000:scenecut=0", str(src)),
    )
    packets = _probe_packets(src, "v:0")
    times = keyframe_pts(packets)
    assert times == KEYFRAMES
    assert min(p.dts for p in packets if p.dts is not None) < 0  # B-frames: negative dts
    for hls_time in (2, 3, 4):
        expected = _hls_boundaries(src, tmp_path / f"hls{hls_time}", hls_time)
        got = segment_boundaries(times, segment_seconds=hls_time)
        assert got == pytest.approx(expected, abs=1e-3), hls_time


@needs_ffmpeg
def test_audio_priming_moves_the_cuts(tmp_path: Path) -> None:
    src = tmp_path / "av.mp4"
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error"),
        *("-f", "lavfi", "-i", "testsrc2=s=160x90:r=50:d=6", "-f", "lavfi", "-i", "sine=d=6"),
        *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"),
        *("-force_key_frames", "0,1.98,3.99", "-x264-params", "keyint=1000:scenecut=0"),
        *("-c:a", "aac", str(src)),
    )
    times = keyframe_pts(_probe_packets(src, "v:0"))
    assert times == [0.0, 1.98, 4.0]
    audio_start = _probe_packets(src, "a:0")[0].pts
    assert audio_start is not None and audio_start < 0  # AAC priming
    start = min(audio_start, times[0])

    with_audio = _hls_boundaries(src, tmp_path / "av", 2)
    assert segment_boundaries(times, segment_seconds=2, start=start) == pytest.approx(
        with_audio, abs=1e-3
    )
    assert with_audio == pytest.approx([1.98, 4.0], abs=1e-3)

    video_only = tmp_path / "v.mp4"
    _run(FFMPEG or "ffmpeg", "-v", "error", "-i", str(src), "-an", "-c", "copy", str(video_only))
    assert _hls_boundaries(video_only, tmp_path / "v", 2) == pytest.approx([4.0], abs=1e-3)
    assert segment_boundaries(times, segment_seconds=2) == [4.0]


def test_a_scan_of_every_stream_splits_by_index_keeping_the_heads_asked_for() -> None:
    # What ffprobe prints with stream_index first: video 0, AAC priming on 1 (with its empty
    # side-data sub-section and blank line), a data stream 2 nobody asked for.
    scan = (
        "0,0.000000,-0.083333,2982,K_\n"
        "0,0.166667,-0.041667,7735,__\n"
        "1,-0.023220,-0.023220,9982,KD,\n"
        "\n"
        "2,0.000000,0.000000,10100,K_\n"
        "1,0.000000,0.000000,10296,K_\n"
        "0,0.083333,0.000000,10400,__\n"
        "1,0.023220,0.023220,10500,K_\n"
        "10,9.0,9.0,1,K_\n"  # stream 10 is not stream 1
    )
    parts = by_stream(scan, {0: None, 1: 2})
    assert set(parts) == {0, 1}
    video, audio = parse_packets(parts[0]), parse_packets(parts[1])
    assert [p.pos for p in video] == [2982, 7735, 10400]  # every one, in file order
    assert [p.pts for p in audio] == [-0.02322, 0.0]  # the first two only
    assert by_stream("", {0: None}) == {0: ""}


@needs_ffmpeg
def test_by_stream_reads_ffprobes_own_scan_as_the_per_stream_scans_do(tmp_path: Path) -> None:
    assert FFMPEG is not None and FFPROBE is not None
    clip = tmp_path / "av.mp4"
    _run(
        FFMPEG,
        "-v",
        "error",
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=160x120:rate=24:duration=2",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:duration=2",
        "-c:v",
        "libx264",
        "-bf",
        "2",
        "-c:a",
        "aac",
        "-shortest",
        str(clip),
    )
    entries = ["-show_entries", "packet=pts_time,dts_time,pos,flags", "-of", "csv=p=0"]
    video = _run(FFPROBE, "-v", "error", "-select_streams", "0", *entries, str(clip))
    audio = _run(FFPROBE, "-v", "error", "-select_streams", "1", *entries, str(clip))
    indexed = ["-show_entries", "packet=stream_index,pts_time,dts_time,pos,flags"]
    every = _run(FFPROBE, "-v", "error", *indexed, "-of", "csv=p=0", str(clip))
    parts = by_stream(every, {0: None, 1: 8})
    assert parse_packets(parts[0]) == parse_packets(video)
    assert parse_packets(parts[1]) == parse_packets(audio)[:8]
