"""Caption text made clean: what survives ``webvtt.clean`` and what it refuses."""

from __future__ import annotations

import re

import pytest

from aivedio.pipeline.media import webvtt
from aivedio.pipeline.media.webvtt import CaptionsRefused, Limits
from tests.support.caption_media import GOOD_VTT, HOSTILE_SRT

_TAG = re.compile(r"<(/?)([a-z]+)")


def tags(text: str) -> set[str]:
    return {name for _, name in _TAG.findall(text)}


def test_srt_becomes_webvtt_with_dots_and_hours() -> None:
    track = webvtt.clean(
        b"1\n00:00:01,000 --> 00:00:02,250\nHello\n\n2\n01:02:03,004 --> 01:02:04,000\nBye\n"
    )
    assert track.source_format == "srt"
    assert track.webvtt() == (
        "WEBVTT\n\n00:00:01.000 --> 00:00:02.250\nHello\n\n01:02:03.004 --> 01:02:04.000\nBye\n"
    )


def test_hostile_srt_keeps_only_safe_tags_and_no_forged_cue() -> None:
    track = webvtt.clean(HOSTILE_SRT.encode())
    out = track.webvtt()
    assert len(track.cues) == 2
    assert tags(out) <= {"i", "b"}, out
    assert "<script" not in out and "<img" not in out and "<font" not in out
    assert "onerror" not in out.replace("onerror=alert(2)", "") or "<img" not in out
    assert "<i>kept</i>" in out
    # The forged timing line stays text of the first cue, its arrow escaped.
    assert out.count(" --> ") == 2 and "--&gt;" in out
    # An entity that spells a tag stays text; an unclosed tag is closed.
    assert "&lt;b&gt;not a tag&lt;/b&gt; <b>bold</b>" in out


def test_webvtt_drops_notes_styles_identifiers_and_unknown_settings() -> None:
    out = webvtt.clean(GOOD_VTT.encode()).webvtt()
    assert "NOTE" not in out and "STYLE" not in out and "url(" not in out and "intro" not in out
    assert "00:00:00.800 --> 00:00:02.600 align:start line:0\n" in out
    assert "onclick" not in out
    assert "<v Narrator>Caption at one second</v>" in out
    assert "<c.yellow>second</c> cue" in out


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x01\x02binary\xff", "binary"),
        (b"1\n00:00:01,000 --> 00:00:02,000\n\xff\xfe bad", "not_utf8"),
        (b"1\n00:00:01,000 -> 00:00:02,000\nx\n", "invalid_timestamp"),
        (b"1\n00:00:61,000 --> 00:01:02,000\nx\n", "invalid_timestamp"),
        (b"1\n00:00:05,000 --> 00:00:02,000\nx\n", "invalid_timestamp"),
        (b"WEBVTT\n\n00:01.0 --> 00:02.000\nx\n", "invalid_timestamp"),
        (b"WEBVTT\n\nid only\n", "invalid_timestamp"),
        (b"WEBVTT\n\n", "no_cues"),
        (b"1\n00:00:01,000 --> 00:00:02,000\n<script></script>\n", "no_cues"),
        (b"just some text\n", "invalid_timestamp"),
    ],
)
def test_bad_captions_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(CaptionsRefused) as caught:
        webvtt.clean(data)
    assert caught.value.reason == reason, caught.value.detail


def test_bounds_are_enforced() -> None:
    limits = Limits(max_bytes=2000, max_cues=3, max_line_chars=20, max_lines_per_cue=2)
    cue = "00:00:01,000 --> 00:00:02,000\n"
    with pytest.raises(CaptionsRefused, match="bytes") as big:
        webvtt.clean(b"x" * 2001, limits)
    assert big.value.reason == "too_large"
    many = "".join(f"{i}\n{cue}line\n\n" for i in range(4)).encode()
    with pytest.raises(CaptionsRefused) as caught:
        webvtt.clean(many, limits)
    assert caught.value.reason == "too_many_cues"
    with pytest.raises(CaptionsRefused) as caught:
        webvtt.clean(f"1\n{cue}{'y' * 21}\n".encode(), limits)
    assert caught.value.reason == "line_too_long"
    with pytest.raises(CaptionsRefused) as caught:
        webvtt.clean(f"1\n{cue}a\nb\nc\n".encode(), limits)
    assert caught.value.reason == "too_many_lines"


def test_control_characters_are_dropped_and_cues_sorted() -> None:
    data = (
        "WEBVTT\n\n00:00:05.000 --> 00:00:06.000\nlater\x07\x1b[31m\n\n"
        "00:00:01.000 --> 00:00:02.000\r\nfirst\u2028line\n"
    ).encode()
    track = webvtt.clean(data)
    assert [c.text for c in track.cues] == ["firstline", "later[31m"]
    assert all(ch == "\n" or ch >= " " for ch in track.webvtt())


def test_clean_output_is_a_fixed_point() -> None:
    once = webvtt.clean(HOSTILE_SRT.encode()).webvtt()
    assert webvtt.clean(once.encode()).webvtt() == once


def test_a_line_left_empty_never_ends_a_cue_early() -> None:
    out = webvtt.clean(b"1\n00:00:01,000 --> 00:00:02,000\nbefore\n<script>\nafter\n").webvtt()
    assert out == "WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nbefore\nafter\n"
