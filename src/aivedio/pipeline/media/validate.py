"""The validation rules of a source, as a pure function of ffprobe's output.

``summarize`` picks the streams we will use and ``validate`` returns every reason code that
applies (not just the first), so a verdict tells the whole story. Per-provider/model
tolerances compare the media with what the generation request declared.

Which streams: of each kind, the one a player would play, the first with the default
disposition, else the first (a cover picture is never the video). This is the one place
that decides: the summary records the choice by absolute index, the plan carries it, and
every ffmpeg run (decode check, render, packaging, HLS, waveform, the chunked split) maps
exactly those streams. Every other stream is ignored, and listed in the summary with why
(``ignored_streams``), rather than refused: more audio tracks than we publish is a file
a player plays, not a bad one. The only cap on streams is the parser limit the demuxer is
given (``[media] max_streams``, refused as ``too_many_streams``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import msgspec

from aivedio.config.media import MediaConfig, ToleranceConfig
from aivedio.pipeline.ffmpeg.probe import ProbeOutput, Stream, parse_rate, rotation_of
from aivedio.pipeline.media.colour import Colour, HdrMetadata, bit_depth, filled, hdr_metadata


class IgnoredStream(msgspec.Struct, frozen=True, kw_only=True):
    """A stream of the source that no output carries, and why."""

    index: int  # absolute, as ffprobe numbers them
    codec_type: str
    codec_name: str
    language: str  # the stream's language tag, "" when it has none
    # not_chosen: another stream of its kind was chosen; cover_picture: an attached
    # picture; not_rendered: a kind no output carries (subtitle, data, attachment).
    why: str


# Subtitle codecs whose text becomes a published WebVTT track (``media/text_tracks.py``);
# bitmap subtitles (PGS, DVB) have no text to publish and stay not rendered.
TEXT_CODECS = frozenset({"mov_text", "subrip", "webvtt"})


class TextStream(msgspec.Struct, frozen=True, kw_only=True):
    """A subtitle stream of the source whose text is published as a track."""

    index: int  # absolute, as ffprobe numbers them
    codec_name: str
    language: str  # the stream's language tag, "" when it has none
    title: str  # its title tag, "" when it has none
    default: bool
    captions: bool  # marked for the hearing impaired (captions, not subtitles)


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
    # The video track's own duration when the container states it (the file's may be an
    # audio track's): a single frame under a long audio track is too short to render.
    video_duration_seconds: float | None = None
    ignored_streams: list[IgnoredStream] = msgspec.field(default_factory=list)
    # The subtitle streams published as text tracks (mov_text, subrip, webvtt).
    text_streams: list[TextStream] = msgspec.field(default_factory=list)
    # The video's colour as probed ("" where the stream has no tag), its bits per
    # component and its HDR side data (the stream's, else its first frame's).
    color_primaries: str = ""
    color_transfer: str = ""
    color_space: str = ""  # the matrix
    color_range: str = ""
    bit_depth: int | None = None
    hdr: HdrMetadata | None = None
    # The colour the source is taken to have: the probed tags, BT.709 limited where missing.
    colour_assumed: Colour | None = None

    @property
    def colour(self) -> Colour:
        """The probed colour ("" for a missing tag)."""
        return Colour(
            primaries=self.color_primaries,
            transfer=self.color_transfer,
            matrix=self.color_space,
            range=self.color_range,
        )


@dataclass(frozen=True, slots=True)
class Declared:
    """What the generation request said the output would be (all optional)."""

    duration_seconds: float | None = None
    width: int | None = None
    height: int | None = None


def _video_streams(probe: ProbeOutput) -> list[Stream]:
    return [s for s in probe.streams if s.codec_type == "video" and not s.disposition.attached_pic]


def chosen(streams: list[Stream]) -> Stream | None:
    """The stream of a kind a player would play: the first with the default disposition,
    else the first; None when there is none."""
    return next((s for s in streams if s.disposition.default), streams[0] if streams else None)


def _ignored(probe: ProbeOutput, used: set[int]) -> list[IgnoredStream]:
    ignored: list[IgnoredStream] = []
    for stream in probe.streams:
        if stream.index in used:
            continue
        if stream.codec_type == "video" and stream.disposition.attached_pic:
            why = "cover_picture"
        elif stream.codec_type in ("video", "audio"):
            why = "not_chosen"
        else:
            why = "not_rendered"
        ignored.append(
            IgnoredStream(
                index=stream.index,
                codec_type=stream.codec_type or "unknown",
                codec_name=stream.codec_name,
                why=why,
                language=stream.tags.get("language", ""),
            )
        )
    return ignored


def _text_streams(probe: ProbeOutput) -> list[TextStream]:
    return [
        TextStream(
            index=s.index,
            codec_name=s.codec_name,
            language=s.tags.get("language", ""),
            title=s.tags.get("title", ""),
            default=bool(s.disposition.default),
            captions=bool(s.disposition.hearing_impaired or s.disposition.captions),
        )
        for s in probe.streams
        if s.codec_type == "subtitle" and s.codec_name in TEXT_CODECS
    ]


def summarize(probe: ProbeOutput) -> MediaSummary | None:
    """The summary of the streams we would use; None when there is no usable video stream."""
    video = chosen(_video_streams(probe))
    if video is None:
        return None
    audio = chosen([s for s in probe.streams if s.codec_type == "audio"])
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
    texts = _text_streams(probe)
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
        video_duration_seconds=video.duration if video.duration and video.duration > 0 else None,
        ignored_streams=_ignored(
            probe,
            {video.index} | ({audio.index} if audio else set()) | {t.index for t in texts},
        ),
        text_streams=texts,
        color_primaries=_tag(video.color_primaries),
        color_transfer=_tag(video.color_transfer),
        color_space=_tag(video.color_space),
        color_range=_tag(video.color_range),
        bit_depth=bit_depth(video.pix_fmt, video.bits_per_raw_sample),
        hdr=hdr_metadata(video.side_data_list),
        colour_assumed=filled(
            Colour(
                primaries=video.color_primaries,
                transfer=video.color_transfer,
                matrix=video.color_space,
                range=video.color_range,
            )
        ),
    )


def _tag(value: str) -> str:
    """A colour tag as recorded: "" when the stream does not set one."""
    return "" if value in ("unknown", "unspecified", "reserved") else value


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
    else:
        if max(s.width, s.height) > max(media.max_width, media.max_height) or min(
            s.width, s.height
        ) > min(media.max_width, media.max_height):
            reasons.append(f"dimensions_too_large:{s.width}x{s.height}")
        # The coded size, then the displayed one (a 16x16 picture with 1:4 pixels shows 4x16).
        for width, height in ((s.width, s.height), (s.display_width, s.display_height)):
            if _below(width, height, media):
                reasons.append(f"dimensions_too_small:{width}x{height}")
                break
    if s.width * s.height > media.max_pixels:
        reasons.append("too_many_pixels")
    if not s.pix_fmt:
        reasons.append("pixel_format_unknown")
    sar = parse_rate(s.sar.replace(":", "/"))
    if s.sar not in ("", "0:1", "N/A") and (sar is None or not Fraction(1, 4) <= sar <= 4):
        reasons.append(f"sample_aspect_ratio_invalid:{s.sar}")
    # The chosen video's own display matrix: an ignored stream's is never applied.
    raw_rotations = [
        side.rotation
        for st in probe.streams
        if st.index == s.video_stream_index
        for side in st.side_data_list
        if side.rotation
    ]
    if any(abs(r) % 90 for r in raw_rotations):
        reasons.append("rotation_not_right_angle")
    if s.duration_seconds <= 0:
        reasons.append("duration_missing")
    elif s.duration_seconds < media.min_duration_seconds:
        reasons.append("duration_too_short")
    elif s.duration_seconds > media.max_duration_seconds:
        reasons.append("duration_too_long")
    video_seconds = s.video_duration_seconds
    if (
        video_seconds is not None
        and video_seconds < media.min_duration_seconds <= s.duration_seconds
    ):
        reasons.append("video_duration_too_short")
    if not -1.0 <= s.start_time <= 10.0:
        reasons.append("start_time_out_of_range")
    if s.frame_rate <= 0 and s.real_frame_rate <= 0:
        reasons.append("frame_rate_missing")
    elif max(s.frame_rate, s.real_frame_rate) > media.max_frame_rate:
        reasons.append("frame_rate_too_high")
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


def _below(width: int, height: int, media: MediaConfig) -> bool:
    """Under the minimum size in either orientation, as the maximum is read (minimums of
    32x16 take 16x32 portrait and refuse 20x20)."""
    short, long = min(media.min_width, media.min_height), max(media.min_width, media.min_height)
    return min(width, height) < short or max(width, height) < long


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
