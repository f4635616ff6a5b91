"""The master playlist's SUBTITLES group and the track records (pure)."""

from __future__ import annotations

import pytest

from aivedio.pipeline.media import text_tracks
from aivedio.pipeline.media.text_tracks import make_track

MASTER = (
    "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n"
    '#EXT-X-STREAM-INF:BANDWIDTH=900000,CODECS="avc1.64001F,mp4a.40.2",RESOLUTION=1280x720\n'
    "720p/index.m3u8\n"
    '#EXT-X-STREAM-INF:BANDWIDTH=400000,CODECS="avc1.64001E,mp4a.40.2",RESOLUTION=640x360\n'
    "360p/index.m3u8\n"
)


def track(track_id: str, language: str, *, default: bool = False) -> text_tracks.TextTrack:
    return make_track(
        track_id,
        kind="captions",
        language=language,
        label=f"Label {language}",
        default=default,
        origin="sidecar",
        cues=2,
    )


def test_every_variant_names_the_group_and_each_track_has_one_media_line() -> None:
    tracks = [track("a1", "en", default=True), track("b2", "pt-BR")]
    out = text_tracks.master_with_tracks(MASTER, tracks)
    lines = out.splitlines()
    media = [line for line in lines if line.startswith("#EXT-X-MEDIA:")]
    assert media[0] == (
        '#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="subs",LANGUAGE="en",NAME="Label en",'
        'DEFAULT=YES,AUTOSELECT=YES,CHARACTERISTICS="public.accessibility.transcribes-'
        'spoken-dialog,public.accessibility.describes-music-and-sound",URI="text/a1.m3u8"'
    )
    assert 'LANGUAGE="pt-BR"' in media[1] and "DEFAULT=NO" in media[1]
    # The group comes before the variants that refer to it; the variants keep what they had.
    assert lines.index(media[-1]) < min(
        i for i, line in enumerate(lines) if line.startswith("#EXT-X-STREAM-INF")
    )
    variants = [line for line in lines if line.startswith("#EXT-X-STREAM-INF")]
    assert all(v.endswith(',SUBTITLES="subs"') for v in variants)
    assert 'CODECS="avc1.64001F,mp4a.40.2"' in variants[0]
    # Written again from its own output with one track fewer: the group is replaced.
    again = text_tracks.master_with_tracks(out, tracks[1:])
    assert again.count("#EXT-X-MEDIA:") == 1 and again.count('SUBTITLES="subs"') == 2
    assert text_tracks.master_with_tracks(out, []) == MASTER


def test_a_default_track_takes_the_default_from_the_others() -> None:
    first = track("a1", "en", default=True)
    both = text_tracks.with_track([first], track("b2", "fr", default=True))
    assert [t.default for t in both] == [False, True]


def test_the_subtitle_playlist_is_one_segment_the_length_of_the_video() -> None:
    text = text_tracks.subtitle_playlist(track("a1", "en"), 4.2)
    assert text.splitlines() == [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        "#EXT-X-TARGETDURATION:5",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-PLAYLIST-TYPE:VOD",
        "#EXTINF:4.200,",
        "a1.vtt",
        "#EXT-X-ENDLIST",
    ]


@pytest.mark.parametrize(
    "tag", ["en", "pt-BR", "zh-Hant-TW", "es-419", "de-CH-1996", "x-klingon"[2:], "en-x-custom"]
)
def test_bcp47_tags_are_accepted(tag: str) -> None:
    assert text_tracks.valid_language(tag), tag


@pytest.mark.parametrize(
    "tag", ["", "e", "english!", "en_US", "en-", '"en"', "en\n", "12", "en-US-"]
)
def test_malformed_language_tags_are_refused(tag: str) -> None:
    assert not text_tracks.valid_language(tag), tag


@pytest.mark.parametrize("label", ['a"b', "a\\b", "line\nbreak", "", "x" * 101])
def test_labels_that_would_break_a_quoted_attribute_are_refused(label: str) -> None:
    assert not text_tracks.valid_label(label)
    with pytest.raises(ValueError, match="not a label"):
        make_track(
            "a1",
            kind="captions",
            language="en",
            label=label,
            default=False,
            origin="sidecar",
            cues=1,
        )
