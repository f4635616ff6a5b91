"""The [media] section: sandbox limits, validation rules, the ladder and the output sets.

Kept apart from ``config/load.py`` because it is large and only the media stage reads it; the
loader in ``config/load.py`` decodes it like every other section and calls ``validate_media``.
"""

from __future__ import annotations

import msgspec

from aivedio.errors import ConfigError

# Every output the media stage knows how to make. Required and optional sets are subsets.
OUTPUT_TYPES = ("playback", "poster", "hls", "proxy", "sprite", "waveform", "keyframes")


class RungConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One rung of the ladder: a height, a quality target and the rate caps around it."""

    height: int
    crf: int = 23
    maxrate_kbps: int = 5000
    bufsize_kbps: int = 10000


def _default_ladder() -> list[RungConfig]:
    return [
        RungConfig(height=1080, crf=23, maxrate_kbps=6000, bufsize_kbps=12000),
        RungConfig(height=720, crf=23, maxrate_kbps=3500, bufsize_kbps=7000),
        RungConfig(height=480, crf=24, maxrate_kbps=1500, bufsize_kbps=3000),
        RungConfig(height=360, crf=25, maxrate_kbps=800, bufsize_kbps=1600),
    ]


class ToleranceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How far a provider's output may stray from what the generation request declared."""

    duration_seconds: float = 1.0
    duration_ratio: float = 0.1
    # Relative difference of width/height allowed against the declared resolution.
    resolution_ratio: float = 0.0
    aspect_ratio: float = 0.02


# ffmpeg's ``tonemap`` operators (``none`` would leave PQ/HLG values in an SDR picture).
TONEMAP_OPERATORS = ("clip", "linear", "gamma", "reinhard", "hable", "mobius")


class ColourConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How an HDR source (PQ or HLG) becomes the SDR BT.709 of the H.264 ladder."""

    # The tone curve (ffmpeg ``tonemap``): hable keeps highlights and mid-tones, the
    # common choice for film and phone HDR; mobius keeps more in-gamut saturation.
    tonemap: str = "hable"
    # The SDR white the linear light is scaled to, in nits (zscale ``npl``): 100 is the
    # SDR reference white; higher makes the picture darker.
    nominal_peak_nits: float = 100.0
    # The source peak the curve maps to white, relative to nominal_peak_nits (tonemap
    # ``peak``); 0: taken from the frame's mastering metadata, else ffmpeg's default.
    tonemap_peak: float = 0.0
    # Desaturation of highlights brighter than this (tonemap ``desat``); 0: none.
    desaturation: float = 0.0


class LoudnessConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """EBU R128 loudness: measured for every source with audio, and normalized to a target."""

    normalize: bool = True
    target_lufs: float = -16.0  # integrated loudness
    true_peak_dbtp: float = -1.5  # the ceiling of the normalized audio's true peak
    # The loudness range the dynamic fallback (loudnorm) aims for, in LU.
    range_lu: float = 11.0
    # A remuxed source keeps its own audio (a copy) while its integrated loudness is within
    # this many LU of the target and its true peak under the ceiling plus this.
    tolerance_lu: float = 1.0
    # Tenants (by name) whose audio is measured but never normalized.
    off_tenants: list[str] = msgspec.field(default_factory=list)


# SVT-AV1's presets (ffmpeg ``libsvtav1 -preset``): 0 slowest and best, 13 fastest.
SVT_AV1_PRESETS = range(0, 14)


class AV1Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """An AV1 ladder (SVT-AV1) beside the H.264 one, in the same HLS master; off by default.

    A revision gets it when its tenant is in ``tenants``, or for every tenant once
    ``[media] pipeline_version`` reaches ``from_pipeline_version`` (0: never): turning it on
    for everyone is a new pipeline version, so ``aivedio reprocess`` rebuilds older assets
    with it. H.264 stays the fallback every client plays; the player takes AV1 only where
    the browser's Media Source says it decodes it."""

    tenants: list[str] = msgspec.field(default_factory=list)
    from_pipeline_version: int = 0
    # SVT-AV1's speed/quality trade-off, 0 (slowest) to 13. The fast end (8-10) is the
    # one for a ladder made while a viewer may be waiting. 10: at 1080p it took 18-32 %
    # less CPU than 9 for about 0.001 less SSIM and no more bytes; 11 lost more quality
    # for less saving (docs/benchmarks.md, "SVT-AV1 presets").
    preset: int = 10
    # Each AV1 rung's CRF (SVT-AV1's 0..63 scale): its H.264 rung's CRF plus this.
    crf_offset: int = 12
    # Capped CRF: the AV1 rung's peak is this fraction of its H.264 rung's maxrate (0: none).
    maxrate_ratio: float = 0.6
    # 8 or 10 (Main profile, 4:2:0 either way): 10-bit saves some banding for a little CPU.
    bit_depth: int = 8
    # What an ffmpeg run that encodes the AV1 ladder may take beyond the H.264 budget, per
    # second of media: wall time (added to process_timeout_per_media_second) and CPU time
    # (added to cpu_seconds, the run's rlimit).
    process_timeout_per_media_second: float = 40.0
    cpu_seconds_per_media_second: float = 40.0
    # A PQ (HDR10) source's AV1 ladder also gets an HDR10 rendition at the top rung's size:
    # 10-bit, BT.2020 PQ as the source is (the rest of both ladders is tone-mapped SDR),
    # with its mastering display and light levels, ``VIDEO-RANGE=PQ`` in the master.
    hdr10: bool = False


class MediaConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pipeline_version: int = 1
    ffmpeg: str = "ffmpeg"
    ffprobe: str = "ffprobe"
    # Scratch directories are made under this one (empty: the system temp dir).
    scratch_dir: str = ""
    # "auto": a network namespace when the platform allows, recorded either way;
    # "required": refuse to run ffmpeg without one; "off": never try.
    network_isolation: str = "auto"
    # rlimits for every ffmpeg/ffprobe process.
    address_space_mib: int = 6144
    cpu_seconds: int = 3600
    file_size_mib: int = 16384
    open_files: int = 256
    processes: int = 4096
    # Wall-clock deadlines: a fixed part plus a multiple of the media's duration.
    probe_timeout_seconds: float = 30.0
    process_timeout_seconds: float = 120.0
    process_timeout_per_media_second: float = 20.0
    threads: int = 0  # 0: ffmpeg decides
    # Parser limits passed to ffprobe and ffmpeg. ``max_streams`` is the one cap on streams:
    # a file with more is refused (``too_many_streams``); up to it, the streams no output
    # uses are ignored and listed in the verdict.
    max_pixels: int = 4096 * 4096
    max_streams: int = 32
    # Validation rules of a source. The minimums refuse a picture or a clip too small
    # to render (a 1x1 or 4000x2 video, a single frame): each side of the coded and of the
    # displayed size, and the file's and the video track's own duration.
    min_width: int = 16
    min_height: int = 16
    max_width: int = 4096
    max_height: int = 4096
    min_duration_seconds: float = 0.1
    max_duration_seconds: float = 3600.0
    max_frame_rate: float = 120.0
    allowed_video_codecs: list[str] = msgspec.field(
        default_factory=lambda: ["h264", "hevc", "vp9", "av1", "vp8", "mpeg4", "prores"]
    )
    allowed_audio_codecs: list[str] = msgspec.field(
        default_factory=lambda: ["aac", "mp3", "opus", "vorbis", "ac3", "eac3", "flac", "pcm_s16le"]
    )
    # none | sampled (head, middle and tail) | full
    decode_check: str = "sampled"
    decode_sample_seconds: float = 1.0
    # The probe job's fast path (pipeline/fast_path.py): a single-pass source's required set,
    # its decode check (then always a full decode: the moderation frames need every frame)
    # and its moderation in the probe job, published in that job. Off: a render job, then a
    # moderate job, then the publish, as separate jobs.
    fast_path: bool = True
    # On the fast path, the optional outputs made by the probe job after its publish, from
    # the same scratch, their render job held meanwhile (pipeline/inline_enrichment.py):
    # fewer jobs and statements per asset and ENRICHED sooner. Only while no other media job
    # waits for a slot (as the worker's media lane last saw the queue) and not under
    # backlog pressure: under a burst the next probes, which make assets playable, go
    # first and the render jobs follow. Off: always a render job.
    enrich_in_probe: bool = True
    tolerances: dict[str, ToleranceConfig] = msgspec.field(default_factory=dict)
    # Plan and outputs.
    ladder: list[RungConfig] = msgspec.field(default_factory=_default_ladder)
    segment_seconds: float = 4.0
    # Sources longer than this are split at keyframes and encoded as (chunk, rendition)
    # jobs any worker can take (0: never); a chunk is a whole number of segments.
    chunk_threshold_seconds: float = 60.0
    chunk_seconds: float = 20.0
    x264_preset: str = "veryfast"
    audio_bitrate_kbps: int = 128
    proxy_height: int = 540
    proxy_gop_frames: int = 12
    proxy_crf: int = 28
    poster_at_ratio: float = 0.1
    poster_max_seconds: float = 2.0
    sprite_interval_seconds: float = 1.0
    sprite_width: int = 160
    sprite_columns: int = 10
    sprite_rows: int = 10
    waveform_sample_rate: int = 11025
    waveform_zooms: list[int] = msgspec.field(default_factory=lambda: [64, 512])
    required_outputs: list[str] = msgspec.field(default_factory=lambda: ["playback", "poster"])
    optional_outputs: list[str] = msgspec.field(
        default_factory=lambda: ["hls", "proxy", "sprite", "waveform", "keyframes"]
    )
    colour: ColourConfig = msgspec.field(default_factory=ColourConfig)
    loudness: LoudnessConfig = msgspec.field(default_factory=LoudnessConfig)
    av1: AV1Config = msgspec.field(default_factory=AV1Config)


def validate_media(media: MediaConfig) -> None:
    """Semantic checks on [media]; each error names its key."""
    if media.network_isolation not in {"auto", "required", "off"}:
        raise ConfigError("config error: media.network_isolation: one of auto, required, off")
    if media.decode_check not in {"none", "sampled", "full"}:
        raise ConfigError("config error: media.decode_check: one of none, sampled, full")
    for name in ("required_outputs", "optional_outputs"):
        for output in getattr(media, name):
            if output not in OUTPUT_TYPES:
                raise ConfigError(
                    f"config error: media.{name}: unknown output {output!r}; "
                    f"known: {', '.join(OUTPUT_TYPES)}"
                )
    both = set(media.required_outputs) & set(media.optional_outputs)
    if both:
        raise ConfigError(
            f"config error: media.optional_outputs: {sorted(both)} also required; pick one"
        )
    if "playback" not in media.required_outputs:
        raise ConfigError("config error: media.required_outputs: must include playback")
    if not media.ladder:
        raise ConfigError("config error: media.ladder: at least one rung is needed")
    heights = [rung.height for rung in media.ladder]
    if len(set(heights)) != len(heights):
        raise ConfigError("config error: media.ladder: two rungs with the same height")
    for index, rung in enumerate(media.ladder):
        where = f"media.ladder[{index}]"
        if rung.height < 2 or rung.height % 2:
            raise ConfigError(f"config error: {where}.height: must be an even number >= 2")
        if not 0 <= rung.crf <= 51:
            raise ConfigError(f"config error: {where}.crf: must be 0..51")
        if rung.maxrate_kbps <= 0 or rung.bufsize_kbps <= 0:
            raise ConfigError(f"config error: {where}: maxrate_kbps and bufsize_kbps > 0")
    for name in (
        "address_space_mib",
        "cpu_seconds",
        "file_size_mib",
        "open_files",
        "processes",
        "probe_timeout_seconds",
        "process_timeout_seconds",
        "max_pixels",
        "max_streams",
        "min_width",
        "min_height",
        "max_width",
        "max_height",
        "max_duration_seconds",
        "segment_seconds",
        "proxy_height",
        "proxy_gop_frames",
        "sprite_interval_seconds",
        "sprite_width",
        "sprite_columns",
        "sprite_rows",
        "waveform_sample_rate",
        "decode_sample_seconds",
        "pipeline_version",
    ):
        if getattr(media, name) <= 0:
            raise ConfigError(f"config error: media.{name}: must be positive")
    for side in ("width", "height"):
        if getattr(media, f"min_{side}") > getattr(media, f"max_{side}"):
            raise ConfigError(f"config error: media.min_{side}: above media.max_{side}")
    if not 0 <= media.min_duration_seconds <= media.max_duration_seconds:
        raise ConfigError(
            "config error: media.min_duration_seconds: 0 (off) up to max_duration_seconds"
        )
    if media.chunk_threshold_seconds < 0:
        raise ConfigError("config error: media.chunk_threshold_seconds: 0 (off) or more")
    steps = media.chunk_seconds / media.segment_seconds
    if media.chunk_seconds <= 0 or steps < 1 or abs(steps - round(steps)) > 1e-9:
        raise ConfigError(
            "config error: media.chunk_seconds: a whole multiple of media.segment_seconds"
            f" ({media.segment_seconds:g})"
        )
    if media.proxy_height % 2 or media.sprite_width % 2:
        raise ConfigError("config error: media.proxy_height/sprite_width: must be even")
    if not media.waveform_zooms or any(z <= 0 for z in media.waveform_zooms):
        raise ConfigError("config error: media.waveform_zooms: positive samples per pixel")
    if not 0.0 <= media.poster_at_ratio < 1.0:
        raise ConfigError("config error: media.poster_at_ratio: must be in [0, 1)")
    validate_colour(media.colour)
    validate_loudness(media.loudness)
    validate_av1(media.av1)


def validate_av1(av1: AV1Config) -> None:
    if av1.preset not in SVT_AV1_PRESETS:
        raise ConfigError("config error: media.av1.preset: 0 (slowest) to 13 (fastest)")
    if av1.from_pipeline_version < 0:
        raise ConfigError("config error: media.av1.from_pipeline_version: 0 (never) or more")
    if not -23 <= av1.crf_offset <= 40:
        raise ConfigError("config error: media.av1.crf_offset: -23 to 40")
    if not 0.0 <= av1.maxrate_ratio <= 4.0:
        raise ConfigError("config error: media.av1.maxrate_ratio: 0 (uncapped) to 4")
    if av1.bit_depth not in (8, 10):
        raise ConfigError("config error: media.av1.bit_depth: 8 or 10")
    for name in ("process_timeout_per_media_second", "cpu_seconds_per_media_second"):
        if getattr(av1, name) < 0:
            raise ConfigError(f"config error: media.av1.{name}: 0 or more")


def validate_colour(colour: ColourConfig) -> None:
    if colour.tonemap not in TONEMAP_OPERATORS:
        raise ConfigError(
            f"config error: media.colour.tonemap: {colour.tonemap!r}; one of "
            + ", ".join(TONEMAP_OPERATORS)
        )
    if not 10.0 <= colour.nominal_peak_nits <= 10000.0:
        raise ConfigError("config error: media.colour.nominal_peak_nits: 10 to 10000 (nits)")
    if not (colour.tonemap_peak == 0 or 1.0 <= colour.tonemap_peak <= 100.0):
        raise ConfigError(
            "config error: media.colour.tonemap_peak: 0 (from the source) or 1 to 100"
            " (times nominal_peak_nits)"
        )
    if not 0.0 <= colour.desaturation <= 10.0:
        raise ConfigError("config error: media.colour.desaturation: 0 (off) to 10")


def validate_loudness(loudness: LoudnessConfig) -> None:
    # The ranges ffmpeg's loudnorm accepts, so a target is one the fallback can aim for.
    if not -70.0 <= loudness.target_lufs <= -5.0:
        raise ConfigError("config error: media.loudness.target_lufs: -70 to -5 (LUFS)")
    if not -9.0 <= loudness.true_peak_dbtp <= 0.0:
        raise ConfigError("config error: media.loudness.true_peak_dbtp: -9 to 0 (dBTP)")
    if not 1.0 <= loudness.range_lu <= 50.0:
        raise ConfigError("config error: media.loudness.range_lu: 1 to 50 (LU)")
    if not 0.0 <= loudness.tolerance_lu <= 10.0:
        raise ConfigError("config error: media.loudness.tolerance_lu: 0 to 10 (LU)")
