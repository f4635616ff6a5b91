"""The AV1 ladder's rules: who gets it, how a rung is encoded, what it costs, how it is named.

The AV1 rungs are branches of the same decode as the H.264 ladder (``ffmpeg_args``), each
encoded by SVT-AV1 and packaged as its own fMP4 (CMAF) HLS rendition beside the H.264 ones.

Two things differ from H.264 and are the reason this module exists:

* keyframes: ffmpeg 5.1's ``libsvtav1`` ignores ``-force_key_frames`` (the frame type it is
  handed is not passed to the encoder), so the AV1 rungs get a fixed, closed GOP of exactly
  one segment (``-g``): every AV1 rung has keyframes on the same frames, which is what
  switching between them needs. The client switches within one codec family (the player
  takes the AV1 ladder or the H.264 one), so the two ladders need not cut at the same
  frames. On the chunked path each chunk is an encode of its own, so its keyframes fall
  every GOP from the chunk's first frame, wherever that is: a chunk's GOP
  (``chunk_gop_frames``) splits its frames into the fewest GOPs of at most one segment, and
  its AV1 renditions are cut at every keyframe (``EVERY_KEYFRAME_SECONDS``), so each segment
  is one GOP: none longer than a segment, none a sliver left at a chunk's end, and every
  rendition of the ladder cut at the same frames (``chunked_keyframes``);
* the master playlist's ``CODECS``: ``av01.P.LLT.DD`` is read from the rendition's own init
  segment (its ``av1C`` box: profile, level, tier, bit depth, chroma) and its ``colr`` box
  (the colour the rendition is tagged with), never assumed from the settings.
"""

from __future__ import annotations

import math
from pathlib import Path

from aivedio.config.media import AV1Config, MediaConfig
from aivedio.errors import InvalidMediaError
from aivedio.pipeline.media.chunks import Chunking
from aivedio.pipeline.media.colour import HdrMetadata

# ``-hls_time`` for a rendition cut at every keyframe: ffmpeg's HLS muxer cuts at the first
# keyframe at least (segments so far) x ``hls_time`` in, so any time under one frame makes
# every keyframe start a segment.
EVERY_KEYFRAME_SECONDS = 0.001


def wanted(media: MediaConfig, tenant: str | None) -> bool:
    """Whether a revision of ``tenant``'s (None: no tenant, ``aivedio process``) gets the
    AV1 ladder: the tenant is listed, or the pipeline version has reached the one AV1 is on
    for everyone from."""
    config = media.av1
    every = 0 < config.from_pipeline_version <= media.pipeline_version
    return every or (tenant is not None and tenant in config.tenants)


def pixel_format(config: AV1Config) -> str:
    return "yuv420p10le" if config.bit_depth == 10 else "yuv420p"


def encoder_args(
    *, crf: int, maxrate_kbps: int, gop_frames: int, media: MediaConfig, hdr10_params: str = ""
) -> list[str]:
    """``libsvtav1`` for one rung: CRF (capped at ``maxrate_kbps`` when set), the preset,
    a closed GOP of ``gop_frames`` (one segment: see the module's note on keyframes).
    ``hdr10_params`` (``hdr10_params``): the HDR10 rendition's, always 10-bit."""
    config = media.av1
    args = ["-c:v", "libsvtav1", "-preset", str(config.preset), "-crf", str(crf)]
    if maxrate_kbps:
        args += ["-maxrate", f"{maxrate_kbps}k"]
    pix_fmt = "yuv420p10le" if hdr10_params else pixel_format(config)
    args += ["-g", str(gop_frames), "-pix_fmt", pix_fmt]
    if hdr10_params:
        args += ["-svtav1-params", hdr10_params]
    return args


def chunk_gop_frames(frames: int, gop_frames: int) -> int:
    """The GOP (``-g``) of a chunk's AV1 pieces, the chunk making ``frames`` output frames:
    its frames in the fewest GOPs of at most ``gop_frames`` (one segment), as equal as a
    fixed GOP allows (the last shorter by less than one frame per GOP). A chunk that spans
    whole segments keeps ``gop_frames``; one that does not never ends in a GOP of a frame
    or two, which would be a segment of its own."""
    gop = max(gop_frames, 1)
    groups = max(1, math.ceil(frames / gop))
    return max(1, math.ceil(frames / groups))


def chunked_keyframes(chunking: Chunking, rate: float, gop_frames: int) -> list[float]:
    """Where the AV1 renditions of a chunked plan have their keyframes, in output seconds
    (the joined rendition's own timeline, before the HLS offset): every chunk's GOP from
    its first frame. Cut at every keyframe, these are their segments' starts."""
    times: list[float] = []
    for index, start in enumerate(chunking.grid_starts):
        frames = chunking.output_frames(index, rate)
        gop = chunk_gop_frames(frames, gop_frames)
        times += [start + k * gop / rate for k in range(math.ceil(frames / gop))]
    return times


def _ratio(text: str) -> float:
    """ffprobe's ``"13250/50000"`` (or a plain number) as a float; 0 when unreadable."""
    number, _, denominator = text.partition("/")
    try:
        value = float(number) / (float(denominator) if denominator else 1.0)
    except (ValueError, ZeroDivisionError):
        return 0.0
    return value


def hdr10_params(hdr: HdrMetadata | None) -> str:
    """SVT-AV1's parameters for an HDR10 rendition: HDR signalling on, and the source's
    mastering display (SMPTE ST 2086: chromaticities, then peak and minimum luminance in
    nits) and content light levels when the probe found them, written into the bitstream
    as metadata OBUs."""
    params = ["enable-hdr=1"]
    mastering = hdr.mastering_display if hdr is not None else None
    if mastering is not None:

        def xy(point: tuple[str, str]) -> str:
            return f"({_ratio(point[0]):.4f},{_ratio(point[1]):.4f})"

        luminance = (
            f"L({_ratio(mastering.max_luminance):.4f},{_ratio(mastering.min_luminance):.4f})"
        )
        params.append(
            f"mastering-display=G{xy(mastering.green)}B{xy(mastering.blue)}"
            f"R{xy(mastering.red)}WP{xy(mastering.white_point)}{luminance}"
        )
    light = hdr.content_light if hdr is not None else None
    if light is not None:
        params.append(f"content-light={light.max_content_nits},{light.max_average_nits}")
    return ":".join(params)


def deadline_extra_seconds(media: MediaConfig, duration_seconds: float | None) -> float:
    """The wall time an ffmpeg run encoding the AV1 ladder gets beyond the H.264 budget."""
    return media.av1.process_timeout_per_media_second * max(duration_seconds or 0.0, 0.0)


def cpu_extra_seconds(media: MediaConfig, duration_seconds: float | None) -> int:
    """The CPU seconds such a run gets beyond ``[media] cpu_seconds`` (its rlimit)."""
    return round(media.av1.cpu_seconds_per_media_second * max(duration_seconds or 0.0, 0.0))


# -- the CODECS string -------------------------------------------------------------------------

# The colour an ``av01`` string's short form implies (AV1-ISOBMFF, "Codecs Parameter
# String"): BT.709 primaries, transfer and matrix, limited range.
_DEFAULT_COLOUR = (1, 1, 1, 0)


def _box_payload(data: bytes, kind: bytes) -> bytes | None:
    """The payload of the first ``kind`` box found in ``data`` (searched by its type)."""
    at = data.find(kind)
    if at < 4:
        return None
    size = int.from_bytes(data[at - 4 : at], "big")
    if size < 8 or at - 4 + size > len(data):
        return None
    return data[at + 4 : at - 4 + size]


def codec_string(init_segment: Path) -> str:
    """``av01.P.LLT.DD`` from the ``av1C`` box of an fMP4 init segment; with the optional
    fields (monochrome, chroma subsampling, colour, range) when its ``colr`` box says the
    colour is not the short form's BT.709 limited range."""
    data = init_segment.read_bytes()
    config = _box_payload(data, b"av1C")
    if config is None or len(config) < 4 or config[0] != 0x81:
        raise InvalidMediaError(f"no av1C box in {init_segment.name}", reasons=["hls_no_av1c"])
    profile = config[1] >> 5
    level = config[1] & 0x1F
    flags = config[2]
    tier = "H" if flags & 0x80 else "M"
    high_bitdepth = bool(flags & 0x40)
    twelve_bit = bool(flags & 0x20)
    depth = (12 if twelve_bit else 10) if profile == 2 and high_bitdepth else 8
    if profile != 2 and high_bitdepth:
        depth = 10
    text = f"av01.{profile}.{level:02d}{tier}.{depth:02d}"
    colour = _nclx(data)
    if colour is None or colour == _DEFAULT_COLOUR:
        return text
    monochrome = 1 if flags & 0x10 else 0
    chroma = f"{(flags >> 3) & 1}{(flags >> 2) & 1}{flags & 0x03}"
    primaries, transfer, matrix, full = colour
    return f"{text}.{monochrome}.{chroma}.{primaries:02d}.{transfer:02d}.{matrix:02d}.{full}"


def _nclx(data: bytes) -> tuple[int, int, int, int] | None:
    """(primaries, transfer, matrix, full range) of the ``colr`` box's ``nclx``, if any."""
    colr = _box_payload(data, b"colr")
    if colr is None or len(colr) < 11 or colr[:4] != b"nclx":
        return None
    return (
        int.from_bytes(colr[4:6], "big"),
        int.from_bytes(colr[6:8], "big"),
        int.from_bytes(colr[8:10], "big"),
        colr[10] >> 7,
    )
