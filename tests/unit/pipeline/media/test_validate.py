"""Pure media rules: magic-byte sniffing, ffprobe output validation, rates and rotation, plan.

Everything here works on bytes and hand-built ``ProbeOutput``/``MediaSummary`` structs; no
process is started (the same rules against real files are in
``tests/integration/pipeline/ffmpeg/test_verdict.py``).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aivedio.config.media import MediaConfig, RungConfig, ToleranceConfig
from aivedio.pipeline.ffmpeg.probe import (
    Disposition,
    Format,
    ProbeOutput,
    SideData,
    Stream,
    parse_rate,
    rotation_of,
)
from aivedio.pipeline.media import plan as plan_mod
from aivedio.pipeline.media.keyframes import segment_boundaries
from aivedio.pipeline.media.sniff import MATROSKA, MP4, sniff_bytes, sniff_file
from aivedio.pipeline.media.sniff import input_args as sniff_input_args
from aivedio.pipeline.media.validate import Declared, MediaSummary, summarize, validate

MEDIA = MediaConfig()

# -- sniff --------------------------------------------------------------------------------------


def _box(kind: bytes, payload: bytes = b"isom\0\0\0\0") -> bytes:
    return (8 + len(payload)).to_bytes(4, "big") + kind + payload


@pytest.mark.parametrize("box", [b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"])
def test_every_bmff_top_box_sniffs_as_mp4(box: bytes) -> None:
    assert sniff_bytes(_box(box)) is MP4


def test_uuid_box_sniffs_as_mp4() -> None:
    assert sniff_bytes(_box(b"uuid", b"\0" * 16)) is MP4


def test_mp4_and_matroska_force_their_own_demuxer_and_whitelist() -> None:
    assert (MP4.kind, MP4.demuxer, MP4.reason, MP4.accepted) == ("mp4", "mov", None, True)
    assert MP4.format_whitelist is not None and "hls" not in MP4.format_whitelist
    webm = sniff_bytes(b"\x1a\x45\xdf\xa3" + b"\x00" * 40)
    assert webm is MATROSKA
    assert (webm.demuxer, webm.format_whitelist) == ("matroska", "matroska,webm")


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"\x1f\x8b\x08\x00" + b"\0" * 20, "gzip"),
        (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "png"),
        (b"\xff\xd8\xff\xe0\0\x10JFIF", "jpeg"),
        (b"GIF89a\x01\x00", "gif"),
        (b"GIF87a\x01\x00", "gif"),
        (b"PK\x03\x04\x14\x00", "zip"),
        (b"%PDF-1.7\n", "pdf"),
        (b"#EXTM3U\n#EXT-X-VERSION:3\n", "hls_playlist"),
        (b"ffconcat version 1.0\nfile 'a.mp4'\n", "concat_script"),
        (b"RIFF\x24\0\0\0WAVEfmt ", "riff"),
        (b"OggS\0\x02", "ogg"),
        (b"ID3\x04\0\0\0\0\0\0", "mp3"),
        (b"fLaC\0\0\0\x22", "flac"),
        (b"BZh91AY&SY", "bzip2"),
        (b"\xfd7zXZ\x00\x00\x04", "xz"),
        (b"(\xb5/\xfd\x24\x00", "zstd"),
    ],
)
def test_each_refused_magic_is_named(head: bytes, kind: str) -> None:
    sniff = sniff_bytes(head)
    assert sniff.kind == kind
    assert sniff.reason == f"unsupported_container:{kind}"
    assert not sniff.accepted
    assert (sniff.demuxer, sniff.format_whitelist) == (None, None)


@pytest.mark.parametrize(
    "head",
    [
        b"<!DOCTYPE html>\n<html>",
        b"<html><body>403</body></html>",
        b"\xef\xbb\xbf  \r\n<!doctype HTML>",
        b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>",
        b"\n\n<HEAD><title>x</title>",
        b"<body>gone</body>",
    ],
)
def test_html_and_xml_error_pages_are_named_html(head: bytes) -> None:
    sniff = sniff_bytes(head)
    assert (sniff.kind, sniff.reason) == ("html", "unsupported_container:html")


@pytest.mark.parametrize("head", [b'{"error": "expired"}', b"  [1, 2]", b"\xef\xbb\xbf{}"])
def test_json_bodies_are_named_json(head: bytes) -> None:
    assert sniff_bytes(head).reason == "unsupported_container:json"


def test_mpegts_needs_two_sync_bytes_188_apart() -> None:
    packet = b"\x47" + b"\xff" * 187
    assert sniff_bytes(packet * 2).reason == "unsupported_container:mpegts"
    assert sniff_bytes(packet).reason == "unrecognized_container"  # one sync byte proves nothing


@pytest.mark.parametrize(
    "head",
    [
        b"\xef\xbb\xbf#EXTM3U\n#EXTINF:10,\nseg.ts\n",  # a BOM hides the hls magic
        b"# my list\nfile 'a.mp4'\nfile 'b.mp4'\n",  # a concat script without the header
    ],
)
def test_other_text_playlists_are_refused(head: bytes) -> None:
    sniff = sniff_bytes(head)
    assert (sniff.kind, sniff.reason) == ("text_playlist", "unsupported_container:playlist")


def test_empty_and_unknown() -> None:
    assert (sniff_bytes(b"").kind, sniff_bytes(b"").reason) == ("empty", "empty_file")
    for head in (b"\0", b"hello world", bytes(range(256)) * 4):
        sniff = sniff_bytes(head)
        assert (sniff.kind, sniff.reason) == ("unknown", "unrecognized_container")


def test_sniff_file_reads_only_the_head(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(_box(b"ftyp") + b"#EXTM3U" * 10_000)
    assert sniff_file(path) is MP4


def test_input_args_force_demuxer_protocol_and_file_scheme(tmp_path: Path) -> None:
    path = tmp_path / "http:x.mp4"
    args = sniff_input_args(MP4, path)
    assert args == [
        *("-protocol_whitelist", "file", "-format_whitelist", "mov,mp4,m4a,3gp,3g2,mj2"),
        *("-f", "mov", "-i", f"file:{path.resolve()}"),
    ]


def test_input_args_refuse_a_refused_sniff(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported_container:hls_playlist"):
        sniff_input_args(sniff_bytes(b"#EXTM3U\n"), tmp_path / "x.mp4")


# -- parse_rate and rotation_of ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("30000/1001", Fraction(30000, 1001)),
        ("24/1", Fraction(24)),
        ("25", Fraction(25)),
        ("1/2", Fraction(1, 2)),
        ("0/0", None),
        ("0/1", None),
        ("1/0", None),
        ("-24/1", None),
        ("", None),
        ("abc", None),
        ("1.5/2", None),
        ("N/A", None),
    ],
)
def test_parse_rate(text: str, want: Fraction | None) -> None:
    assert parse_rate(text) == want


def _with_rotation(side: list[float | None], tags: dict[str, str] | None = None) -> Stream:
    return Stream(
        index=0,
        codec_type="video",
        side_data_list=[SideData(side_data_type="Display Matrix", rotation=r) for r in side],
        tags=tags or {},
    )


@pytest.mark.parametrize(
    ("side", "tags", "want"),
    [
        ([], None, 0),
        ([90.0], None, 270),  # side data is counter-clockwise; the answer is clockwise
        ([-90.0], None, 90),
        ([180.0], None, 180),
        ([-180.0], None, 180),
        ([270.0], None, 90),
        ([360.0], None, 0),
        ([-89.6], None, 90),  # rounded to the nearest right angle
        ([None], None, 0),
        ([], {"rotate": "90"}, 90),  # the old tag is clockwise already
        ([], {"rotate": "-90"}, 270),
        ([], {"rotate": "450"}, 90),
        ([], {"rotate": "sideways"}, 0),
        ([-90.0], {"rotate": "180"}, 90),  # side data wins over the tag
        ([None, -90.0], None, 90),
    ],
)
def test_rotation_of(side: list[float | None], tags: dict[str, str] | None, want: int) -> None:
    assert rotation_of(_with_rotation(side, tags)) == want


@pytest.mark.parametrize("value", ["nan", "inf", "-1e999"])
def test_rotation_of_a_non_finite_rotate_tag_is_zero(value: str) -> None:
    assert rotation_of(_with_rotation([], {"rotate": value})) == 0


# -- validate ------------------------------------------------------------------------------


def video(**kw: Any) -> Stream:
    base: dict[str, Any] = {
        "index": 0,
        "codec_type": "video",
        "codec_name": "h264",
        "profile": "High",
        "level": 40,
        "pix_fmt": "yuv420p",
        "width": 1920,
        "height": 1080,
        "sample_aspect_ratio": "1:1",
        "r_frame_rate": "30/1",
        "avg_frame_rate": "30/1",
        "time_base": "1/15360",
        "start_time": 0.0,
        "duration": 10.0,
        "field_order": "progressive",
    }
    base.update(kw)
    return Stream(**base)


def audio(**kw: Any) -> Stream:
    base: dict[str, Any] = {
        "index": 1,
        "codec_type": "audio",
        "codec_name": "aac",
        "profile": "LC",
        "sample_rate": 48000,
        "channels": 2,
        "channel_layout": "stereo",
        "start_time": 0.0,
        "duration": 10.0,
    }
    base.update(kw)
    return Stream(**base)


def probe(*streams: Stream, **fmt: Any) -> ProbeOutput:
    base: dict[str, Any] = {
        "format_name": "mov,mp4,m4a,3gp,3g2,mj2",
        "nb_streams": len(streams),
        "start_time": 0.0,
        "duration": 10.0,
    }
    base.update(fmt)
    return ProbeOutput(streams=list(streams), format=Format(**base))


def reasons_of(
    p: ProbeOutput,
    media: MediaConfig = MEDIA,
    declared: Declared | None = None,
    tolerance: ToleranceConfig | None = None,
) -> list[str]:
    return validate(p, media, declared=declared, tolerance=tolerance)[1]


def test_a_plain_h264_aac_file_is_valid() -> None:
    summary, reasons = validate(probe(video(), audio()), MEDIA)
    assert reasons == []
    assert summary is not None
    assert (summary.width, summary.height, summary.display_width, summary.display_height) == (
        1920,
        1080,
        1920,
        1080,
    )
    assert (summary.audio_codec, summary.audio_profile, summary.audio_stream_index) == (
        "aac",
        "LC",
        1,
    )
    assert (summary.frame_rate, summary.variable_frame_rate, summary.rotation) == (30.0, False, 0)


def test_no_streams_and_audio_only() -> None:
    assert validate(probe(), MEDIA) == (None, ["no_video_stream"])
    assert validate(probe(audio(index=0)), MEDIA) == (None, ["audio_only"])
    # A cover picture is a video stream in ffprobe's eyes, but not a video.
    cover = video(index=1, codec_name="mjpeg", disposition=Disposition(attached_pic=1))
    assert validate(probe(audio(index=0), cover), MEDIA) == (None, ["audio_only"])
    assert validate(probe(Stream(index=0, codec_type="subtitle")), MEDIA) == (
        None,
        ["no_video_stream"],
    )


@pytest.mark.parametrize(
    ("streams", "fmt", "media", "want"),
    [
        ([video(codec_name="theora")], {}, MEDIA, "video_codec_unsupported:theora"),
        ([video(codec_name="")], {}, MEDIA, "video_codec_unsupported:unknown"),
        ([video(width=0, height=0, pix_fmt="")], {}, MEDIA, "zero_dimensions"),
        ([video(width=4112, height=2160)], {}, MEDIA, "dimensions_too_large:4112x2160"),
        ([video(width=320, height=240)], {}, MediaConfig(max_pixels=1000), "too_many_pixels"),
        ([video(pix_fmt="")], {}, MEDIA, "pixel_format_unknown"),
        ([video(sample_aspect_ratio="5:1")], {}, MEDIA, "sample_aspect_ratio_invalid:5:1"),
        ([video(sample_aspect_ratio="1:5")], {}, MEDIA, "sample_aspect_ratio_invalid:1:5"),
        ([video(sample_aspect_ratio="x:y")], {}, MEDIA, "sample_aspect_ratio_invalid:x:y"),
        (
            [video(side_data_list=[SideData(side_data_type="Display Matrix", rotation=45.0)])],
            {},
            MEDIA,
            "rotation_not_right_angle",
        ),
        ([video(duration=None)], {"duration": None}, MEDIA, "duration_missing"),
        ([video()], {"duration": 0.0}, MEDIA, "duration_missing"),
        ([video()], {"duration": 0.05}, MEDIA, "duration_too_short"),
        ([video()], {"duration": 3601.0}, MEDIA, "duration_too_long"),
        ([video(start_time=11.0)], {}, MEDIA, "start_time_out_of_range"),
        ([video(start_time=-1.5)], {}, MEDIA, "start_time_out_of_range"),
        ([video(r_frame_rate="0/0", avg_frame_rate="0/0")], {}, MEDIA, "frame_rate_missing"),
        ([video(r_frame_rate="240/1", avg_frame_rate="240/1")], {}, MEDIA, "frame_rate_too_high"),
        ([video(width=1, height=1)], {}, MEDIA, "dimensions_too_small:1x1"),
        ([video(width=4000, height=2)], {}, MEDIA, "dimensions_too_small:4000x2"),
        ([video(width=2, height=4000)], {}, MEDIA, "dimensions_too_small:2x4000"),
        ([video(width=15, height=1080)], {}, MEDIA, "dimensions_too_small:15x1080"),
        # Coded 16x16, shown 4x16: the pixels are four times as tall as wide.
        (
            [video(width=16, height=16, sample_aspect_ratio="1:4")],
            {},
            MEDIA,
            "dimensions_too_small:4x16",
        ),
        # One frame under a long audio track: the file lasts 10 s, its picture 1/30 s.
        ([video(duration=1 / 30), audio()], {}, MEDIA, "video_duration_too_short"),
        (
            [video(), Stream(index=1, codec_type="attachment", codec_name="ttf")],
            {},
            MEDIA,
            "attachments_present",
        ),
        ([video(), audio(codec_name="alac")], {}, MEDIA, "audio_codec_unsupported:alac"),
        ([video(), audio(sample_rate=4000)], {}, MEDIA, "audio_sample_rate_invalid"),
        ([video(), audio(sample_rate=None)], {}, MEDIA, "audio_sample_rate_invalid"),
        ([video(), audio(sample_rate=384000)], {}, MEDIA, "audio_sample_rate_invalid"),
        ([video(), audio(channels=0)], {}, MEDIA, "audio_channels_invalid"),
        ([video(), audio(channels=9)], {}, MEDIA, "audio_channels_invalid"),
        ([video(), audio(channels=None)], {}, MEDIA, "audio_channels_invalid"),
    ],
)
def test_each_rule_reports_its_reason(
    streams: list[Stream], fmt: dict[str, Any], media: MediaConfig, want: str
) -> None:
    assert want in reasons_of(probe(*streams, **fmt), media)


def test_every_failing_rule_is_reported_not_just_the_first() -> None:
    bad = probe(
        video(codec_name="theora", pix_fmt="", r_frame_rate="0/0", avg_frame_rate="0/0"),
        audio(codec_name="alac", channels=12),
        Stream(index=2, codec_type="attachment"),
        duration=0.01,
    )
    assert reasons_of(bad) == [
        "video_codec_unsupported:theora",
        "pixel_format_unknown",
        "duration_too_short",
        "frame_rate_missing",
        "attachments_present",
        "audio_codec_unsupported:alac",
        "audio_channels_invalid",
    ]


def test_limits_are_inclusive_and_orientation_agnostic() -> None:
    assert reasons_of(probe(video(width=4096, height=4096))) == []
    assert reasons_of(probe(video(width=4097, height=4096))) == [
        "dimensions_too_large:4097x4096",
        "too_many_pixels",
    ]
    uhd = MediaConfig(max_width=3840, max_height=2160, max_pixels=3840 * 2160)
    assert reasons_of(probe(video(width=3840, height=2160)), uhd) == []
    assert reasons_of(probe(video(width=2160, height=3840)), uhd) == []  # portrait 4K
    assert reasons_of(probe(video(width=2200, height=2200)), uhd) == [
        "dimensions_too_large:2200x2200"
    ]
    assert reasons_of(probe(video(r_frame_rate="120/1", avg_frame_rate="120/1"))) == []
    assert reasons_of(probe(video(), *(audio(index=i) for i in range(1, 5)))) == []
    assert reasons_of(probe(video(width=16, height=16))) == []
    assert reasons_of(probe(video(width=4096, height=16))) == []
    assert reasons_of(probe(video(duration=0.1), audio())) == []
    assert reasons_of(probe(video(duration=None), audio())) == []  # unknown: the file's
    wide = MediaConfig(min_width=32, min_height=16)
    assert reasons_of(probe(video(width=16, height=32)), wide) == []  # portrait
    assert reasons_of(probe(video(width=20, height=20)), wide) == ["dimensions_too_small:20x20"]
    assert reasons_of(probe(video(width=1, height=1)), MediaConfig(min_width=1, min_height=1)) == []
    assert (
        reasons_of(probe(video(duration=0.01), duration=0.01), MediaConfig(min_duration_seconds=0))
        == []
    )
    assert reasons_of(probe(video(start_time=-1.0)), MEDIA) == []
    assert reasons_of(probe(video(start_time=10.0)), MEDIA) == []
    assert reasons_of(probe(video(), duration=0.1)) == []
    assert reasons_of(probe(video(), duration=3600.0)) == []


def test_sar_unknown_forms_are_accepted() -> None:
    for sar in ("", "0:1", "N/A", "1:4", "4:1", "32:27"):
        assert reasons_of(probe(video(sample_aspect_ratio=sar))) == [], sar


def test_pcm_audio_and_duration_from_the_stream() -> None:
    p = probe(video(duration=7.5), audio(codec_name="pcm_s16le", profile=""), duration=None)
    summary, reasons = validate(p, MEDIA)
    assert reasons == []
    assert summary is not None and summary.duration_seconds == 7.5


def test_summary_applies_sar_and_rotation_to_the_display_size() -> None:
    dvd = summarize(probe(video(width=720, height=480, sample_aspect_ratio="32:27")))
    assert dvd is not None
    assert (dvd.display_width, dvd.display_height, dvd.sar) == (853, 480, "32:27")
    side = [SideData(side_data_type="Display Matrix", rotation=-90.0)]
    turned = summarize(probe(video(side_data_list=side)))
    assert turned is not None
    assert (turned.rotation, turned.width, turned.height) == (90, 1920, 1080)
    assert (turned.display_width, turned.display_height) == (1080, 1920)
    assert reasons_of(probe(video(side_data_list=side))) == []


def test_summary_flags_vfr_and_interlace() -> None:
    vfr = summarize(probe(video(r_frame_rate="30/1", avg_frame_rate="2990/100")))
    assert vfr is not None and vfr.variable_frame_rate
    near = summarize(probe(video(r_frame_rate="30000/1001", avg_frame_rate="2997/100")))
    assert near is not None and not near.variable_frame_rate  # within 0.01 fps
    for order, want in (("tt", True), ("bb", True), ("progressive", False), ("unknown", False)):
        s = summarize(probe(video(field_order=order)))
        assert s is not None and s.interlaced is want, order


def test_summary_counts_streams_by_kind() -> None:
    s = summarize(
        probe(
            video(),
            audio(index=1),
            audio(index=2, codec_name="opus"),
            Stream(index=3, codec_type="subtitle"),
            Stream(index=4, codec_type="data"),
            video(index=5, codec_name="png", disposition=Disposition(attached_pic=1)),
        )
    )
    assert s is not None
    assert (s.video_streams, s.audio_streams, s.subtitle_streams, s.data_streams) == (1, 2, 1, 1)
    assert (s.audio_codec, s.audio_stream_index) == ("aac", 1)  # the first audio stream
    assert [(i.index, i.codec_type, i.why) for i in s.ignored_streams] == [
        (2, "audio", "not_chosen"),
        (3, "subtitle", "not_rendered"),
        (4, "data", "not_rendered"),
        (5, "video", "cover_picture"),
    ]


def _tone(index: int, *, default: bool = False) -> Stream:
    return audio(
        index=index,
        disposition=Disposition(default=int(default)),
        tags={"language": f"l{index:02d}"},
    )


def test_twenty_audio_streams_use_the_default_one_and_ignore_the_rest() -> None:
    # The third audio stream (absolute index 3) carries the default disposition.
    tones = [_tone(i, default=i == 3) for i in range(1, 21)]
    s, reasons = validate(probe(video(disposition=Disposition(default=1)), *tones), MEDIA)
    assert reasons == []
    assert s is not None
    assert (s.audio_stream_index, s.audio_streams, s.video_stream_index) == (3, 20, 0)
    assert [(i.index, i.codec_type, i.language, i.why) for i in s.ignored_streams] == [
        (i, "audio", f"l{i:02d}", "not_chosen") for i in range(1, 21) if i != 3
    ]
    # The plan carries the choice; every ffmpeg run maps it
    # (tests/unit/pipeline/media/test_ffmpeg_args.py).
    p = plan_mod.make_plan(s, MEDIA)
    assert (p.audio_stream, p.audio_map, p.video_map) == (3, "0:3", "0:0")
    # The verdict's JSON (what the probe job stores and ``aivedio probe`` prints) lists them.
    listed = msgspec.to_builtins(s)["ignored_streams"]
    assert listed[0] == {
        "index": 1,
        "codec_type": "audio",
        "codec_name": "aac",
        "language": "l01",
        "why": "not_chosen",
    }
    assert len(listed) == 19


def test_without_a_default_disposition_the_first_stream_of_a_kind_is_chosen() -> None:
    s = summarize(probe(video(), *(_tone(i) for i in range(1, 6))))
    assert s is not None and (s.video_stream_index, s.audio_stream_index) == (0, 1)
    # Several defaults: the first of them.
    s = summarize(probe(video(), _tone(1), _tone(2, default=True), _tone(3, default=True)))
    assert s is not None and s.audio_stream_index == 2


def test_several_video_streams_use_the_default_one() -> None:
    small = video(index=0, width=320, height=240)
    large = video(index=1, width=640, height=360, disposition=Disposition(default=1))
    s, reasons = validate(probe(small, large, audio(index=2)), MEDIA)
    assert reasons == []  # no longer refused as multiple_video_streams
    assert s is not None
    assert (s.video_stream_index, s.width, s.height, s.video_streams) == (1, 640, 360, 2)
    assert [(i.index, i.why) for i in s.ignored_streams] == [(0, "not_chosen")]
    # A cover picture is never the video, default disposition or not.
    cover = video(index=0, codec_name="mjpeg", disposition=Disposition(attached_pic=1, default=1))
    s = summarize(probe(cover, video(index=1), audio(index=2)))
    assert s is not None and s.video_stream_index == 1
    assert [(i.index, i.why) for i in s.ignored_streams] == [(0, "cover_picture")]


def test_the_rules_judge_the_chosen_streams_not_the_ignored_ones() -> None:
    odd = [
        video(
            index=1,
            codec_name="theora",
            width=1,
            height=1,
            side_data_list=[SideData(side_data_type="Display Matrix", rotation=45.0)],
        ),
        audio(index=3, codec_name="alac", sample_rate=4000, channels=12),
    ]
    chosen = [video(disposition=Disposition(default=1)), _tone(2, default=True)]
    assert reasons_of(probe(chosen[0], odd[0], chosen[1], odd[1])) == []
    # The same streams chosen (default disposition) are refused.
    picked = [msgspec.structs.replace(st, disposition=Disposition(default=1)) for st in odd]
    assert reasons_of(probe(video(), picked[0], _tone(2), picked[1])) == [
        "video_codec_unsupported:theora",
        "dimensions_too_small:1x1",
        "rotation_not_right_angle",
        "audio_codec_unsupported:alac",
        "audio_sample_rate_invalid",
        "audio_channels_invalid",
    ]


# -- tolerances ------------------------------------------------------------------------------

RUNWAY = ToleranceConfig(duration_seconds=0.5, duration_ratio=0.05, resolution_ratio=0.01)


@pytest.mark.parametrize(
    ("declared", "tolerance", "want"),
    [
        (Declared(duration_seconds=10.4), RUNWAY, []),
        (Declared(duration_seconds=10.6), RUNWAY, ["duration_mismatch"]),
        (Declared(duration_seconds=20.0), RUNWAY, ["duration_mismatch"]),
        # 10% of 20 s is 2 s, more than the fixed second of the default tolerance
        (Declared(duration_seconds=11.9), ToleranceConfig(duration_ratio=0.2), []),
        (Declared(width=1920, height=1080), RUNWAY, []),
        (Declared(width=1930, height=1085), RUNWAY, []),  # within 1%
        (Declared(width=1280, height=720), RUNWAY, ["resolution_mismatch"]),
        (Declared(width=1440, height=1080), RUNWAY, ["resolution_mismatch", "aspect_mismatch"]),
        (
            Declared(width=1440, height=1080),
            ToleranceConfig(resolution_ratio=-1.0),  # negative: resolution not checked
            ["aspect_mismatch"],
        ),
        (Declared(width=1920, height=1080), None, []),
        (Declared(width=1922, height=1080), None, ["resolution_mismatch"]),  # default: exact
        (Declared(width=1920), RUNWAY, []),  # only both sides are compared
        (Declared(), RUNWAY, []),
    ],
)
def test_declared_tolerances(
    declared: Declared, tolerance: ToleranceConfig | None, want: list[str]
) -> None:
    assert reasons_of(probe(video(), audio()), declared=declared, tolerance=tolerance) == want


def test_tolerances_compare_the_display_size_of_a_rotated_source() -> None:
    side = [SideData(side_data_type="Display Matrix", rotation=90.0)]
    p = probe(video(side_data_list=side))
    assert reasons_of(p, declared=Declared(width=1080, height=1920), tolerance=RUNWAY) == []
    assert reasons_of(p, declared=Declared(width=1920, height=1080), tolerance=RUNWAY) == [
        "resolution_mismatch",
        "aspect_mismatch",
    ]


# -- plan ------------------------------------------------------------------------------------


def summary(**kw: Any) -> MediaSummary:
    """A summary that can be remuxed: H.264 High 4.0 yuv420p 1920x1080 30 fps CFR, AAC-LC."""
    base = MediaSummary(
        container="mov,mp4,m4a,3gp,3g2,mj2",
        duration_seconds=10.0,
        start_time=0.0,
        width=1920,
        height=1080,
        display_width=1920,
        display_height=1080,
        rotation=0,
        sar="1:1",
        video_codec="h264",
        video_profile="High",
        video_level=40,
        pix_fmt="yuv420p",
        frame_rate=30.0,
        real_frame_rate=30.0,
        variable_frame_rate=False,
        interlaced=False,
        video_bit_rate=4_000_000,
        video_stream_index=0,
        audio_stream_index=1,
        audio_codec="aac",
        audio_profile="LC",
        audio_sample_rate=48000,
        audio_channels=2,
        audio_channel_layout="stereo",
        video_streams=1,
        audio_streams=1,
        subtitle_streams=0,
        attachment_streams=0,
        data_streams=0,
    )
    return msgspec.structs.replace(base, **kw)


def sizes(p: plan_mod.Plan) -> list[tuple[str, int, int, bool]]:
    return [(r.name, r.width, r.height, r.copy) for r in p.rungs]


def test_h264_high_yuv420p_aac_lc_cfr_is_remuxed() -> None:
    s = summary()
    assert plan_mod.transcode_reasons(s) == []
    p = plan_mod.make_plan(s, MEDIA, source_keyframes=[0.0, 4.0, 8.0])
    assert (p.mode, p.transcode_reasons, p.audio) == ("remux", [], "copy")
    # The top rung is the source itself; no 1080 rung is made on top of a 1080 source.
    assert sizes(p) == [
        ("1080p", 1920, 1080, True),
        ("720p", 1280, 720, False),
        ("480p", 854, 480, False),
        ("360p", 640, 360, False),
    ]
    assert p.top.copy and (p.top.crf, p.top.maxrate_kbps) == (0, 0)
    assert (p.rungs[1].crf, p.rungs[1].maxrate_kbps, p.rungs[1].bufsize_kbps) == (23, 3500, 7000)
    assert (p.frame_rate, p.frame_rate_expr, p.gop_frames) == (30.0, "30", 120)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"video_codec": "hevc", "video_profile": "Main"}, "video_codec:hevc"),
        ({"video_codec": "vp9", "video_profile": "Profile 0"}, "video_codec:vp9"),
        ({"video_profile": "High 10"}, "profile:High 10"),
        ({"video_profile": "High 4:4:4 Predictive"}, "profile:High 4:4:4 Predictive"),
        ({"video_level": 52}, "level:52"),
        ({"pix_fmt": "yuv444p"}, "pix_fmt:yuv444p"),
        ({"pix_fmt": "yuv420p10le"}, "pix_fmt:yuv420p10le"),
        ({"rotation": 90, "display_width": 1080, "display_height": 1920}, "rotation:90"),
        ({"variable_frame_rate": True, "frame_rate": 23.4}, "variable_frame_rate"),
        ({"interlaced": True}, "interlaced"),
        ({"sar": "4:3"}, "sar:4:3"),
        ({"width": 1919, "display_width": 1919}, "odd_dimensions"),
        ({"height": 1079, "display_height": 1079}, "odd_dimensions"),
        ({"frame_rate": 120.0, "real_frame_rate": 120.0}, "frame_rate"),
        ({"audio_codec": "opus", "audio_profile": ""}, "audio:opus/"),
        ({"audio_profile": "HE-AAC"}, "audio:aac/HE-AAC"),
        ({"start_time": 1.0}, "start_time"),
    ],
)
def test_each_transcode_reason(change: dict[str, Any], reason: str) -> None:
    s = summary(**change)
    assert plan_mod.transcode_reasons(s) == [reason]
    p = plan_mod.make_plan(s, MEDIA)
    assert (p.mode, p.transcode_reasons, p.cut_points) == ("transcode", [reason], None)
    assert not any(r.copy for r in p.rungs)
    assert p.audio == "aac"


def test_remux_accepts_the_plain_profiles_and_jpeg_range() -> None:
    for profile in ("Constrained Baseline", "Baseline", "Main", "High"):
        assert plan_mod.transcode_reasons(summary(video_profile=profile)) == [], profile
    assert plan_mod.transcode_reasons(summary(pix_fmt="yuvj420p")) == []
    assert plan_mod.transcode_reasons(summary(video_level=51, sar="0:1")) == []
    # Within half a frame of zero: the copied rung's cut points and the forced keyframes agree.
    assert plan_mod.transcode_reasons(summary(video_level=None, start_time=0.01)) == []
    assert plan_mod.transcode_reasons(summary(start_time=0.2)) == ["start_time"]
    no_audio = summary(audio_codec=None, audio_profile=None, audio_stream_index=None)
    assert plan_mod.transcode_reasons(no_audio) == []
    assert plan_mod.make_plan(no_audio, MEDIA).audio == "none"
    transcoded_silent = msgspec.structs.replace(no_audio, pix_fmt="yuv444p")
    assert plan_mod.make_plan(transcoded_silent, MEDIA).audio == "none"


def test_the_poster_is_a_frame_of_the_video_track() -> None:
    # 10 s of sound under 1 s of picture: 10% into the picture, not past its end (1.0 s).
    assert plan_mod.make_plan(summary(video_duration_seconds=1.0), MEDIA).poster_seconds == 0.1
    assert plan_mod.make_plan(summary(video_duration_seconds=10.0), MEDIA).poster_seconds == 1.0
    assert plan_mod.make_plan(summary(), MEDIA).poster_seconds == 1.0  # unknown: the file's


def test_several_reasons_are_all_listed() -> None:
    s = summary(video_codec="hevc", video_profile="Main 10", pix_fmt="yuv420p10le", rotation=180)
    assert plan_mod.transcode_reasons(s) == [
        "video_codec:hevc",
        "pix_fmt:yuv420p10le",
        "rotation:180",
    ]


def test_ladder_never_goes_above_a_720p_source() -> None:
    s = summary(width=1280, height=720, display_width=1280, display_height=720)
    remux = plan_mod.make_plan(s, MEDIA)
    assert sizes(remux) == [
        ("720p", 1280, 720, True),
        ("480p", 854, 480, False),
        ("360p", 640, 360, False),
    ]
    transcode = plan_mod.make_plan(msgspec.structs.replace(s, pix_fmt="yuv444p"), MEDIA)
    assert sizes(transcode) == [
        ("720p", 1280, 720, False),
        ("480p", 854, 480, False),
        ("360p", 640, 360, False),
    ]


def test_portrait_rungs_are_sized_by_their_short_side() -> None:
    portrait = summary(width=1080, height=1920, display_width=1080, display_height=1920)
    assert sizes(plan_mod.make_plan(portrait, MEDIA)) == [
        ("1080p", 1080, 1920, True),
        ("720p", 720, 1280, False),
        ("480p", 480, 854, False),
        ("360p", 360, 640, False),
    ]
    # A landscape frame turned by its display matrix is portrait too, and must be transcoded.
    turned = summary(rotation=90, display_width=1080, display_height=1920)
    p = plan_mod.make_plan(turned, MEDIA)
    assert p.mode == "transcode"
    assert sizes(p) == [
        ("1080p", 1080, 1920, False),
        ("720p", 720, 1280, False),
        ("480p", 480, 854, False),
        ("360p", 360, 640, False),
    ]
    assert p.proxy is not None and (p.proxy.width, p.proxy.height) == (540, 960)
    assert p.sprite_height == 284  # 160 wide at 9:16, even


@pytest.mark.parametrize(
    ("w", "h", "dw", "dh"),
    [
        (1920, 1080, 1920, 1080),
        (1080, 1920, 1080, 1920),
        (639, 359, 639, 359),
        (720, 480, 853, 480),  # anamorphic: display size from the SAR
        (3840, 1606, 3840, 1606),  # 2.39:1
        (1000, 1000, 1000, 1000),
        (4000, 362, 4000, 362),
    ],
)
def test_every_rung_has_even_dimensions_within_the_source(w: int, h: int, dw: int, dh: int) -> None:
    for pix_fmt in ("yuv420p", "yuv444p"):
        s = summary(width=w, height=h, display_width=dw, display_height=dh, pix_fmt=pix_fmt)
        p = plan_mod.make_plan(s, MEDIA)
        for rung in p.rungs:
            if rung.copy:
                continue
            assert rung.width % 2 == 0 and rung.height % 2 == 0, rung
            assert min(rung.width, rung.height) <= min(dw, dh), rung
            assert max(rung.width, rung.height) <= max(dw, dh) + 1, rung  # rounding to even
            assert abs(rung.width / rung.height - dw / dh) < 0.02, rung
        assert p.proxy is not None
        assert p.proxy.width % 2 == 0 and p.proxy.height % 2 == 0
        heights = [min(r.width, r.height) for r in p.rungs]
        assert heights == sorted(heights, reverse=True)


def test_odd_source_smaller_than_every_rung_gets_one_even_rung() -> None:
    s = summary(width=639, height=359, display_width=639, display_height=359)
    assert plan_mod.transcode_reasons(s) == ["odd_dimensions"]
    p = plan_mod.make_plan(s, MEDIA)
    assert sizes(p) == [("358p", 638, 358, False)]
    assert (p.top.crf, p.top.maxrate_kbps) == (25, 800)  # the smallest configured rung's caps
    assert p.proxy is not None and (p.proxy.name, p.proxy.width, p.proxy.height) == (
        "proxy358p",
        638,
        358,
    )


def test_tiny_240p_source_gets_one_rung() -> None:
    s = summary(width=320, height=240, display_width=320, display_height=240)
    remux = plan_mod.make_plan(s, MEDIA)
    assert sizes(remux) == [("240p", 320, 240, True)]
    transcode = plan_mod.make_plan(msgspec.structs.replace(s, video_codec="vp9"), MEDIA)
    assert sizes(transcode) == [("240p", 320, 240, False)]
    assert transcode.proxy is not None and transcode.proxy.name == "proxy240p"


def test_a_custom_ladder_is_sorted_and_capped() -> None:
    media = MediaConfig(
        ladder=[RungConfig(height=240), RungConfig(height=1440), RungConfig(height=540)]
    )
    s = summary(pix_fmt="yuv422p")
    assert sizes(plan_mod.make_plan(s, media)) == [
        ("540p", 960, 540, False),
        ("240p", 426, 240, False),
    ]


def test_remux_cut_points_follow_segment_boundaries() -> None:
    keyframes = [0.0, 2.0, 3.98, 6.0, 7.98, 10.0]
    p = plan_mod.make_plan(summary(), MEDIA, source_keyframes=keyframes)
    assert p.cut_points == segment_boundaries(keyframes, segment_seconds=4.0, start=0.0)
    assert p.cut_points == [6.0, 10.0]
    # AAC priming starts the muxer 23 ms early: 3.98 and 7.98 become cuts.
    primed = plan_mod.make_plan(summary(), MEDIA, source_keyframes=keyframes, stream_start=-0.023)
    assert primed.cut_points == segment_boundaries(keyframes, segment_seconds=4.0, start=-0.023)
    assert primed.cut_points == [3.98, 7.98]
    # A stream starting after the first keyframe does not move the origin.
    late = plan_mod.make_plan(summary(), MEDIA, source_keyframes=keyframes, stream_start=0.5)
    assert late.cut_points == [6.0, 10.0]
    # Segment length comes from the config.
    two = plan_mod.make_plan(
        summary(), MediaConfig(segment_seconds=2.0), source_keyframes=keyframes
    )
    assert two.cut_points == segment_boundaries(keyframes, segment_seconds=2.0, start=0.0)
    assert two.segment_seconds == 2.0 and two.gop_frames == 60
    # Without a keyframe list there is nothing to cut at.
    assert plan_mod.make_plan(summary(), MEDIA).cut_points == []


def test_frame_rate_of_transcoded_rungs() -> None:
    ntsc = summary(frame_rate=30000 / 1001, real_frame_rate=30000 / 1001)
    p = plan_mod.make_plan(ntsc, MEDIA)
    assert (p.frame_rate_expr, p.gop_frames) == ("30000/1001", 120)
    assert math.isclose(p.frame_rate, 30000 / 1001)
    vfr = summary(variable_frame_rate=True, frame_rate=23.38, real_frame_rate=30.0)
    p = plan_mod.make_plan(vfr, MEDIA)
    assert (p.frame_rate, p.frame_rate_expr) == (23.0, "23")
    fast = summary(frame_rate=120.0, real_frame_rate=120.0)
    assert plan_mod.make_plan(fast, MEDIA).frame_rate == 60.0
    unknown = summary(frame_rate=0.0, real_frame_rate=0.0)
    assert plan_mod.make_plan(unknown, MEDIA).frame_rate == 30.0


def test_required_and_optional_outputs_come_from_the_config() -> None:
    p = plan_mod.make_plan(summary(), MEDIA)
    assert p.required == ["playback", "poster"]
    assert p.optional == ["hls", "proxy", "sprite", "waveform", "keyframes"]
    assert p.outputs == [*p.required, *p.optional]
    media = MediaConfig(required_outputs=["playback", "hls"], optional_outputs=["poster"])
    p = plan_mod.make_plan(summary(), media)
    assert (p.required, p.optional) == (["playback", "hls"], ["poster"])
    only = plan_mod.make_plan(summary(), MEDIA, outputs=["playback", "sprite", "nonsense"])
    assert (only.required, only.optional) == (["playback"], ["sprite"])
    assert p.pipeline_version == MEDIA.pipeline_version


def test_poster_sprite_and_waveform_settings() -> None:
    p = plan_mod.make_plan(summary(duration_seconds=10.0), MEDIA)
    assert p.poster_seconds == 1.0  # 10% of 10 s
    long = plan_mod.make_plan(summary(duration_seconds=600.0), MEDIA)
    assert long.poster_seconds == 2.0  # capped
    assert (p.sprite_width, p.sprite_height, p.sprite_interval) == (160, 90, 1.0)
    media = MediaConfig(waveform_zooms=[512, 32, 128])
    assert plan_mod.make_plan(summary(), media).waveform_zooms == [32, 128, 512]
    assert p.proxy is not None and (p.proxy.name, p.proxy.width, p.proxy.height) == (
        "proxy540p",
        960,
        540,
    )
    assert p.proxy.crf == MEDIA.proxy_crf


def test_one_packet_scan_of_every_stream_only_where_its_output_is_bounded() -> None:
    from aivedio.pipeline.ffmpeg.packet_scans import ONE_SCAN_MAX_PACKETS, one_scan

    assert one_scan(summary())  # 10 s, 30 fps, AAC at 48 kHz
    assert not one_scan(summary(audio_streams=2))  # another track would be printed
    assert not one_scan(summary(subtitle_streams=1))
    assert not one_scan(summary(audio_codec="opus"))  # packet rate not known (2.5 ms frames)
    hour = summary(duration_seconds=3600.0, frame_rate=60.0, real_frame_rate=60.0)
    assert one_scan(hour)  # ~385,000 packets
    per_second = 120.0 + 48000 / 1024
    longest = ONE_SCAN_MAX_PACKETS / per_second
    assert one_scan(summary(duration_seconds=longest - 1, frame_rate=120.0, real_frame_rate=120.0))
    assert not one_scan(
        summary(duration_seconds=longest + 1, frame_rate=120.0, real_frame_rate=120.0)
    )
