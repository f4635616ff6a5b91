"""Magic bytes before any demuxer: what the first bytes say a file is.

Only two container families are accepted: ISO BMFF (MP4/MOV) and Matroska/WebM. For those
the demuxer is *forced* from this sniff and the format whitelist names only that family, so a
playlist or a concat script renamed ``.mp4`` never reaches a demuxer that opens other files.
Everything else gets a reason code naming what it looks like, for the operator reading the
verdict (an HTML error page is a provider or CDN problem, random bytes are something else).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SNIFF_BYTES = 4096

_BMFF_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"uuid"}


@dataclass(frozen=True, slots=True)
class Sniff:
    kind: str  # "mp4", "matroska", or what it looks like when refused
    demuxer: str | None  # ffmpeg -f name; None when refused
    format_whitelist: str | None
    reason: str | None  # reason code when refused

    @property
    def accepted(self) -> bool:
        return self.demuxer is not None


MP4 = Sniff("mp4", "mov", "mov,mp4,m4a,3gp,3g2,mj2", None)
MATROSKA = Sniff("matroska", "matroska", "matroska,webm", None)

# (prefix, kind) of things we recognise in order to name them, never to open them.
_REFUSED_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF8", "gif"),
    (b"PK\x03\x04", "zip"),
    (b"%PDF", "pdf"),
    (b"#EXTM3U", "hls_playlist"),
    (b"ffconcat", "concat_script"),
    (b"RIFF", "riff"),
    (b"OggS", "ogg"),
    (b"ID3", "mp3"),
    (b"fLaC", "flac"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"(\xb5/\xfd", "zstd"),
)


def sniff_bytes(head: bytes) -> Sniff:
    if not head:
        return Sniff("empty", None, None, "empty_file")
    if len(head) >= 8 and head[4:8] in _BMFF_BOXES:
        return MP4
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return MATROSKA
    for prefix, kind in _REFUSED_PREFIXES:
        if head.startswith(prefix):
            return Sniff(kind, None, None, f"unsupported_container:{kind}")
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if text.startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
        return Sniff("html", None, None, "unsupported_container:html")
    if text.startswith((b"{", b"[")):
        return Sniff("json", None, None, "unsupported_container:json")
    if head[:1] == b"\x47" and len(head) > 188 and head[188:189] == b"\x47":
        return Sniff("mpegts", None, None, "unsupported_container:mpegts")
    if b"file " in head[:200] or b"#EXT" in head[:200]:
        return Sniff("text_playlist", None, None, "unsupported_container:playlist")
    return Sniff("unknown", None, None, "unrecognized_container")


def sniff_file(path: Path) -> Sniff:
    with path.open("rb") as handle:
        return sniff_bytes(handle.read(SNIFF_BYTES))


def input_args(
    sniff: Sniff, path: Path, *, max_streams: int | None = None, max_pixels: int | None = None
) -> list[str]:
    """The ffmpeg/ffprobe input options for a sniffed, accepted file (forced demuxer,
    format and protocol whitelists, ``file:`` so a name can never select a protocol, and the
    parser limits when given). Our own intermediates and outputs go through here too, as
    ``input_args(MP4, path)``: a copied audio track still carries the source's bytes."""
    if not sniff.accepted:
        raise ValueError(f"refused input ({sniff.reason}) must never reach a demuxer")
    assert sniff.demuxer is not None and sniff.format_whitelist is not None
    limits: list[str] = []
    if max_streams is not None:
        limits += ["-max_streams", str(max_streams)]
    if max_pixels is not None:
        limits += ["-max_pixels", str(max_pixels)]
    return [
        *limits,
        "-protocol_whitelist",
        "file",
        "-format_whitelist",
        sniff.format_whitelist,
        "-f",
        sniff.demuxer,
        "-i",
        # Absolute, and lexically normalized: the caller's own paths (no symlink to chase,
        # and resolve() would stat every component of every input of every run).
        f"file:{os.path.abspath(path)}",
    ]
