"""ffprobe, run in the sandbox on a sniffed file, decoded into typed structs.

ffprobe prints most numbers as strings (``"duration": "10.000000"``); decoding with
``strict=False`` turns them into numbers, and anything it cannot turn into our types is an
invalid file, not a crash. The raw JSON is never trusted further than these structs.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from aivedio.config.media import MediaConfig
from aivedio.errors import InvalidMediaError
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox
from aivedio.pipeline.media.sniff import Sniff, input_args


class SideData(msgspec.Struct, kw_only=True):
    side_data_type: str = ""
    rotation: float | None = None
    # "Mastering display metadata": chromaticities and luminances as ffprobe's fractions
    # ("34000/50000"), kept as text.
    red_x: str = ""
    red_y: str = ""
    green_x: str = ""
    green_y: str = ""
    blue_x: str = ""
    blue_y: str = ""
    white_point_x: str = ""
    white_point_y: str = ""
    min_luminance: str = ""
    max_luminance: str = ""
    # "Content light level metadata", in nits.
    max_content: int | None = None
    max_average: int | None = None
    # "DOVI configuration record" (Dolby Vision).
    dv_profile: int | None = None
    dv_level: int | None = None
    rpu_present_flag: int | None = None
    el_present_flag: int | None = None
    bl_present_flag: int | None = None
    dv_bl_signal_compatibility_id: int | None = None


class Disposition(msgspec.Struct, kw_only=True):
    attached_pic: int = 0
    default: int = 0
    hearing_impaired: int = 0
    captions: int = 0


class Stream(msgspec.Struct, kw_only=True):
    index: int
    codec_type: str = ""
    codec_name: str = ""
    profile: str = ""
    level: int | None = None
    pix_fmt: str = ""
    width: int = 0
    height: int = 0
    sample_aspect_ratio: str = ""
    r_frame_rate: str = ""
    avg_frame_rate: str = ""
    time_base: str = ""
    start_time: float | None = None
    duration: float | None = None
    bit_rate: int | None = None
    nb_frames: int | None = None
    sample_rate: int | None = None
    channels: int | None = None
    channel_layout: str = ""
    field_order: str = ""
    color_range: str = ""
    color_space: str = ""  # the matrix
    color_transfer: str = ""
    color_primaries: str = ""
    bits_per_raw_sample: int | None = None
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    side_data_list: list[SideData] = msgspec.field(default_factory=list)
    disposition: Disposition = msgspec.field(default_factory=Disposition)


class Format(msgspec.Struct, kw_only=True):
    format_name: str = ""
    nb_streams: int = 0
    start_time: float | None = None
    duration: float | None = None
    size: int | None = None
    bit_rate: int | None = None
    tags: dict[str, str] = msgspec.field(default_factory=dict)


class ProbeOutput(msgspec.Struct, kw_only=True):
    streams: list[Stream] = msgspec.field(default_factory=list)
    format: Format = msgspec.field(default_factory=Format)


class ProbedFrame(msgspec.Struct, kw_only=True):
    side_data_list: list[SideData] = msgspec.field(default_factory=list)


class FramesOutput(msgspec.Struct, kw_only=True):
    frames: list[ProbedFrame] = msgspec.field(default_factory=list)


# Text ffprobe prints when one of our parser limits stopped it: a verdict, not a resource
# problem (ffmpeg reports both as ENOMEM, "Cannot allocate memory").
_LIMIT_REASONS = (
    (re.compile(r"exceeds max_streams"), "too_many_streams"),
    (re.compile(r"exceeds specified max pixel count|max_pixels"), "too_many_pixels"),
    (re.compile(r"moov atom not found"), "moov_missing"),
    (re.compile(r"Invalid data found when processing input"), "unparseable"),
)


def parse_rate(text: str) -> Fraction | None:
    """``"30000/1001"`` → Fraction; ``"0/0"`` and junk → None."""
    num, _, den = text.partition("/")
    try:
        value = Fraction(int(num), int(den or "1"))
    except (ValueError, ZeroDivisionError):
        return None
    return value if value > 0 else None


def rotation_of(stream: Stream) -> int:
    """Display rotation in degrees clockwise, normalised to 0, 90, 180 or 270."""
    degrees: float | None = None
    for side in stream.side_data_list:
        if side.rotation is not None:
            degrees = -side.rotation  # the display matrix is counter-clockwise
    if degrees is None and "rotate" in stream.tags:
        try:
            degrees = float(stream.tags["rotate"])
        except ValueError:
            degrees = None
    if degrees is None or not math.isfinite(degrees):
        return 0  # a tag like "nan" or "inf" says nothing about the display
    return round(degrees / 90.0) % 4 * 90


def probe_args(media: MediaConfig, sniff: Sniff, path: Path) -> list[str]:
    return [
        *input_args(sniff, path, max_streams=media.max_streams, max_pixels=media.max_pixels),
        "-print_format",
        "json",
        "-show_format",
        "-show_streams",
    ]


def first_frame_args(media: MediaConfig, sniff: Sniff, path: Path, stream: int) -> list[str]:
    """The side data of the first decoded frame of ``stream``: where an HEVC or AV1 source
    carries its HDR metadata (SEI, OBU) when the container does not (MP4 in ffmpeg 5.1
    reads no ``mdcv``/``clli`` box). One frame is decoded."""
    return [
        *input_args(sniff, path, max_streams=media.max_streams, max_pixels=media.max_pixels),
        "-select_streams",
        str(stream),
        "-read_intervals",
        "%+#1",
        "-show_entries",
        "frame_side_data",
        "-print_format",
        "json",
    ]


async def first_frame_side_data(
    sandbox: Sandbox,
    sniff: Sniff,
    path: Path,
    stream: int,
    *,
    cwd: Path,
    record: list[RunResult] | None = None,
) -> list[SideData]:
    """``first_frame_args``' side data; empty when the run or its output fails (the HDR
    metadata is recorded when it can be read, never a reason to refuse a source)."""
    result = await sandbox.run(
        "ffprobe",
        first_frame_args(sandbox.media, sniff, path, stream),
        cwd=cwd,
        deadline_seconds=sandbox.media.probe_timeout_seconds,
        capture_stdout=True,
        record=record,
    )
    if not result.ok:
        return []
    try:
        output = msgspec.json.decode(result.stdout, type=FramesOutput, strict=False)
    except msgspec.DecodeError:
        return []
    return [side for frame in output.frames[:1] for side in frame.side_data_list]


def limit_reason(result: RunResult) -> str | None:
    """The reason code when a parser limit (or a crash) stopped the tool: a verdict."""
    if result.crashed:
        return "decoder_crashed"
    for line in result.stderr_tail:
        for pattern, reason in _LIMIT_REASONS:
            if pattern.search(line):
                return reason
    return None


async def run_ffprobe(
    sandbox: Sandbox, sniff: Sniff, path: Path, *, cwd: Path, record: list[RunResult] | None = None
) -> tuple[ProbeOutput, RunResult]:
    """Probe; raise InvalidMediaError (with a reason) or ResourceExhaustedError on failure."""
    result = await sandbox.run(
        "ffprobe",
        probe_args(sandbox.media, sniff, path),
        cwd=cwd,
        deadline_seconds=sandbox.media.probe_timeout_seconds,
        capture_stdout=True,
        record=record,
    )
    reason = limit_reason(result)
    if not result.ok:
        if reason is None:
            result.raise_if_exhausted()
        raise invalid(reason or "probe_failed", result.error_detail())
    try:
        output = msgspec.json.decode(result.stdout, type=ProbeOutput, strict=False)
    except msgspec.DecodeError as exc:
        raise invalid("probe_unreadable", f"ffprobe output did not decode: {exc}") from None
    return output, result


def raise_decode_failed(result: RunResult) -> NoReturn:
    """A decode that failed: ``ResourceExhaustedError`` when it ran out of time or memory,
    else the verdict (``InvalidMediaError``: the parser limit or crash that stopped it, or
    ``decode_failed``)."""
    reason = limit_reason(result)
    if reason is None:
        result.raise_if_exhausted()
    raise invalid(reason or "decode_failed", result.error_detail())


def invalid(reason: str, detail: str = "", reasons: list[str] | None = None) -> InvalidMediaError:
    return InvalidMediaError(
        f"{reason}: {detail}" if detail else reason, reasons=reasons or [reason]
    )


def to_builtins(output: ProbeOutput) -> Any:
    return msgspec.to_builtins(output)
