"""Captions an adapter reports with an output: held to sizes at the seam, decoded as the
intake stores them, made into track records by the render's rule."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from aivedio.errors import MalformedInputError
from aivedio.pipeline.ffmpeg.source_tracks import provided_track
from aivedio.pipeline.media.transcriber import NULL_TRANSCRIBER
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.providers.seam import (
    MAX_CAPTION_BYTES,
    MAX_CAPTIONS,
    ProviderCaption,
    ProviderOutput,
    check_output,
)

URL = "https://cdn.example.com/v.mp4"


def output(*captions: ProviderCaption) -> ProviderOutput:
    return ProviderOutput(index=0, url=URL, captions=list(captions))


def test_reported_captions_are_held_to_their_bounds() -> None:
    check_output(output(ProviderCaption(language="en", text="WEBVTT\n")), "outputs[0]")
    with pytest.raises(MalformedInputError, match="caption tracks") as many:
        check_output(output(*[ProviderCaption(language="en", text="x")] * (MAX_CAPTIONS + 1)), "o")
    assert many.value.field == "o.captions"
    with pytest.raises(MalformedInputError, match="bytes"):
        check_output(output(ProviderCaption(language="en", text="é" * MAX_CAPTION_BYTES)), "o")
    with pytest.raises(MalformedInputError, match="too long"):
        check_output(output(ProviderCaption(language="en" * 20, text="x")), "o")


def test_an_adapter_document_with_captions_decodes_and_becomes_a_track_record() -> None:
    document = {
        "index": 0,
        "url": URL,
        "captions": [{"language": "pt-BR", "label": "Português", "kind": "captions", "text": "x"}],
    }
    decoded = msgspec.convert(document, ProviderOutput)
    track = provided_track(decoded.captions[0], "provider-1", "provider", 3)
    assert (track.language, track.label, track.kind, track.origin, track.cues) == (
        "pt-BR",
        "Português",
        "captions",
        "provider",
        3,
    )
    assert track.vtt == "hls/text/provider-1.vtt"
    odd = provided_track(
        ProviderCaption(language="english!", label='say "hi"', kind="chapters", text="x"),
        "provider-2",
        "provider",
        1,
    )
    assert (odd.language, odd.label, odd.kind) == ("und", "und", "subtitles")


@pytest.mark.anyio
async def test_the_null_transcriber_makes_no_captions(tmp_path: Path) -> None:
    summary = msgspec.convert(
        {
            "container": "mp4",
            "duration_seconds": 1.0,
            "start_time": 0.0,
            "width": 2,
            "height": 2,
            "display_width": 2,
            "display_height": 2,
            "rotation": 0,
            "sar": "1:1",
            "video_codec": "h264",
            "video_profile": "High",
            "video_level": 30,
            "pix_fmt": "yuv420p",
            "frame_rate": 24.0,
            "real_frame_rate": 24.0,
            "variable_frame_rate": False,
            "interlaced": False,
            "video_bit_rate": None,
            "video_stream_index": 0,
            "audio_stream_index": None,
            "audio_codec": None,
            "audio_profile": None,
            "audio_sample_rate": None,
            "audio_channels": None,
            "audio_channel_layout": None,
            "video_streams": 1,
            "audio_streams": 0,
            "subtitle_streams": 0,
            "attachment_streams": 0,
            "data_streams": 0,
        },
        MediaSummary,
    )
    assert await NULL_TRANSCRIBER.transcribe(tmp_path / "source.mp4", summary) == []
