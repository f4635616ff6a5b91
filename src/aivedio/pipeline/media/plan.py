"""The processing plan: a pure function of the validated media summary and ``[media]``.

Remux when the source already plays everywhere: H.264 in a sane profile
and level, yuv420p, progressive, constant frame rate, square pixels, no rotation to apply,
even dimensions, AAC-LC or no audio. Otherwise transcode to H.264 + AAC-LC, yuv420p, rotation
applied, VFR made constant.

The ladder never goes above the source (a rung's size is its short side: "720" is 1280x720
landscape and 720x1280 portrait). Every rendition splits at the same timestamps:

* transcode: every rung comes from one decode and gets keyframes forced at multiples of the
  segment duration and nowhere else;
* remux: the top rung is the source's own bitstream, so its keyframes decide; the cut points
  are computed with the HLS muxer's own rule and lower rungs get keyframes exactly there.

The AV1 ladder (``av1_rungs``, when the tenant or the pipeline version has it) is a twin of
every rung from the same decode (on the chunked path, the same decode of each chunk); its
rungs split at the same timestamps as each other (a GOP of one segment, or of a chunk's
share of one: ``av1.py`` says why), not necessarily as the H.264 ones'.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from aivedio.config.media import MediaConfig
from aivedio.pipeline.media import av1, colour, loudness
from aivedio.pipeline.media.chunks import Chunking, make_chunking
from aivedio.pipeline.media.colour import Colour
from aivedio.pipeline.media.keyframes import Packet, segment_boundaries
from aivedio.pipeline.media.loudness import Loudness
from aivedio.pipeline.media.validate import MediaSummary

# The rate transcoded audio is never above (and what ``loudnorm``'s output returns to).
AUDIO_MAX_RATE = 48000
REMUX_PROFILES = frozenset({"Constrained Baseline", "Baseline", "Main", "High"})
MAX_REMUX_LEVEL = 51  # 5.1
MAX_OUTPUT_FPS = 60.0


class Rung(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # "720p"
    width: int
    height: int
    copy: bool  # the source's own bitstream
    crf: int
    maxrate_kbps: int
    bufsize_kbps: int
    codec: str = "h264"  # h264 | av1
    # sdr; pq: the HDR10 rendition (the source's PQ picture, not tone-mapped, 10-bit)
    dynamic_range: str = "sdr"


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    mode: str  # "remux" | "transcode"
    transcode_reasons: list[str]
    rungs: list[Rung]  # top first
    frame_rate: float  # output rate of transcoded rungs
    frame_rate_expr: str  # the same as an exact ffmpeg rate ("30000/1001")
    audio: str  # "copy" | "aac" | "none"
    segment_seconds: float
    # remux: where the copied rung will be cut; lower rungs get keyframes exactly there.
    cut_points: list[float] | None
    gop_frames: int
    proxy: Rung | None
    poster_seconds: float
    sprite_interval: float
    sprite_width: int
    sprite_height: int
    waveform_zooms: list[int]
    waveform_sample_rate: int
    duration_seconds: float
    required: list[str]
    optional: list[str]
    pipeline_version: int
    # The source streams used, by absolute index (a cover picture may be stream 0).
    video_stream: int = 0
    audio_stream: int | None = None
    # A long source: split at keyframes, (chunk, rendition) encoded as separate jobs; None:
    # one pass. Recorded here so the worker and ``aivedio process`` take the same path.
    chunking: Chunking | None = None
    # The earliest pts or dts among the first packets of the source's video and audio (the
    # probe's scans): what a copied rung adds to the HLS timestamp offset. None (a plan
    # recorded before it was, or made without the scans): the render scans the source.
    source_earliest: float | None = None
    # The colour of every rendition (tags written on each output, a copy's too) and the
    # chain that makes it from the decoded source ("" none); None: a plan recorded before
    # colour was planned (its outputs keep what ffmpeg passes through).
    colour: Colour | None = None
    colour_filter: str = ""
    dynamic_range: str = "sdr"  # the source's: sdr | pq | hlg
    # The source audio's EBU R128 figures (None: not measured, or no audio) and the
    # filter that normalizes it ("" none: the audio as it is).
    loudness: Loudness | None = None
    audio_filter: str = ""
    # The AV1 ladder beside the H.264 one (top first; empty: none), every rung encoded
    # from the same decode, published in the same HLS master (``av1_rungs``).
    av1_rungs: list[Rung] = msgspec.field(default_factory=list)
    # The HDR10 rendition's colour (the source's, limited range) and SVT-AV1 parameters
    # (its mastering display and light levels); None: the plan has no HDR10 rendition.
    hdr10_colour: Colour | None = None
    hdr10_params: str = ""

    @property
    def path(self) -> str:
        return "chunked" if self.chunking is not None else "single_pass"

    @property
    def video_map(self) -> str:
        return f"0:{self.video_stream}"

    @property
    def audio_map(self) -> str:
        return f"0:{self.audio_stream}" if self.audio_stream is not None else "0:a:0"

    @property
    def outputs(self) -> list[str]:
        return [*self.required, *self.optional]

    @property
    def top(self) -> Rung:
        return self.rungs[0]

    @property
    def renditions(self) -> list[Rung]:
        """Every HLS rendition: the H.264 ladder, then the AV1 one."""
        return [*self.rungs, *self.av1_rungs]


def transcode_reasons(s: MediaSummary) -> list[str]:
    """Why the source cannot be remuxed; empty means it can."""
    reasons = []
    if s.video_codec != "h264":
        reasons.append(f"video_codec:{s.video_codec}")
    elif s.video_profile not in REMUX_PROFILES:
        reasons.append(f"profile:{s.video_profile}")
    if s.video_codec == "h264" and s.video_level is not None and s.video_level > MAX_REMUX_LEVEL:
        reasons.append(f"level:{s.video_level}")
    if s.pix_fmt not in ("yuv420p", "yuvj420p"):
        reasons.append(f"pix_fmt:{s.pix_fmt}")
    if s.rotation:
        reasons.append(f"rotation:{s.rotation}")
    if s.variable_frame_rate:
        reasons.append("variable_frame_rate")
    if s.interlaced:
        reasons.append("interlaced")
    if s.sar not in ("", "1:1", "0:1", "N/A"):
        reasons.append(f"sar:{s.sar}")
    if s.width % 2 or s.height % 2:
        reasons.append("odd_dimensions")
    if s.frame_rate > MAX_OUTPUT_FPS:
        reasons.append("frame_rate")
    if s.audio_codec is not None and (s.audio_codec != "aac" or s.audio_profile != "LC"):
        reasons.append(f"audio:{s.audio_codec}/{s.audio_profile}")
    reasons += colour.remux_reasons(s.colour)
    # Cut points are source timestamps and forced keyframes are output timestamps: they
    # agree only when the video starts at zero (within half a frame).
    half_frame = 0.5 / (s.frame_rate or 30.0)
    if abs(s.start_time) > half_frame:
        reasons.append("start_time")
    return reasons


def _even(value: float) -> int:
    return max(2, round(value / 2.0) * 2)


def _size_for(short_side: int, s: MediaSummary) -> tuple[int, int]:
    """(width, height) with the given short side, keeping the display aspect, both even."""
    dw, dh = max(s.display_width, 1), max(s.display_height, 1)
    if dw >= dh:
        return _even(short_side * dw / dh), short_side
    return short_side, _even(short_side * dh / dw)


def _size_for_width(width: int, s: MediaSummary) -> tuple[int, int]:
    """(width, even height) at the display aspect (SAR and rotation applied)."""
    return width, _even(width * max(s.display_height, 1) / max(s.display_width, 1))


def output_frame_rate(s: MediaSummary) -> tuple[float, str]:
    """The constant rate transcoded rungs use: the source's, or its average if VFR, capped."""
    rate = s.frame_rate if s.variable_frame_rate or s.real_frame_rate <= 0 else s.real_frame_rate
    rate = min(rate or 30.0, MAX_OUTPUT_FPS)
    for exact, expr in (
        (24000 / 1001, "24000/1001"),
        (30000 / 1001, "30000/1001"),
        (60000 / 1001, "60000/1001"),
    ):
        if abs(rate - exact) < 0.005:
            return exact, expr
    if s.variable_frame_rate:
        rate = float(round(rate))
    return rate, f"{rate:.6g}"


def poster_seconds(s: MediaSummary, media: MediaConfig) -> float:
    """Where the poster is taken: ``poster_at_ratio`` of the way into the video track (which
    may end long before an audio track), at most ``poster_max_seconds``."""
    duration = max(s.duration_seconds, 0.0)
    pictured = min(duration, s.video_duration_seconds or duration)
    return min(pictured * media.poster_at_ratio, media.poster_max_seconds)


def make_plan(
    s: MediaSummary,
    media: MediaConfig,
    *,
    source_keyframes: list[float] | None = None,
    stream_start: float | None = None,
    outputs: list[str] | None = None,
    video_packets: list[Packet] | None = None,
    source_earliest: float | None = None,
    measured: Loudness | None = None,
    normalize: bool = True,
    av1: bool = False,
) -> Plan:
    """The plan for this media. ``measured``: the audio's loudness, normalized when
    ``normalize`` (the tenant's switch) and ``[media.loudness] normalize`` are both on.
    ``source_keyframes`` (seconds) is needed to remux with HLS;
    ``stream_start`` is the earliest packet of any stream muxed with the video (AAC priming
    starts about 23 ms before the video), from which the HLS muxer measures its cuts.
    ``video_packets`` (decode order) lets a source longer than
    ``chunk_threshold_seconds`` take the chunked path. ``source_earliest`` is recorded as
    given (``Plan.source_earliest``). ``av1``: the tenant's revisions get the AV1 ladder
    (``av1.wanted``), on either path (a chunked plan's AV1 pieces are encoded per chunk)."""
    reasons = transcode_reasons(s)
    mode = "transcode" if reasons else "remux"
    short = min(s.display_width, s.display_height)
    ladder = sorted(media.ladder, key=lambda rung: -rung.height)
    rungs: list[Rung] = []
    if mode == "remux":
        rungs.append(
            Rung(
                name=f"{short}p",
                width=s.display_width,
                height=s.display_height,
                copy=True,
                crf=0,
                maxrate_kbps=0,
                bufsize_kbps=0,
            )
        )
    for config in ladder:
        if config.height > short or (mode == "remux" and config.height >= short):
            continue
        width, height = _size_for(config.height, s)
        rungs.append(
            Rung(
                name=f"{config.height}p",
                width=width,
                height=height,
                copy=False,
                crf=config.crf,
                maxrate_kbps=config.maxrate_kbps,
                bufsize_kbps=config.bufsize_kbps,
            )
        )
    if not rungs:  # smaller than every rung: one rung at the source's own size
        smallest = ladder[-1]
        width, height = _size_for(_even(short - 1 if short % 2 else short), s)
        rungs.append(
            Rung(
                name=f"{min(width, height)}p",
                width=width,
                height=height,
                copy=False,
                crf=smallest.crf,
                maxrate_kbps=smallest.maxrate_kbps,
                bufsize_kbps=smallest.bufsize_kbps,
            )
        )
    rate, rate_expr = output_frame_rate(s)
    cut_points: list[float] | None = None
    if mode == "remux":
        keyframes = source_keyframes if source_keyframes else [s.start_time]
        origin = keyframes[0] if stream_start is None else min(stream_start, keyframes[0])
        cut_points = segment_boundaries(
            keyframes, segment_seconds=media.segment_seconds, start=origin
        )
    proxy_short = min(media.proxy_height, short - short % 2)
    pw, ph = _size_for(proxy_short, s)
    proxy = Rung(
        name=f"proxy{proxy_short}p",
        width=pw,
        height=ph,
        copy=False,
        crf=media.proxy_crf,
        maxrate_kbps=0,
        bufsize_kbps=0,
    )
    required = list(media.required_outputs)
    optional = list(media.optional_outputs)
    if outputs is not None:
        required = [o for o in required if o in outputs]
        optional = [o for o in optional if o in outputs]
    audio, audio_filter = audio_treatment(s, media, mode, measured, normalize=normalize)
    duration = max(s.duration_seconds, 0.0)
    chunking = None
    # Only encoding is worth spreading: a remux whose ladder is the copied rung alone is not.
    encodes = any(not rung.copy for rung in rungs)
    if video_packets and encodes and 0 < media.chunk_threshold_seconds < duration:
        chunking = make_chunking(
            video_packets,
            end=max(p.pts or 0.0 for p in video_packets) + 1.0 / rate,
            rate=rate,
            chunk_seconds=media.chunk_seconds,
            segment_seconds=media.segment_seconds,
            allowed=cut_points,
        )
    return Plan(
        mode=mode,
        transcode_reasons=reasons,
        rungs=rungs,
        frame_rate=rate,
        frame_rate_expr=rate_expr,
        audio=audio,
        segment_seconds=media.segment_seconds,
        cut_points=cut_points,
        gop_frames=max(1, math.ceil(rate * media.segment_seconds)),
        proxy=proxy,
        poster_seconds=poster_seconds(s, media),
        sprite_interval=media.sprite_interval_seconds,
        sprite_width=media.sprite_width,
        sprite_height=_size_for_width(media.sprite_width, s)[1],
        waveform_zooms=sorted(media.waveform_zooms),
        waveform_sample_rate=media.waveform_sample_rate,
        duration_seconds=duration,
        required=required,
        optional=optional,
        pipeline_version=media.pipeline_version,
        video_stream=s.video_stream_index,
        audio_stream=s.audio_stream_index,
        chunking=chunking,
        source_earliest=source_earliest,
        colour=colour.output_colour(s.colour, copied=mode == "remux"),
        colour_filter="" if mode == "remux" else colour.colour_filter(s.colour, media.colour),
        dynamic_range=colour.dynamic_range(s.colour),
        loudness=measured,
        audio_filter=audio_filter,
        **_av1_ladder(s, media, rungs, wanted=av1),
    )


# SVT-AV1's CRF scale.
AV1_CRF_RANGE = (1, 63)


def av1_rungs(rungs: list[Rung], media: MediaConfig) -> list[Rung]:
    """The AV1 ladder: a twin of every H.264 rung, at its size, every one encoded (a copied
    rung's twin takes the top configured rung's settings), named ``av1_<rung>``."""
    top = max(media.ladder, key=lambda rung: rung.height)
    config = media.av1
    twins = []
    for rung in rungs:
        base = top if rung.copy else rung
        crf = min(max(base.crf + config.crf_offset, AV1_CRF_RANGE[0]), AV1_CRF_RANGE[1])
        maxrate = round(base.maxrate_kbps * config.maxrate_ratio)
        twins.append(
            Rung(
                name=f"av1_{rung.name}",
                width=rung.width,
                height=rung.height,
                copy=False,
                crf=crf,
                maxrate_kbps=maxrate,
                bufsize_kbps=maxrate * 2,
                codec="av1",
            )
        )
    return twins


def _av1_ladder(
    s: MediaSummary, media: MediaConfig, rungs: list[Rung], *, wanted: bool
) -> dict[str, Any]:
    """The plan's AV1 fields: the ladder, and for a PQ source with ``[media.av1] hdr10``
    the HDR10 rendition (the top rung's size) with its colour and parameters."""
    if not wanted:
        return {}
    twins = av1_rungs(rungs, media)
    if not (media.av1.hdr10 and colour.dynamic_range(colour.filled(s.colour)) == "pq"):
        return {"av1_rungs": twins}
    top = twins[0]
    hdr10 = msgspec.structs.replace(top, name=f"av1_hdr10_{rungs[0].name}", dynamic_range="pq")
    return {
        "av1_rungs": [*twins, hdr10],
        "hdr10_colour": msgspec.structs.replace(colour.filled(s.colour), range="tv"),
        "hdr10_params": av1.hdr10_params(s.hdr),
    }


def audio_treatment(
    s: MediaSummary,
    media: MediaConfig,
    mode: str,
    measured: Loudness | None,
    *,
    normalize: bool,
) -> tuple[str, str]:
    """``(audio, audio_filter)``: ``none`` without audio; a remux copies its audio unless it
    is to be normalized and is off target (then ``aac`` with the gain); a transcode encodes,
    normalized when it is to be (and measured)."""
    if s.audio_codec is None:
        return "none", ""
    config = media.loudness
    wanted = normalize and config.normalize and measured is not None
    rate = min(s.audio_sample_rate or AUDIO_MAX_RATE, AUDIO_MAX_RATE)
    gain = loudness.normalize_filter(measured, config, rate) if measured and wanted else ""
    if mode == "remux":
        if not gain or (measured is not None and loudness.on_target(measured, config)):
            return "copy", ""
        return "aac", gain
    return "aac", gain


def with_loudness(
    plan: Plan, s: MediaSummary, media: MediaConfig, measured: Loudness, *, normalize: bool
) -> Plan:
    """``plan`` (made before the audio was measured) with the measurement and what it
    decides for the audio; the video is planned as it was."""
    audio, audio_filter = audio_treatment(s, media, plan.mode, measured, normalize=normalize)
    return msgspec.structs.replace(plan, loudness=measured, audio=audio, audio_filter=audio_filter)
