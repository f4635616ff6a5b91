"""Text tracks (captions and subtitles) of a revision: what each is, where its files are,
and how the HLS master playlist names them.

A track is a clean WebVTT file (``webvtt.clean`` made it, whatever it came from: a subtitle
stream of the source, a sidecar a client attached, a provider's captions) and a one-segment
subtitle media playlist beside it, both under ``hls/text/`` of the revision's storage
prefix. The master playlist gets one ``EXT-X-MEDIA:TYPE=SUBTITLES`` line per track, all in
one group, and ``SUBTITLES="<group>"`` on every ``EXT-X-STREAM-INF``: players that read the
master (Safari, ExoPlayer, hls.js) offer the tracks, and the player page links the WebVTT
files as ``<track>`` elements.

The master is changed as text, after it was written: this module knows nothing of how the
variants were encoded (their ``CODECS``, their ranges), only that every variant line
starts with ``#EXT-X-STREAM-INF:``. The track records live in the ``hls`` output's
``extra.tracks``: the playlist that names them and the list that describes them are
published together, or not at all.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

import msgspec

from aivedio.untrusted import whole

GROUP_ID = "subs"
TEXT_DIR = "hls/text"
Kind = Literal["captions", "subtitles"]
Origin = Literal["source", "sidecar", "provider", "transcriber"]

# RFC 5646 language tags (BCP 47), grandfathered tags aside: language (with extended
# subtags), script, region, variants, extensions, private use. The same pattern is the
# OpenAPI schema's and the check's, so what the document calls valid is accepted.
LANGUAGE_PATTERN = whole(
    r"^(?:[A-Za-z]{2,3}(?:-[A-Za-z]{3}){0,3}|[A-Za-z]{4,8})(?:-[A-Za-z]{4})?"
    r"(?:-(?:[A-Za-z]{2}|[0-9]{3}))?(?:-(?:[A-Za-z0-9]{5,8}|[0-9][A-Za-z0-9]{3}))*"
    r"(?:-[0-9A-WY-Za-wy-z](?:-[A-Za-z0-9]{2,8})+)*(?:-[Xx](?:-[A-Za-z0-9]{1,8})+)?$"
)
# A label is shown in menus and written into a quoted playlist attribute and an HTML
# attribute: visible text without quotes or backslashes.
LABEL_PATTERN = whole(r'^[^\x00-\x1f\x7f-\x9f"\\]+$')
_LANGUAGE = re.compile(LANGUAGE_PATTERN)
_LABEL = re.compile(LABEL_PATTERN)

Language = Annotated[
    str,
    msgspec.Meta(
        min_length=2,
        max_length=35,
        pattern=LANGUAGE_PATTERN,
        description="the track's language, a BCP 47 tag (en, pt-BR, zh-Hant)",
    ),
]
Label = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=100,
        pattern=LABEL_PATTERN,
        description="the name players show for the track",
    ),
]


class TextTrack(msgspec.Struct, frozen=True, kw_only=True):
    """One published text track, as the ``hls`` output's ``extra.tracks`` records it."""

    id: str  # unique within the asset; names its files
    kind: Kind
    language: str
    label: str
    default: bool = False
    origin: Origin = "sidecar"
    cues: int = 0
    vtt: str  # path under the storage prefix
    playlist: str  # its subtitle media playlist, likewise

    @property
    def group_uri(self) -> str:
        """The playlist's URI relative to the master (which is in ``hls/``)."""
        return self.playlist.removeprefix("hls/")


def valid_language(value: str) -> bool:
    return len(value) <= 35 and _LANGUAGE.match(value) is not None


def valid_label(value: str) -> bool:
    return 0 < len(value) <= 100 and _LABEL.match(value) is not None


def make_track(
    track_id: str,
    *,
    kind: Kind,
    language: str,
    label: str,
    default: bool,
    origin: Origin,
    cues: int,
) -> TextTrack:
    """A track's record with its file paths (``hls/text/<id>.vtt`` and ``.m3u8``)."""
    if not re.fullmatch(r"[a-z0-9-]{1,64}", track_id):
        raise ValueError(f"a track id must be short lowercase letters and digits: {track_id!r}")
    if not valid_language(language):
        raise ValueError(f"not a BCP 47 language tag: {language!r}")
    if not valid_label(label):
        raise ValueError(f"not a label: {label!r}")
    return TextTrack(
        id=track_id,
        kind=kind,
        language=language,
        label=label,
        default=default,
        origin=origin,
        cues=cues,
        vtt=f"{TEXT_DIR}/{track_id}.vtt",
        playlist=f"{TEXT_DIR}/{track_id}.m3u8",
    )


def with_track(tracks: list[TextTrack], added: TextTrack) -> list[TextTrack]:
    """``tracks`` and ``added``; a default ``added`` takes the default from the others
    (one default track at most: a player selects it on its own)."""
    if added.default:
        tracks = [msgspec.structs.replace(t, default=False) for t in tracks]
    return [*tracks, added]


def subtitle_playlist(track: TextTrack, duration_seconds: float) -> str:
    """The track's subtitle media playlist: its one WebVTT file as one segment lasting the
    whole video."""
    seconds = max(duration_seconds, 0.001)
    return "\n".join(
        [
            "#EXTM3U",
            "#EXT-X-VERSION:7",
            f"#EXT-X-TARGETDURATION:{max(1, math.ceil(seconds))}",
            "#EXT-X-MEDIA-SEQUENCE:0",
            "#EXT-X-PLAYLIST-TYPE:VOD",
            f"#EXTINF:{seconds:.3f},",
            track.vtt.removeprefix(TEXT_DIR + "/"),
            "#EXT-X-ENDLIST",
            "",
        ]
    )


def media_line(track: TextTrack) -> str:
    default = "YES" if track.default else "NO"
    characteristics = (
        ',CHARACTERISTICS="public.accessibility.transcribes-spoken-dialog,'
        'public.accessibility.describes-music-and-sound"'
        if track.kind == "captions"
        else ""
    )
    return (
        f'#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="{GROUP_ID}",LANGUAGE="{track.language}",'
        f'NAME="{track.label}",DEFAULT={default},AUTOSELECT=YES{characteristics},'
        f'URI="{track.group_uri}"'
    )


_SUBTITLES_ATTR = re.compile(r',SUBTITLES="[^"]*"')
_OWN_MEDIA = re.compile(rf'^#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID="{GROUP_ID}",')


def master_with_tracks(master: str, tracks: list[TextTrack]) -> str:
    """``master`` with exactly ``tracks`` as its subtitles group: earlier lines of the
    group replaced, ``SUBTITLES`` set on every variant (removed when there is no track)."""
    lines = [line for line in master.splitlines() if not _OWN_MEDIA.match(line)]
    out: list[str] = []
    placed = False
    for line in lines:
        if line.startswith("#EXT-X-STREAM-INF:"):
            if not placed:
                out.extend(media_line(t) for t in tracks)
                placed = True
            line = _SUBTITLES_ATTR.sub("", line)
            if tracks:
                line += f',SUBTITLES="{GROUP_ID}"'
        out.append(line)
    if not placed:
        raise ValueError("the master playlist has no variant to add subtitles to")
    return "\n".join(out) + "\n"


def decode_tracks(extra: object) -> list[TextTrack]:
    """The tracks an ``hls`` output's ``extra`` records (none when it records none)."""
    found = extra.get("tracks") if isinstance(extra, dict) else None
    if not isinstance(found, list):
        return []
    return msgspec.convert(found, list[TextTrack])
