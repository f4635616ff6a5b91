"""Colour: what a source's picture is, what each output's is, and the filter between them.

Why. The H.264 ladder is SDR BT.709, what every browser and phone plays. A PQ (HDR10,
Dolby Vision 8.1) or HLG source encoded as 8-bit H.264 and still tagged BT.2020 PQ/HLG
plays washed out or wrong: its code values mean other light than the player shows. And an
output tagged ``unknown`` leaves each player to guess (most guess BT.601 for small sizes).

The rules, pure functions of the probed tags:

* a missing tag is assumed: BT.709 primaries, transfer and matrix, limited ("tv") range
  (what H.264 and web video mean when they say nothing), and the assumption is recorded;
* PQ (``smpte2084``) and HLG (``arib-std-b67``) are tone-mapped to SDR BT.709 before the
  split of the one decode (``zscale`` to linear light, ``tonemap``, ``zscale`` back to
  BT.709; operator and peak from ``[media.colour]``); a wide-gamut SDR source (BT.2020
  primaries) is converted to BT.709 by ``zscale``; any other SDR picture keeps its own
  primaries and matrix, which players honour;
* a transcoded output is limited range, 8-bit 4:2:0 (the rungs' ``scale`` converts range
  and depth); every output is tagged with the colour it has (``colour_args``), a copied
  rung too (container tags only: its bitstream stays the source's);
* only a source whose tags are SDR ones a player shows right is remuxed
  (``remux_reasons``): an HDR source never reaches the SDR playback rendition by copy.
"""

from __future__ import annotations

import msgspec

from aivedio.config.media import ColourConfig
from aivedio.pipeline.ffmpeg.probe import SideData

# What ffprobe prints for a tag the stream does not set.
UNSET = frozenset({"", "unknown", "unspecified", "reserved"})
HDR_TRANSFERS = {"smpte2084": "pq", "arib-std-b67": "hlg"}
# SDR tags a player shows right as they are (copied, or kept by a transcode).
PLAYABLE_PRIMARIES = frozenset({"bt709", "smpte170m", "bt470bg", "bt470m"})
PLAYABLE_TRANSFERS = frozenset(
    {"bt709", "smpte170m", "bt470bg", "bt470m", "iec61966-2-1", "gamma22", "gamma28"}
)
PLAYABLE_MATRICES = frozenset({"bt709", "smpte170m", "bt470bg"})
PLAYABLE_RANGES = frozenset({"tv", "pc"})
# The names zscale knows as ffprobe prints them; another is left to the frame's own tag.
ZSCALE_PRIMARIES = frozenset({"bt709", "bt470m", "bt470bg", "smpte170m", "smpte240m", "bt2020"})
ZSCALE_MATRICES = frozenset({"bt709", "bt470bg", "smpte170m", "bt2020nc", "bt2020c"})
ZSCALE_TRANSFERS = frozenset({"bt709", "smpte2084", "arib-std-b67", "bt2020-10", "bt2020-12"})


class Colour(msgspec.Struct, frozen=True, kw_only=True):
    """A picture's colour as ffmpeg names it: ``color_primaries``, ``color_trc``,
    ``colorspace`` (the matrix) and ``color_range``; "" where a probe found no tag."""

    primaries: str
    transfer: str
    matrix: str
    range: str


BT709 = Colour(primaries="bt709", transfer="bt709", matrix="bt709", range="tv")


class MasteringDisplay(msgspec.Struct, frozen=True, kw_only=True):
    """SMPTE ST 2086: the display the source was graded on (ffprobe's fractions)."""

    red: tuple[str, str]
    green: tuple[str, str]
    blue: tuple[str, str]
    white_point: tuple[str, str]
    min_luminance: str
    max_luminance: str


class ContentLight(msgspec.Struct, frozen=True, kw_only=True):
    max_content_nits: int
    max_average_nits: int


class DolbyVision(msgspec.Struct, frozen=True, kw_only=True):
    profile: int
    level: int
    # The base layer's compatibility (1: HDR10, 2: SDR, 4: HLG, 0: none, profile 5).
    compatibility_id: int


class HdrMetadata(msgspec.Struct, frozen=True, kw_only=True):
    mastering_display: MasteringDisplay | None = None
    content_light: ContentLight | None = None
    dolby_vision: DolbyVision | None = None


def _set(value: str) -> bool:
    return value not in UNSET


def filled(colour: Colour) -> Colour:
    """``colour`` with every missing tag assumed: BT.709, limited range."""
    return Colour(
        primaries=colour.primaries if _set(colour.primaries) else BT709.primaries,
        transfer=colour.transfer if _set(colour.transfer) else BT709.transfer,
        matrix=colour.matrix if _set(colour.matrix) else BT709.matrix,
        range=colour.range if _set(colour.range) else BT709.range,
    )


def dynamic_range(colour: Colour) -> str:
    """``pq``, ``hlg`` or ``sdr`` (by the transfer)."""
    return HDR_TRANSFERS.get(colour.transfer, "sdr")


def conversion(colour: Colour) -> str:
    """What a transcode does to the picture's colour: ``tonemap`` (PQ, HLG), ``convert``
    (SDR whose primaries, transfer or matrix a player would not show right: BT.2020) or
    ``none``."""
    c = filled(colour)
    if dynamic_range(c) != "sdr":
        return "tonemap"
    if (
        c.primaries not in PLAYABLE_PRIMARIES
        or c.transfer not in PLAYABLE_TRANSFERS
        or c.matrix not in PLAYABLE_MATRICES
    ):
        return "convert"
    return "none"


def remux_reasons(colour: Colour) -> list[str]:
    """Why the source's colour forbids a copy into the playback rendition; empty: none."""
    c = filled(colour)
    kind = conversion(c)
    if kind == "tonemap":
        return [f"hdr:{dynamic_range(c)}"]
    if kind == "convert":
        return [f"colour:{c.primaries}/{c.transfer}/{c.matrix}"]
    if c.range not in PLAYABLE_RANGES:
        return [f"colour_range:{c.range}"]
    return []


def output_colour(colour: Colour, *, copied: bool) -> Colour:
    """The colour an output has: a copy keeps the source's (tags assumed where missing); a
    transcode is BT.709 after a tone map or a conversion, else the source's primaries,
    transfer and matrix, always limited range."""
    c = filled(colour)
    if copied:
        return c
    if conversion(c) != "none":
        return BT709
    return msgspec.structs.replace(c, range="tv")


def _input_params(colour: Colour) -> list[str]:
    """zscale's input tags, named explicitly: a frame's own tags may be missing where the
    container's (what the probe read) are not."""
    params = []
    if colour.transfer in ZSCALE_TRANSFERS:
        params.append(f"tin={colour.transfer}")
    if colour.matrix in ZSCALE_MATRICES:
        params.append(f"min={colour.matrix}")
    if colour.primaries in ZSCALE_PRIMARIES:
        params.append(f"pin={colour.primaries}")
    params.append(f"rin={'full' if colour.range == 'pc' else 'limited'}")
    return params


def colour_filter(colour: Colour, config: ColourConfig) -> str:
    """The chain that takes the decoded source to the transcode's colour (before the split:
    once per decode, whatever the number of rungs); "" when there is nothing to change."""
    c = filled(colour)
    kind = conversion(c)
    if kind == "none":
        return ""
    source = ":".join(_input_params(c))
    if kind == "convert":
        return f"zscale={source}:p=bt709:t=bt709:m=bt709:r=limited,format=yuv420p"
    # Linear light scaled so that nominal_peak_nits is 1.0, in float RGB (the tone curve
    # works on linear RGB), primaries to BT.709, the curve, then BT.709 gamma and matrix.
    tonemap = f"tonemap=tonemap={config.tonemap}:desat={config.desaturation:g}"
    if config.tonemap_peak > 0:
        tonemap += f":peak={config.tonemap_peak:g}"
    return ",".join(
        [
            f"zscale={source}:t=linear:npl={config.nominal_peak_nits:g}",
            "format=gbrpf32le",
            "zscale=p=bt709",
            tonemap,
            "zscale=t=bt709:m=bt709:r=limited",
            "format=yuv420p",
        ]
    )


def colour_args(colour: Colour) -> list[str]:
    """An output's colour tags (on a copy: the container's; on an encode: the bitstream's
    VUI as well)."""
    return [
        *("-color_primaries", colour.primaries),
        *("-color_trc", colour.transfer),
        *("-colorspace", colour.matrix),
        *("-color_range", colour.range),
    ]


def bit_depth(pix_fmt: str, bits_per_raw_sample: int | None) -> int | None:
    """The source's bits per component: the stream's own figure, else its pixel format's
    (``yuv420p10le`` is 10, ``yuv420p`` 8); None when neither says."""
    if bits_per_raw_sample:
        return bits_per_raw_sample
    if not pix_fmt:
        return None
    for bits in (16, 14, 12, 10, 9):
        if f"p{bits}" in pix_fmt:
            return bits
    return 8


def hdr_metadata(side_data: list[SideData]) -> HdrMetadata | None:
    """The HDR side data among a stream's (or a frame's); None when there is none."""
    mastering = light = dolby = None
    for side in side_data:
        kind = side.side_data_type
        if kind == "Mastering display metadata" and side.max_luminance:
            mastering = MasteringDisplay(
                red=(side.red_x, side.red_y),
                green=(side.green_x, side.green_y),
                blue=(side.blue_x, side.blue_y),
                white_point=(side.white_point_x, side.white_point_y),
                min_luminance=side.min_luminance,
                max_luminance=side.max_luminance,
            )
        elif kind == "Content light level metadata" and side.max_content is not None:
            light = ContentLight(
                max_content_nits=side.max_content, max_average_nits=side.max_average or 0
            )
        elif kind == "DOVI configuration record" and side.dv_profile is not None:
            dolby = DolbyVision(
                profile=side.dv_profile,
                level=side.dv_level or 0,
                compatibility_id=side.dv_bl_signal_compatibility_id or 0,
            )
    if mastering is None and light is None and dolby is None:
        return None
    return HdrMetadata(mastering_display=mastering, content_light=light, dolby_vision=dolby)


def merged(first: HdrMetadata | None, second: HdrMetadata | None) -> HdrMetadata | None:
    """``first`` with what it lacks taken from ``second`` (the stream's, then the first
    frame's)."""
    if first is None or second is None:
        return first or second
    return HdrMetadata(
        mastering_display=first.mastering_display or second.mastering_display,
        content_light=first.content_light or second.content_light,
        dolby_vision=first.dolby_vision or second.dolby_vision,
    )
