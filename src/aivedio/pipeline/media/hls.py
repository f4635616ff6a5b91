"""The HLS master playlist, written by aivedio itself from what was actually produced.

ffmpeg 5.1's own master omits ``CODECS`` for copied rungs, adds an audio-only variant and
reports nominal bandwidth. Here every variant line carries ``CODECS`` read from the
rendition's own init segment (the ``avcC`` box: profile, constraint flags, level; an AV1
rendition's ``av1C``: profile, level, tier, bit depth),
``RESOLUTION``, ``FRAME-RATE``, and ``BANDWIDTH``/``AVERAGE-BANDWIDTH`` measured from the
segment sizes and durations. Only renditions whose files were all verified are listed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aivedio.errors import InvalidMediaError
from aivedio.pipeline.media import av1

AAC_LC = "mp4a.40.2"
_EXTINF = re.compile(r"#EXTINF:([\d.]+)")


@dataclass(frozen=True, slots=True)
class Rendition:
    name: str  # directory under hls/
    width: int
    height: int
    frame_rate: float
    has_audio: bool
    # VIDEO-RANGE (SDR, PQ), written when a presentation has an HDR rendition; "": none.
    video_range: str = ""


@dataclass(frozen=True, slots=True)
class MediaPlaylist:
    init: str
    segments: list[tuple[str, float]]  # (uri, duration)


def parse_media_playlist(path: Path) -> MediaPlaylist:
    init = ""
    segments: list[tuple[str, float]] = []
    duration: float | None = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("#EXT-X-MAP:"):
            found = re.search(r'URI="([^"]+)"', line)
            init = found.group(1) if found else ""
        elif line.startswith("#EXTINF:"):
            match = _EXTINF.match(line)
            duration = float(match.group(1)) if match else 0.0
        elif line and not line.startswith("#"):
            segments.append((line, duration or 0.0))
            duration = None
    return MediaPlaylist(init=init, segments=segments)


def avc_codec_string(init_segment: Path) -> str:
    """``avc1.PPCCLL`` from the avcC box of an fMP4 init segment (RFC 6381)."""
    data = init_segment.read_bytes()
    at = data.find(b"avcC")
    if at < 0 or len(data) < at + 8:
        raise InvalidMediaError(f"no avcC box in {init_segment.name}", reasons=["hls_no_avcc"])
    profile, constraints, level = data[at + 5], data[at + 6], data[at + 7]
    return f"avc1.{profile:02X}{constraints:02X}{level:02X}"


def video_codec_string(init_segment: Path) -> str:
    """The video's ``CODECS`` entry from its init segment: ``av01.…`` for an AV1 rendition
    (``av1.codec_string``), ``avc1.…`` otherwise."""
    if b"av1C" in init_segment.read_bytes():
        return av1.codec_string(init_segment)
    return avc_codec_string(init_segment)


def measure(directory: Path, playlist: MediaPlaylist) -> tuple[int, int]:
    """(peak, average) bits per second. The peak is over segments, init counted once per
    segment; a short final segment is merged into the one before it (a 0.04 s tail would
    otherwise claim a peak many times the real one and steer players away)."""
    init_bits = ((directory / playlist.init).stat().st_size * 8.0) if playlist.init else 0.0
    sized = [
        ((directory / uri).stat().st_size * 8.0, seconds) for uri, seconds in playlist.segments
    ]
    total_bits = sum(bits for bits, _ in sized)
    total_seconds = sum(seconds for _, seconds in sized)
    longest = max((seconds for _, seconds in sized), default=0.0)
    if len(sized) >= 2 and sized[-1][1] < longest / 2:
        (bits_a, secs_a), (bits_b, secs_b) = sized[-2], sized[-1]
        sized = [*sized[:-2], (bits_a + bits_b, secs_a + secs_b)]
    peak = max(
        ((bits + init_bits) / seconds for bits, seconds in sized if seconds > 0), default=0.0
    )
    average = total_bits / total_seconds if total_seconds else 0.0
    return max(math.ceil(peak), 1), max(math.ceil(average), 1)


# The session data the master playlist names the rendition set's provenance record by.
PROVENANCE_DATA_ID = "org.aivedio.provenance"
PROVENANCE_FILE = "provenance.json"


def master_playlist(hls_dir: Path, renditions: list[Rendition], *, provenance: bool = False) -> str:
    """The master playlist text for ``renditions`` (top first), all under ``hls_dir``;
    ``provenance``: it names ``provenance.json`` beside it (``EXT-X-SESSION-DATA``, whose
    URI must be JSON), the rendition set's provenance record."""
    lines = ["#EXTM3U", "#EXT-X-VERSION:7", "#EXT-X-INDEPENDENT-SEGMENTS"]
    if provenance:
        lines.append(f'#EXT-X-SESSION-DATA:DATA-ID="{PROVENANCE_DATA_ID}",URI="{PROVENANCE_FILE}"')
    for rendition in renditions:
        directory = hls_dir / rendition.name
        playlist = parse_media_playlist(directory / "index.m3u8")
        codecs = video_codec_string(directory / playlist.init)
        if rendition.has_audio:
            codecs += f",{AAC_LC}"
        peak, average = measure(directory, playlist)
        lines.append(
            f"#EXT-X-STREAM-INF:BANDWIDTH={peak},AVERAGE-BANDWIDTH={average},"
            f'CODECS="{codecs}",RESOLUTION={rendition.width}x{rendition.height},'
            f"FRAME-RATE={rendition.frame_rate:.3f}"
            + (f",VIDEO-RANGE={rendition.video_range}" if rendition.video_range else "")
        )
        lines.append(f"{rendition.name}/index.m3u8")
    return "\n".join(lines) + "\n"


def provenance_record(
    hls_dir: Path, files: list[Path], digests: list[str], source: dict[str, Any] | None
) -> dict[str, Any]:
    """The rendition set's provenance record (``provenance.json``): HLS segments are not
    C2PA-signed (c2pa-python cannot sign fragmented MP4), so the record binds every file of
    the set by its SHA-256 and names the revision's signed progressive MP4, whose manifest
    carries the source's as its parent ingredient."""
    return {
        "type": "aivedio.provenance.v1",
        "segments_signed": False,
        "signed_reference": {"path": "../playback.mp4", "format": "video/mp4"},
        "source": source,
        "files": [
            {"path": path.relative_to(hls_dir).as_posix(), "sha256": digest}
            for path, digest in zip(files, digests, strict=True)
        ],
    }


def files_of(hls_dir: Path, rendition: str) -> list[Path]:
    """Every file a rendition's playlist references, plus the playlist (all must exist)."""
    directory = hls_dir / rendition
    playlist = parse_media_playlist(directory / "index.m3u8")
    names = [playlist.init] if playlist.init else []
    names += [uri for uri, _ in playlist.segments]
    return [directory / "index.m3u8", *(directory / name for name in names)]
