"""What a media run made and how it is checked: the output records and their verification.

``dag.MediaRun`` produces these records and the media stage uploads and stores them
(``media_objects``); ``aivedio process`` prints the ``Report``. Kept apart from the DAG so
the records, the MIME and object-key tables, and the file checks (non-empty, hashed, moov
before mdat, JPEG magic) can be used and read without the scheduling of ffmpeg runs.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from aivedio.errors import RenderError
from aivedio.pipeline.ffmpeg.sandbox import RunResult
from aivedio.pipeline.ffmpeg.verdict import Verdict
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.signing import Signed
from aivedio.pipeline.media.text_tracks import TextTrack
from aivedio.transfer_cpu import measured

MIME = {
    ".mp4": "video/mp4",
    ".m4s": "video/iso.segment",
    ".m3u8": "application/vnd.apple.mpegurl",
    ".jpg": "image/jpeg",
    ".vtt": "text/vtt",
    ".json": "application/json",
}

# The file each output is addressed by (its variant's object key).
PRIMARY = {
    "playback": "playback.mp4",
    "poster": "poster.jpg",
    "hls": "hls/master.m3u8",
    "proxy": "proxy.mp4",
    "sprite": "sprites/thumbnails.vtt",
    "waveform": "waveform/waveform_{zoom}.json",
    "keyframes": "keyframes.json",
}


class OutputFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # relative to the revision prefix
    size: int
    sha256: str
    mime: str


class OutputRecord(msgspec.Struct, kw_only=True):
    variant_type: str
    primary: str
    files: list[OutputFile]
    required: bool
    width: int | None = None
    height: int | None = None
    codec: str | None = None
    bitrate: int | None = None
    # Its C2PA signing (None: signing is off for it).
    c2pa: Signed | None = None
    # The text tracks it names (the HLS output's, from the source's subtitle streams).
    tracks: list[TextTrack] | None = None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def primary_file(self) -> OutputFile:
        return next(f for f in self.files if f.path == self.primary)


class ProcessRecord(msgspec.Struct, kw_only=True):
    step: str
    tool: str
    started_seconds: float  # after the report's origin: processes side by side overlap
    wall_seconds: float
    cpu_seconds: float | None
    max_rss_bytes: int | None
    returncode: int

    @classmethod
    def of(cls, step: str, result: RunResult, origin: float) -> ProcessRecord:
        return cls(
            step=step,
            tool=result.tool,
            started_seconds=round(result.started_at - origin, 4),
            wall_seconds=round(result.wall_seconds, 4),
            cpu_seconds=result.cpu_seconds,
            max_rss_bytes=result.max_rss_bytes,
            returncode=result.returncode,
        )


class NodeOutcome(msgspec.Struct, kw_only=True):
    name: str
    status: str  # done | failed
    seconds: float
    error_class: str | None = None
    detail: str | None = None


@dataclass
class Report:
    verdict: Verdict
    plan: Plan | None = None
    outputs: dict[str, OutputRecord] = field(default_factory=dict)
    nodes: dict[str, NodeOutcome] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    steps: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    origin: float = field(default_factory=time.monotonic)  # what process starts count from

    wanted: set[str] | None = None  # the outputs asked for (None: all)

    def record(self, step: str, result: RunResult) -> None:
        """Add a finished process to the timeline (its start counted from ``origin``)."""
        self.processes.append(ProcessRecord.of(step, result, self.origin))

    @property
    def required_done(self) -> bool:
        """Every required output that was asked for is done."""
        if self.plan is None:
            return False
        asked = [n for n in self.plan.required if self.wanted is None or n in self.wanted]
        return all(n in self.nodes and self.nodes[n].status == "done" for n in asked)

    def failed(self) -> list[NodeOutcome]:
        return [n for n in self.nodes.values() if n.status == "failed"]

    def to_json(self) -> dict[str, Any]:
        ffmpeg_wall = sum(p.wall_seconds for p in self.processes)
        overlapped = self.plan is not None and self.plan.chunking is not None
        rss = [p.max_rss_bytes for p in self.processes if p.max_rss_bytes is not None]
        return {
            "verdict": msgspec.to_builtins(self.verdict),
            "plan": msgspec.to_builtins(self.plan) if self.plan else None,
            "path": self.plan.path if self.plan else None,  # single_pass | chunked
            "required_done": self.required_done,
            "outputs": {k: msgspec.to_builtins(v) for k, v in self.outputs.items()},
            "nodes": {k: msgspec.to_builtins(v) for k, v in self.nodes.items()},
            "steps": {k: round(v, 4) for k, v in self.steps.items()},
            "processes": [msgspec.to_builtins(p) for p in self.processes],
            "wall_seconds": round(self.wall_seconds, 4),
            # Summed over processes; on the chunked path they overlap, so the sum can
            # exceed the wall time and no overhead is derived from it.
            "ffmpeg_wall_seconds": round(ffmpeg_wall, 4),
            "ffmpeg_cpu_seconds": round(sum(p.cpu_seconds or 0.0 for p in self.processes), 4),
            "overhead_seconds": (None if overlapped else round(self.wall_seconds - ffmpeg_wall, 4)),
            "peak_rss_bytes": max(rss) if rss else None,
        }


def describe(path: Path, out: Path) -> OutputFile:
    if not path.is_file() or path.stat().st_size == 0:
        raise RenderError(f"output {path.relative_to(out)} is missing or empty")
    digest = hashlib.sha256()
    with measured("hash"), path.open("rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    name = path.relative_to(out).as_posix()
    mime = MIME.get(path.suffix, "application/octet-stream")
    return OutputFile(path=name, size=path.stat().st_size, sha256=digest.hexdigest(), mime=mime)


def top_level_boxes(path: Path) -> list[str]:
    """The ISO BMFF top-level box types in file order."""
    boxes: list[str] = []
    size_total = path.stat().st_size
    with path.open("rb") as handle:
        offset = 0
        while offset + 8 <= size_total:
            handle.seek(offset)
            header = handle.read(16)
            size = int.from_bytes(header[:4], "big")
            kind = header[4:8].decode("latin-1")
            if size == 1:
                size = int.from_bytes(header[8:16], "big")
            elif size == 0:
                size = size_total - offset
            if size < 8:
                break
            boxes.append(kind)
            offset += size
    return boxes


def require_faststart(path: Path) -> None:
    if not path.is_file():
        raise RenderError(f"{path.name} was not written")
    boxes = top_level_boxes(path)
    if "moov" not in boxes or "mdat" not in boxes or boxes.index("moov") > boxes.index("mdat"):
        raise RenderError(f"{path.name}: moov is not before mdat ({boxes})")


def require_jpeg(path: Path) -> None:
    if not path.is_file():
        raise RenderError(f"{path.name} was not written")
    with path.open("rb") as handle:
        if handle.read(3) != b"\xff\xd8\xff":
            raise RenderError(f"{path.name} is not a JPEG")
