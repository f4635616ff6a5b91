"""Sprite-sheet layout and the WebVTT thumbnail index players read for seek previews.

ffmpeg writes the sheets (``fps=1/INTERVAL:eof_action=pass,scale=W:-2,tile=COLSxROWS`` to
``sprite_%03d.jpg``); this module predicts what it writes, so the VTT can be produced without
decoding the sheets, and checks the sheets afterwards from their JPEG headers alone.

Facts checked against ffmpeg 5.1 (see tests/unit/pipeline/media/test_thumbnails.py):

* ``fps=1/I`` with the default ``eof_action=round`` emits ``round(duration / I)`` frames, so a
  7 s clip at I=2 gets 4 thumbnails but a 6.9 s clip gets 3, and a clip shorter than I/2 gets
  none at all. ``eof_action=pass`` emits ``ceil(duration / I)`` (the layout here); use
  :func:`sprite_filter`, which sets it.
* ``scale=W:-2`` computes ``H = round_half_up(W * in_h / (2 * in_w)) * 2`` from the *stored*
  frame size (libavfilter ``ff_scale_adjust_dimensions`` via ``av_rescale``): the sample aspect
  ratio is ignored, so anamorphic sources (720x480 at SAR 32:27) get squeezed thumbnails; the
  output frame just carries a compensating SAR that browsers drawing sprites ignore. Rotated
  sources are autorotated before the filter graph, so pass the *displayed* width and height.
  A result of 0 is an ffmpeg error ("Value 0.000000 for parameter 'dsth' out of range").
* ``tile`` always emits full-size sheets: a last, partly filled sheet is still
  ``COLS*W x ROWS*H`` with the unused cells blank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SpriteTile:
    index: int  # 0-based thumbnail number, in time order
    start: float  # seconds
    end: float  # seconds; the last tile ends at the duration
    sheet_index: int  # 0-based sheet number (file sprite_{sheet_index + 1:03d}.jpg)
    column: int
    row: int

    def xywh(self, thumb_width: int, thumb_height: int) -> tuple[int, int, int, int]:
        return (self.column * thumb_width, self.row * thumb_height, thumb_width, thumb_height)


@dataclass(frozen=True, slots=True)
class SpriteLayout:
    duration: float
    interval: float
    columns: int
    rows: int
    count: int  # thumbnails
    sheets: int
    tiles: tuple[SpriteTile, ...]

    def sheet_size(self, thumb_width: int, thumb_height: int) -> tuple[int, int]:
        """Pixel size of every sheet, the last one included (ffmpeg pads it)."""
        return (self.columns * thumb_width, self.rows * thumb_height)


def sprite_layout(
    duration_seconds: float, *, interval: float, columns: int, rows: int
) -> SpriteLayout:
    """Where each thumbnail lands, for ``fps=1/interval:eof_action=pass`` then ``tile``.

    ``ceil(duration / interval)`` thumbnails (at least one); a remainder under half a
    millisecond does not make a thumbnail (its cue would be empty at WebVTT resolution).
    """
    if not math.isfinite(duration_seconds) or duration_seconds <= 0:
        raise ValueError(f"duration must be a finite positive number, got {duration_seconds}")
    if not math.isfinite(interval) or interval <= 0:
        raise ValueError(f"interval must be a finite positive number, got {interval}")
    if columns < 1 or rows < 1:
        raise ValueError(f"tile grid must be at least 1x1, got {columns}x{rows}")
    count = max(1, math.ceil((duration_seconds - 0.0005) / interval))
    per_sheet = columns * rows
    tiles = []
    for i in range(count):
        cell = i % per_sheet
        tiles.append(
            SpriteTile(
                index=i,
                start=i * interval,
                end=min((i + 1) * interval, duration_seconds),
                sheet_index=i // per_sheet,
                column=cell % columns,
                row=cell // columns,
            )
        )
    return SpriteLayout(
        duration=duration_seconds,
        interval=interval,
        columns=columns,
        rows=rows,
        count=count,
        sheets=-(-count // per_sheet),
        tiles=tuple(tiles),
    )


def sprite_filter(*, interval: float, width: int, height: int, columns: int, rows: int) -> str:
    """The ffmpeg filter chain whose output :func:`sprite_layout` describes.

    ``eof_action=pass`` makes the count ``ceil(duration / interval)`` (the default rounds);
    the height is explicit because ``scale=W:-2`` ignores the sample aspect ratio."""
    rate = f"1/{float(interval)!r}"  # repr round-trips; ffmpeg evaluates the ratio expression
    return f"fps={rate}:eof_action=pass,scale={width}:{height},setsar=1,tile={columns}x{rows}"


def default_sheet_name(sheet_index: int) -> str:
    return f"sprite_{sheet_index + 1:03d}.jpg"


def vtt_timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm``, rounded half up to the millisecond before splitting (never ``60.000``)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"timestamp must be a finite non-negative number, got {seconds}")
    total_ms = math.floor(seconds * 1000 + 0.5)
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}"


def webvtt_index(
    layout: SpriteLayout,
    *,
    thumb_width: int,
    thumb_height: int,
    sheet_name: Callable[[int], str] = default_sheet_name,
) -> str:
    """A WebVTT document with one cue per thumbnail: ``sheet#xywh=x,y,w,h``."""
    if thumb_width < 1 or thumb_height < 1:
        raise ValueError(f"thumbnail size must be positive, got {thumb_width}x{thumb_height}")
    parts = ["WEBVTT\n\n"]
    for tile in layout.tiles:
        x, y, w, h = tile.xywh(thumb_width, thumb_height)
        parts.append(
            f"{vtt_timestamp(tile.start)} --> {vtt_timestamp(tile.end)}\n"
            f"{sheet_name(tile.sheet_index)}#xywh={x},{y},{w},{h}\n\n"
        )
    return "".join(parts)


def thumb_height_for(width: int, source_width: int, source_height: int, sar: float = 1.0) -> int:
    """The height ffmpeg's ``scale=width:-2`` gives a ``source_width x source_height`` frame.

    ``sar`` is accepted but does not change the result: ffmpeg's ``-2`` ignores the sample
    aspect ratio (checked against ffmpeg 5.1). Pass displayed (post-rotation) dimensions.
    """
    del sar  # deliberately unused, see docstring
    if width < 1 or source_width < 1 or source_height < 1:
        raise ValueError(
            f"sizes must be positive, got width={width} source={source_width}x{source_height}"
        )
    # av_rescale(width, in_h, 2 * in_w) rounds half away from zero; all terms are positive.
    height = (width * source_height + source_width) // (2 * source_width) * 2
    if height == 0:
        raise ValueError(
            f"scale={width}:-2 of {source_width}x{source_height} gives height 0 (ffmpeg fails)"
        )
    return height


# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers with no length field: TEM, RST0-7, SOI, EOI.
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})


def jpeg_dimensions(path: Path) -> tuple[int, int]:
    """``(width, height)`` from the first SOF segment (baseline SOF0, progressive SOF2, ...)."""
    with path.open("rb") as handle:
        if handle.read(2) != b"\xff\xd8":
            raise ValueError(f"{path.name}: not a JPEG (no SOI marker)")
        while True:
            byte = handle.read(1)
            if not byte:
                break
            if byte != b"\xff":
                raise ValueError(f"{path.name}: corrupt JPEG (expected a marker)")
            marker = handle.read(1)
            while marker == b"\xff":  # fill bytes may precede a marker
                marker = handle.read(1)
            if not marker:
                break
            code = marker[0]
            if code in _STANDALONE:
                continue
            if code == 0xDA:  # start of scan before any frame header
                break
            length_bytes = handle.read(2)
            if len(length_bytes) < 2:
                break
            length = int.from_bytes(length_bytes, "big")
            if length < 2:
                raise ValueError(f"{path.name}: corrupt JPEG (segment length {length})")
            if code in _SOF_MARKERS:
                body = handle.read(5)
                if len(body) < 5:
                    break
                height = int.from_bytes(body[1:3], "big")
                width = int.from_bytes(body[3:5], "big")
                if width == 0 or height == 0:
                    raise ValueError(f"{path.name}: JPEG frame header has a zero dimension")
                return width, height
            handle.seek(length - 2, 1)
    raise ValueError(f"{path.name}: no JPEG frame header (SOF) found")
