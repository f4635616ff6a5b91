from __future__ import annotations

import math
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

from aivedio.pipeline.media.thumbnails import (
    SpriteTile,
    jpeg_dimensions,
    sprite_filter,
    sprite_layout,
    thumb_height_for,
    vtt_timestamp,
    webvtt_index,
)

FFMPEG = shutil.which("ffmpeg")
FFPROBE = shutil.which("ffprobe")
needs_ffmpeg = pytest.mark.skipif(
    FFMPEG is None or FFPROBE is None, reason="ffmpeg/ffprobe not installed"
)


def _run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        list(args), check=True, capture_output=True, text=True, timeout=30, cwd=cwd
    )
    return done.stdout


# ---------------------------------------------------------------- layout + WebVTT


def test_layout_counts_and_positions() -> None:
    layout = sprite_layout(25.0, interval=2.0, columns=3, rows=2)
    assert layout.count == 13  # ceil(25 / 2)
    assert layout.sheets == 3  # 6 + 6 + 1
    assert layout.tiles[0] == SpriteTile(0, 0.0, 2.0, 0, 0, 0)
    assert layout.tiles[4] == SpriteTile(4, 8.0, 10.0, 0, 1, 1)
    assert layout.tiles[6] == SpriteTile(6, 12.0, 14.0, 1, 0, 0)
    assert layout.tiles[-1] == SpriteTile(12, 24.0, 25.0, 2, 0, 0)
    assert layout.tiles[4].xywh(160, 90) == (160, 90, 160, 90)
    assert layout.sheet_size(160, 90) == (480, 180)


@pytest.mark.parametrize(
    ("duration", "count"),
    [(8.0, 4), (7.5, 4), (6.9, 4), (0.5, 1), (0.0004 + 2.0, 1), (2.001, 2), (1.1, 1)],
)
def test_layout_count_is_ceil_at_least_one(duration: float, count: int) -> None:
    assert sprite_layout(duration, interval=2.0, columns=5, rows=5).count == count


def test_layout_float_noise_does_not_add_a_thumbnail() -> None:
    assert sprite_layout(1.1, interval=0.1, columns=10, rows=10).count == 11  # 11.000000000000002


def test_layout_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="duration"):
        sprite_layout(0.0, interval=1.0, columns=1, rows=1)
    with pytest.raises(ValueError, match="interval"):
        sprite_layout(1.0, interval=0.0, columns=1, rows=1)
    with pytest.raises(ValueError, match="grid"):
        sprite_layout(1.0, interval=1.0, columns=0, rows=1)


def test_webvtt_document() -> None:
    layout = sprite_layout(5.5, interval=2.0, columns=2, rows=1)
    vtt = webvtt_index(layout, thumb_width=160, thumb_height=90)
    assert vtt == (
        "WEBVTT\n\n"
        "00:00:00.000 --> 00:00:02.000\nsprite_001.jpg#xywh=0,0,160,90\n\n"
        "00:00:02.000 --> 00:00:04.000\nsprite_001.jpg#xywh=160,0,160,90\n\n"
        "00:00:04.000 --> 00:00:05.500\nsprite_002.jpg#xywh=0,0,160,90\n\n"
    )
    custom = webvtt_index(
        layout, thumb_width=160, thumb_height=90, sheet_name=lambda i: f"s{i}.jpg"
    )
    assert "s1.jpg#xywh=0,0,160,90" in custom


def test_webvtt_last_cue_ends_at_duration_never_beyond() -> None:
    layout = sprite_layout(3725.4567, interval=10.0, columns=10, rows=10)
    vtt = webvtt_index(layout, thumb_width=128, thumb_height=72)
    cues = [block for block in vtt.split("\n\n") if "-->" in block]
    assert len(cues) == 373
    assert cues[-1].startswith("01:02:00.000 --> 01:02:05.457\nsprite_004.jpg#xywh=")
    ends = [c.split(" --> ")[1].split("\n")[0] for c in cues]
    starts = [c.split(" --> ")[0] for c in cues]
    assert starts[1:] == ends[:-1]  # contiguous, no gaps or overlaps


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "00:00:00.000"),
        (0.0005, "00:00:00.001"),
        (0.0004, "00:00:00.000"),
        (59.9996, "00:01:00.000"),
        (59.9994, "00:00:59.999"),
        (3599.9999, "01:00:00.000"),
        (3661.001, "01:01:01.001"),
        (360000.0, "100:00:00.000"),
    ],
)
def test_vtt_timestamp_rounding(seconds: float, text: str) -> None:
    assert vtt_timestamp(seconds) == text


def test_sprite_filter_string() -> None:
    assert sprite_filter(interval=2, width=160, height=90, columns=5, rows=4) == (
        "fps=1/2.0:eof_action=pass,scale=160:90,setsar=1,tile=5x4"
    )


# ---------------------------------------------------------------- scale=W:-2


@pytest.mark.parametrize(
    ("width", "src_w", "src_h", "expected"),
    [
        (160, 1920, 1080, 90),
        (90, 1920, 1080, 50),
        (160, 1080, 1920, 284),
        (161, 1080, 1920, 286),
        (160, 639, 359, 90),
        (7, 639, 359, 4),
        (12, 100, 75, 10),  # 4.5 rounds half up (av_rescale), not to even
        (20, 100, 75, 16),
        (7, 101, 33, 2),
    ],
)
def test_thumb_height_known_values(width: int, src_w: int, src_h: int, expected: int) -> None:
    assert thumb_height_for(width, src_w, src_h) == expected


def test_thumb_height_ignores_sar_and_rejects_zero() -> None:
    assert thumb_height_for(160, 720, 480, sar=32 / 27) == thumb_height_for(160, 720, 480) == 106
    with pytest.raises(ValueError, match="height 0"):
        thumb_height_for(2, 101, 33)
    with pytest.raises(ValueError, match="positive"):
        thumb_height_for(160, 0, 33)


@needs_ffmpeg
def test_thumb_height_matches_real_ffmpeg(tmp_path: Path) -> None:
    # testsrc (not testsrc2, which silently rounds odd sizes down to even) + setsar.
    cases = [
        (160, 1920, 1080, "1"),
        (160, 1080, 1920, "1"),
        (161, 1080, 1920, "1"),
        (160, 639, 359, "1"),
        (160, 1280, 720, "1"),
        (160, 720, 480, "32/27"),
        (320, 720, 480, "8/9"),
        (12, 100, 75, "1"),
        (90, 100, 75, "1"),
        (7, 101, 33, "1"),
    ]
    out = tmp_path / "x.png"
    for width, src_w, src_h, sar in cases:
        _run(
            *(FFMPEG or "ffmpeg", "-v", "error", "-y"),
            *("-f", "lavfi", "-i", f"testsrc=s={src_w}x{src_h}:r=1:d=1"),
            *("-vf", f"setsar={sar},scale={width}:-2", "-frames:v", "1", str(out)),
        )
        probed = _run(
            *(FFPROBE or "ffprobe", "-v", "error", "-show_entries", "stream=width,height"),
            *("-of", "csv=p=0", str(out)),
        )
        got_w, got_h = (int(v) for v in probed.strip().split(","))
        sar_value = float(Fraction(sar))
        assert (got_w, got_h) == (width, thumb_height_for(width, src_w, src_h, sar_value)), (
            width,
            src_w,
            src_h,
            sar,
        )


# ---------------------------------------------------------------- sprites from ffmpeg


@needs_ffmpeg
@pytest.mark.parametrize("duration", [6.9, 7.5, 8.04])
def test_layout_matches_ffmpeg_sprites(tmp_path: Path, duration: float) -> None:
    interval, columns, rows, width = 2.0, 2, 1, 160
    height = thumb_height_for(width, 320, 180)
    vf = sprite_filter(interval=interval, width=width, height=height, columns=columns, rows=rows)
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error", "-y"),
        *("-f", "lavfi", "-i", f"testsrc=s=320x180:r=24:d={duration}"),
        *("-vf", vf, "sprite_%03d.jpg"),
        cwd=tmp_path,
    )
    sheets = sorted(tmp_path.glob("sprite_*.jpg"))
    # real duration of a 24 fps testsrc is a whole number of frames
    real = math.ceil(duration * 24 - 1e-9) / 24
    layout = sprite_layout(real, interval=interval, columns=columns, rows=rows)
    assert [p.name for p in sheets] == [f"sprite_{i + 1:03d}.jpg" for i in range(layout.sheets)]
    for sheet in sheets:  # the last, partly filled sheet is full size too
        assert jpeg_dimensions(sheet) == layout.sheet_size(width, height)


@needs_ffmpeg
@pytest.mark.parametrize(("duration", "thumbs"), [(6.9, 4), (7.5, 4), (8.0, 4), (0.5, 1)])
def test_eof_action_pass_gives_ceil(tmp_path: Path, duration: float, thumbs: int) -> None:
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error", "-y"),
        *("-f", "lavfi", "-i", f"testsrc=s=64x36:r=24:d={duration}"),
        *("-vf", "fps=1/2.0:eof_action=pass", "t_%03d.png"),
        cwd=tmp_path,
    )
    assert len(list(tmp_path.glob("t_*.png"))) == thumbs
    assert sprite_layout(duration, interval=2.0, columns=1, rows=1).count == thumbs


# ---------------------------------------------------------------- JPEG headers


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def test_jpeg_dimensions_progressive_with_app_segments_and_fill(tmp_path: Path) -> None:
    sof2 = bytes([8]) + (1080).to_bytes(2, "big") + (1920).to_bytes(2, "big") + b"\x03" + b"\0" * 9
    data = (
        b"\xff\xd8"
        + _segment(0xE0, b"JFIF\0\1\1\0\0\1\0\1\0\0")
        + _segment(0xE1, b"Exif\0\0" + b"\xff\xc0" * 300)  # a fake SOF inside EXIF is skipped
        + b"\xff\xff"  # fill bytes before the next marker
        + _segment(0xDB, b"\0" * 65)
        + _segment(0xC2, sof2)
        + _segment(0xDA, b"\0" * 10)
    )
    path = tmp_path / "p.jpg"
    path.write_bytes(data)
    assert jpeg_dimensions(path) == (1920, 1080)


def test_jpeg_dimensions_refuses_non_jpeg(tmp_path: Path) -> None:
    png = tmp_path / "x.jpg"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match="not a JPEG"):
        jpeg_dimensions(png)
    headless = tmp_path / "y.jpg"
    headless.write_bytes(b"\xff\xd8" + _segment(0xE0, b"JFIF\0") + _segment(0xDA, b"\0" * 4))
    with pytest.raises(ValueError, match="no JPEG frame header"):
        jpeg_dimensions(headless)
    truncated = tmp_path / "z.jpg"
    truncated.write_bytes(b"\xff\xd8\xff\xe0\x00")
    with pytest.raises(ValueError, match="no JPEG frame header"):
        jpeg_dimensions(truncated)


@needs_ffmpeg
def test_jpeg_dimensions_of_ffmpeg_jpeg(tmp_path: Path) -> None:
    out = tmp_path / "a.jpg"
    _run(
        *(FFMPEG or "ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=s=322x182:d=1"),
        *("-frames:v", "1", str(out)),
    )
    assert jpeg_dimensions(out) == (322, 182)
