"""The validation rules of seed 002 §11.7.5, as a pure function of ffprobe's output.

``summarize`` picks the streams we will use and ``validate`` returns every reason code that
applies (not just the first), so a verdict tells the whole story. Per-provider/model
tolerances compare the media with what the generation request declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import msgspec

from aivedio.media_config import MediaConfig, ToleranceConfig
from aivedio.pipeline.probe import ProbeOutput, Stream, parse_rate, rotation_of


class MediaSummary(msgspec.Struct, kw_only=True):
    container: str
    duration_seconds: float
    start_time: float
    width: int  # coded size
    height: int
    display_width: int  # after rotation and SAR
    display_height: int
    rotation: int
    sar: str
    video_codec: str
    video_profile: str
    video_level: int | None
    pix_fmt: str
    frame_rate: float  # average
    real_frame_rate: float  # r_frame_rate: the base rate ffmpeg guesses
    variable_frame_rate: bool
    interlaced: bool
    video_bit_rate: int | None
    video_stream_index: int
    audio_stream_index: int | None
    audio_codec: str | None
    audio_profile: str | None
    audio_sample_rate: int | None
    audio_channels: int | None
    audio_channel_layout: str | None
    video_streams: int
    audio_streams: int
    subtitle_streams: int
    attachment_streams: int
    data_streams: int


@dataclass(frozen=True, slots=True)
class Declared:
    """What the generation request said the output would be (all optional)."""

    duration_seconds: float | None = None
    width: int | None = None
    height: int | None = None


def _video_streams(probe: ProbeOutput) -> list[Stream]:
    return [s for s in probe.streams if s.codec_type == "video" and not s.disposition.attached_pic]


def summarize(probe: ProbeOutput) -> MediaSummary | None:
    """The summary of the streams we would use; None when there is no usable video stream."""
    videos = _video_streams(probe)
    if not videos:
        return None
    video = videos[0]
    audios = [s for s in probe.streams if s.codec_type == "audio"]
    audio = audios[0] if audios else None
    avg = parse_rate(video.avg_frame_rate)
    real = parse_rate(video.r_frame_rate)
    rotation = rotation_of(video)
    sar = parse_rate(video.sample_aspect_ratio.replace(":", "/")) or Fraction(1)
    display_w = round(video.width * sar) if sar != 1 else video.width
    display_w, display_h = display_w, video.height
    if rotation in (90, 270):
        display_w, display_h = display_h, display_w
    duration = probe.format.duration if probe.format.duration is not None else video.duration
    start = video.start_time if video.start_time is not None else probe.format.start_time
    counts = {kind: 0 for kind in ("video", "audio", "subtitle", "attachment", "data")}
    for stream in probe.streams:
        if stream.codec_type in counts:
            counts[stream.codec_type] += 1
    return MediaSummary(
        container=probe.format.format_name,
        duration_seconds=float(duration or 0.0),
        start_time=float(start or 0.0),
        width=video.width,
        height=video.height,
        display_width=display_w,
        display_height=display_h,
        rotation=rotation,
        sar=video.sample_aspect_ratio or "1:1",
        video_codec=video.codec_name,
        video_profile=video.profile,
        video_level=video.level,
        pix_fmt=video.pix_fmt,
        frame_rate=float(avg) if avg else 0.0,
        real_frame_rate=float(real) if real else 0.0,
        variable_frame_rate=bool(avg and real and abs(float(avg) - float(real)) > 0.01),
        interlaced=video.field_order not in ("", "progressive", "unknown"),
        video_bit_rate=video.bit_rate,
        video_stream_index=video.index,
        audio_stream_index=audio.index if audio else None,
        audio_codec=audio.codec_name if audio else None,
        audio_profile=audio.profile if audio else None,
        audio_sample_rate=audio.sample_rate if audio else None,
        audio_channels=audio.channels if audio else None,
        audio_channel_layout=audio.channel_layout if audio else None,
        video_streams=len(_video_streams(probe)),
        audio_streams=counts["audio"],
        subtitle_streams=counts["subtitle"],
        attachment_streams=counts["attachment"],
        data_streams=counts["data"],
    )


def validate(
    probe: ProbeOutput,
    media: MediaConfig,
    *,
    declared: Declared | None = None,
    tolerance: ToleranceConfig | None = None,
) -> tuple[MediaSummary | None, list[str]]:
    """Every reason code that makes this media invalid; an empty list means valid."""
    summary = summarize(probe)
    if summary is None:
        audio_only = any(s.codec_type == "audio" for s in probe.streams)
        return None, ["audio_only" if audio_only else "no_video_stream"]
    reasons: list[str] = []
    s = summary
    if s.video_codec not in media.allowed_video_codecs:
        reasons.append(f"video_codec_unsupported:{s.video_codec or 'unknown'}")
    if s.width <= 0 or s.height <= 0:
        reasons.append("zero_dimensions")
    elif max(s.width, s.height) > max(media.max_width, media.max_height) or min(
        s.width, s.height
    ) > min(media.max_width, media.max_height):
        reasons.append(f"dimensions_too_large:{s.width}x{s.height}")
    if s.width * s.height > media.max_pixels:
        reasons.append("too_many_pixels")
    if not s.pix_fmt:
        reasons.append("pixel_format_unknown")
    sar = parse_rate(s.sar.replace(":", "/"))
    if s.sar not in ("", "0:1", "N/A") and (sar is None or not Fraction(1, 4) <= sar <= 4):
        reasons.append(f"sample_aspect_ratio_invalid:{s.sar}")
    raw_rotations = [
        side.rotation for st in probe.streams for side in st.side_data_list if side.rotation
    ]
    if any(abs(r) % 90 for r in raw_rotations):
        reasons.append("rotation_not_right_angle")
    if s.duration_seconds <= 0:
        reasons.append("duration_missing")
    elif s.duration_seconds < media.min_duration_seconds:
        reasons.append("duration_too_short")
    elif s.duration_seconds > media.max_duration_seconds:
        reasons.append("duration_too_long")
    if not -1.0 <= s.start_time <= 10.0:
        reasons.append("start_time_out_of_range")
    if s.frame_rate <= 0 and s.real_frame_rate <= 0:
        reasons.append("frame_rate_missing")
    elif max(s.frame_rate, s.real_frame_rate) > media.max_frame_rate:
        reasons.append("frame_rate_too_high")
    if s.video_streams > 1:
        reasons.append("multiple_video_streams")
    if s.audio_streams > media.max_audio_streams:
        reasons.append("too_many_audio_streams")
    if s.attachment_streams:
        reasons.append("attachments_present")
    if s.audio_codec is not None:
        if s.audio_codec not in media.allowed_audio_codecs:
            reasons.append(f"audio_codec_unsupported:{s.audio_codec}")
        if not s.audio_sample_rate or not 8000 <= s.audio_sample_rate <= 192000:
            reasons.append("audio_sample_rate_invalid")
        if not s.audio_channels or s.audio_channels > 8:
            reasons.append("audio_channels_invalid")
    if declared is not None:
        reasons += _tolerance_reasons(s, declared, tolerance or ToleranceConfig())
    return summary, reasons


def _tolerance_reasons(s: MediaSummary, declared: Declared, tol: ToleranceConfig) -> list[str]:
    reasons: list[str] = []
    if declared.duration_seconds:
        allowed = max(tol.duration_seconds, tol.duration_ratio * declared.duration_seconds)
        if abs(s.duration_seconds - declared.duration_seconds) > allowed:
            reasons.append("duration_mismatch")
    if declared.width and declared.height:
        if tol.resolution_ratio >= 0 and (
            abs(s.display_width - declared.width) > tol.resolution_ratio * declared.width
            or abs(s.display_height - declared.height) > tol.resolution_ratio * declared.height
        ):
            reasons.append("resolution_mismatch")
        if s.display_height and declared.height:
            aspect = s.display_width / s.display_height
            want = declared.width / declared.height
            if abs(aspect - want) > tol.aspect_ratio * want:
                reasons.append("aspect_mismatch")
    return reasons
