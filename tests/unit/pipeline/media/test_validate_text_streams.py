"""Which subtitle streams of a source the probe records as text tracks to publish."""

from __future__ import annotations

from aivedio.pipeline.ffmpeg.probe import Disposition, Format, ProbeOutput, Stream
from aivedio.pipeline.media.validate import summarize

VIDEO = Stream(
    index=0,
    codec_type="video",
    codec_name="h264",
    profile="High",
    pix_fmt="yuv420p",
    width=320,
    height=240,
    sample_aspect_ratio="1:1",
    r_frame_rate="24/1",
    avg_frame_rate="24/1",
    duration=4.0,
)


def subtitle(index: int, codec: str, **tags: str) -> Stream:
    return Stream(
        index=index,
        codec_type="subtitle",
        codec_name=codec,
        tags=dict(tags),
        disposition=Disposition(default=int(index == 1), hearing_impaired=int(index == 2)),
    )


def test_text_subtitle_streams_are_recorded_and_bitmap_ones_stay_not_rendered() -> None:
    streams = [
        VIDEO,
        subtitle(1, "mov_text", language="eng", title="English"),
        subtitle(2, "subrip", language="fra"),
        subtitle(3, "webvtt"),
        subtitle(4, "hdmv_pgs_subtitle", language="deu"),
    ]
    fmt = Format(format_name="mov,mp4", nb_streams=len(streams), duration=4.0)
    summary = summarize(ProbeOutput(streams=streams, format=fmt))
    assert summary is not None
    assert summary.subtitle_streams == 4
    assert [
        (t.index, t.codec_name, t.language, t.title, t.default, t.captions)
        for t in summary.text_streams
    ] == [
        (1, "mov_text", "eng", "English", True, False),
        (2, "subrip", "fra", "", False, True),
        (3, "webvtt", "", "", False, False),
    ]
    assert [(s.index, s.why) for s in summary.ignored_streams] == [(4, "not_rendered")]
