"""Keyframe index from ffprobe packets, and where ffmpeg's HLS muxer will cut segments.

The index (``keyframes.json``) lets the player and the editor seek to, and trim at, real
keyframes; ``max_gap`` is the worst-case seek cost and flags sources whose segments will come
out far longer than ``hls_time``.

The packets come from::

    ffprobe -v error -select_streams v:0 \\
        -show_entries packet=pts_time,dts_time,pos,flags -of csv=p=0 FILE

ffprobe prints the fields in its own order (pts_time, dts_time, pos, flags) whatever order
``-show_entries`` names them in; ``N/A`` marks a missing value (raw streams have no pts,
Matroska often no dts); flags are ``K_`` in ffmpeg 5.1 (``K__`` in later versions; ``D``
marks discard, e.g. AAC priming). A packet carrying side data gets an empty sub-section
appended (``...,KD,`` and a blank line) even though no side data was asked for.

:func:`segment_boundaries` reproduces ``hls_write_packet`` in ffmpeg 5.1 libavformat/hlsenc.c:
a new segment starts at the first video keyframe whose ``pts - start_pts`` reaches
``hls_time * number``, where ``number`` starts at 1 and grows by one per cut -- it is a count of
cuts, not a position on a time grid, so after a long keyframe gap the next target is still only
one ``hls_time`` further and the following keyframe cuts again even if it is a frame later
(keyframes 8.0 and 8.083 with hls_time 2 give a 0.083 s segment). ``start_pts`` is the pts of
the first packet the muxer receives from *any* stream: with AAC audio that is often the
priming packet at about -0.023 s, which moves every target 23 ms earlier (a keyframe at 1.98 is
then a cut for hls_time 2, while video-only output does not cut there). Pass it as ``start``.
``hls_time`` is an option of type duration, i.e. whole microseconds; comparisons here are done
in integer microseconds, exact for ffprobe's six-decimal times. ``hls_init_time`` and
``hls_flags split_by_time`` are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any, NamedTuple


class Packet(NamedTuple):  # a tuple: made by the thousand for each scan
    pts: float | None  # seconds; None when ffprobe prints N/A
    dts: float | None
    pos: int | None  # byte offset in the file
    key: bool


_MISSING = frozenset({"N/A", ""})


def parse_packets(csv_text: str) -> list[Packet]:
    """Packets from ffprobe's ``pts_time,dts_time,pos,flags`` CSV (``-of csv=p=0``).

    A ``packet,`` section prefix (``-of csv`` without ``p=0``), empty side-data sub-sections
    after the flags and blank lines are tolerated; any other shape raises ``ValueError``
    naming the line.
    """
    packets: list[Packet] = []
    append = packets.append
    isfinite = math.isfinite
    missing = _MISSING
    for number, raw in enumerate(csv_text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split(",")
        if fields[0] == "packet":
            fields = fields[1:]
        if len(fields) != 4:
            # A packet with side data (AAC priming's skip-samples, say) gets an empty trailing
            # sub-section even when none was asked for: "...,KD," (or "...,KD,side_data,").
            extra = fields[4:]
            if len(fields) < 4 or any(f and not f.replace("_", "").isalpha() for f in extra):
                raise ValueError(f"line {number}: expected pts_time,dts_time,pos,flags: {line!r}")
        pts_field, dts_field, pos_field, flags = fields[0], fields[1], fields[2], fields[3]
        try:
            pts = None if pts_field in missing else float(pts_field)
            dts = None if dts_field in missing else float(dts_field)
            pos = None if pos_field in missing else int(pos_field)
        except ValueError as exc:
            raise ValueError(f"line {number}: unparsable packet {line!r}") from exc
        if (pts is not None and not isfinite(pts)) or (dts is not None and not isfinite(dts)):
            raise ValueError(f"line {number}: non-finite timestamp {line!r}")
        append(Packet(pts, dts, pos, flags[:1] == "K"))
    return packets


def by_stream(csv_text: str, limits: Mapping[int, int | None]) -> dict[int, str]:
    """Split a scan of every stream (``stream_index`` first on each line) into the CSV of
    each stream in ``limits``, the index taken off, at most ``limits[i]`` packets of stream
    ``i`` (None: all). Lines of other streams, blank lines and lines without an index are
    dropped; ``parse_packets`` reads each part."""
    prefixes = {f"{index},": index for index in limits}
    kept: dict[int, list[str]] = {index: [] for index in limits}
    for raw in csv_text.splitlines():
        head, sep, rest = raw.partition(",")
        index = prefixes.get(head + sep)
        if index is None:
            continue
        lines, limit = kept[index], limits[index]
        if limit is None or len(lines) < limit:
            lines.append(rest)
    return {index: "\n".join(lines) for index, lines in kept.items()}


def keyframe_pts(packets: Iterable[Packet]) -> list[float]:
    """Sorted, de-duplicated pts of the key packets that have one."""
    return sorted({p.pts for p in packets if p.key and p.pts is not None})


def keyframe_index(packets: Sequence[Packet], *, duration_seconds: float) -> dict[str, Any]:
    """``{"version": 1, "duration", "keyframes": [{"t", "pos"}], "max_gap"}``.

    Only key packets with a pts, sorted by pts, one entry per pts (the first packet's byte
    offset wins). ``max_gap`` is the largest distance between consecutive keyframes or from the
    last keyframe to the end, rounded to the microsecond; with no keyframe it is the duration.
    """
    if not math.isfinite(duration_seconds) or duration_seconds < 0:
        raise ValueError(f"duration must be a finite non-negative number, got {duration_seconds}")
    first_pos: dict[float, int | None] = {}
    for packet in packets:
        if packet.key and packet.pts is not None and packet.pts not in first_pos:
            first_pos[packet.pts] = packet.pos
    times = sorted(first_pos)
    if times:
        edges = [*times, max(duration_seconds, times[-1])]
        max_gap = max(b - a for a, b in pairwise(edges))
    else:
        max_gap = duration_seconds
    return {
        "version": 1,
        "duration": duration_seconds,
        "keyframes": [{"t": t, "pos": first_pos[t]} for t in times],
        "max_gap": round(max_gap, 6),
    }


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def segment_boundaries(
    keyframe_times: Sequence[float], *, segment_seconds: float, start: float = 0.0
) -> list[float]:
    """Times at which ffmpeg 5.1's HLS muxer starts segments 2, 3, ... (``-hls_time``).

    ``keyframe_times`` are the video keyframe pts (any order, duplicates allowed; the earliest
    is taken to be the first video packet, which never cuts). ``start`` is the muxer's
    ``start_pts``: the pts of the first packet of any stream (see the module docstring).
    """
    if not math.isfinite(segment_seconds) or _us(segment_seconds) <= 0:
        raise ValueError(f"segment_seconds must be at least 1 microsecond, got {segment_seconds}")
    step = _us(segment_seconds)
    origin = _us(start)
    by_us: dict[int, float] = {}
    for t in keyframe_times:
        by_us.setdefault(_us(t), t)
    ordered = sorted(by_us)
    cuts: list[float] = []
    number = 1
    for t_us in ordered[1:]:
        if t_us - origin >= step * number:
            cuts.append(by_us[t_us])
            number += 1
    return cuts
