"""The colour rules as pure functions: assumed tags, what may be copied, the filter chain
and the tags each output is given, and what the probe's side data records."""

from __future__ import annotations

import pytest

from aivedio.config.media import ColourConfig, MediaConfig, validate_colour
from aivedio.errors import ConfigError
from aivedio.pipeline.ffmpeg.probe import SideData
from aivedio.pipeline.media import colour
from aivedio.pipeline.media import plan as plan_mod
from aivedio.pipeline.media.colour import BT709, Colour
from aivedio.pipeline.media.ffmpeg_args import encoded_colour
from tests.unit.pipeline.media.test_validate import summary

UNTAGGED = Colour(primaries="", transfer="", matrix="", range="")
PQ = Colour(primaries="bt2020", transfer="smpte2084", matrix="bt2020nc", range="tv")
HLG = Colour(primaries="bt2020", transfer="arib-std-b67", matrix="bt2020nc", range="tv")


def tagged(c: Colour, **kw: object) -> dict[str, object]:
    return dict(
        color_primaries=c.primaries,
        color_transfer=c.transfer,
        color_space=c.matrix,
        color_range=c.range,
        **kw,
    )


def test_missing_tags_are_assumed_bt709_limited() -> None:
    assert colour.filled(UNTAGGED) == BT709
    half = Colour(primaries="", transfer="", matrix="smpte170m", range="pc")
    assert colour.filled(half) == Colour(
        primaries="bt709", transfer="bt709", matrix="smpte170m", range="pc"
    )


@pytest.mark.parametrize(("c", "kind"), [(PQ, "pq"), (HLG, "hlg"), (BT709, "sdr")])
def test_dynamic_range_by_transfer(c: Colour, kind: str) -> None:
    assert colour.dynamic_range(c) == kind


def test_hdr_is_never_copied_and_wide_gamut_sdr_is_converted() -> None:
    assert colour.remux_reasons(PQ) == ["hdr:pq"]
    assert colour.remux_reasons(HLG) == ["hdr:hlg"]
    wide = Colour(primaries="bt2020", transfer="bt2020-10", matrix="bt2020nc", range="tv")
    assert colour.remux_reasons(wide) == ["colour:bt2020/bt2020-10/bt2020nc"]
    assert colour.conversion(wide) == "convert"
    for sdr in (
        UNTAGGED,
        BT709,
        Colour(primaries="smpte170m", transfer="smpte170m", matrix="smpte170m", range="tv"),
    ):
        assert colour.remux_reasons(sdr) == [] and colour.conversion(sdr) == "none"


def test_tone_map_chain_names_its_input_and_uses_the_configured_curve() -> None:
    config = ColourConfig(tonemap="mobius", nominal_peak_nits=203, tonemap_peak=10)
    chain = colour.colour_filter(PQ, config)
    assert chain.startswith(
        "zscale=tin=smpte2084:min=bt2020nc:pin=bt2020:rin=limited:t=linear:npl=203,"
    )
    assert "format=gbrpf32le,zscale=p=bt709,tonemap=tonemap=mobius:desat=0:peak=10," in chain
    assert chain.endswith("zscale=t=bt709:m=bt709:r=limited,format=yuv420p")
    assert "tin=arib-std-b67" in colour.colour_filter(HLG, ColourConfig())
    assert ":peak=" not in colour.colour_filter(PQ, ColourConfig())  # 0: from the source
    assert colour.colour_filter(BT709, ColourConfig()) == ""


def test_outputs_are_tagged_with_the_colour_they_have() -> None:
    assert colour.output_colour(PQ, copied=False) == BT709
    full = Colour(primaries="bt709", transfer="bt709", matrix="bt709", range="pc")
    assert colour.output_colour(full, copied=True) == full  # a copy is what it is
    assert colour.output_colour(full, copied=False).range == "tv"  # the rungs' scale
    assert colour.colour_args(BT709) == [
        *("-color_primaries", "bt709", "-color_trc", "bt709"),
        *("-colorspace", "bt709", "-color_range", "tv"),
    ]


def test_the_plan_transcodes_hdr_with_the_tone_map_and_tags_every_rendition() -> None:
    s = summary(**tagged(PQ, video_codec="hevc", video_profile="Main 10", pix_fmt="yuv420p10le"))
    p = plan_mod.make_plan(s, MediaConfig())
    assert p.mode == "transcode" and "hdr:pq" in p.transcode_reasons
    assert p.dynamic_range == "pq" and p.colour == BT709
    assert p.colour_filter.startswith("zscale=tin=smpte2084")
    untagged = plan_mod.make_plan(summary(), MediaConfig(), source_keyframes=[0.0])
    assert untagged.mode == "remux" and untagged.colour == BT709
    assert untagged.colour_filter == ""
    yuvj = plan_mod.make_plan(summary(pix_fmt="yuvj420p", color_range="pc"), MediaConfig())
    assert yuvj.colour is not None and yuvj.colour.range == "pc"  # the copied top rung's
    enc = encoded_colour(yuvj)
    assert enc is not None and enc.range == "tv"  # the encoded rungs'


def test_bit_depth_from_the_stream_else_the_pixel_format() -> None:
    assert colour.bit_depth("yuv420p10le", None) == 10
    assert colour.bit_depth("yuv420p", None) == 8
    assert colour.bit_depth("yuv420p", 12) == 12
    assert colour.bit_depth("", None) is None


def test_hdr_side_data_is_recorded() -> None:
    side = [
        SideData(
            side_data_type="Mastering display metadata",
            red_x="34000/50000",
            red_y="16000/50000",
            max_luminance="10000000/10000",
            min_luminance="1/10000",
        ),
        SideData(side_data_type="Content light level metadata", max_content=1000, max_average=400),
        SideData(
            side_data_type="DOVI configuration record",
            dv_profile=8,
            dv_level=6,
            dv_bl_signal_compatibility_id=1,
        ),
    ]
    hdr = colour.hdr_metadata(side)
    assert hdr is not None and hdr.mastering_display is not None
    assert hdr.mastering_display.red == ("34000/50000", "16000/50000")
    assert hdr.content_light == colour.ContentLight(max_content_nits=1000, max_average_nits=400)
    assert hdr.dolby_vision == colour.DolbyVision(profile=8, level=6, compatibility_id=1)
    assert colour.hdr_metadata([SideData(side_data_type="Display Matrix", rotation=90)]) is None
    only_light = colour.hdr_metadata(side[1:2])
    assert colour.merged(only_light, hdr) == hdr


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"tonemap": "none"}, "media.colour.tonemap"),
        ({"nominal_peak_nits": 1.0}, "media.colour.nominal_peak_nits"),
        ({"tonemap_peak": 0.5}, "media.colour.tonemap_peak"),
        ({"desaturation": -1.0}, "media.colour.desaturation"),
    ],
)
def test_colour_config_errors_name_their_key(change: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        validate_colour(ColourConfig(**change))  # type: ignore[arg-type]
