"""Chunked transcoding for long sources: where to split, and the ffmpeg argv of each step.

Pure: packets and the plan in, split points and argv out. Transcoding work is keyed by
``(video, source version, profile, segment)``, so a retried segment is the same task;
``chunk_stage`` runs these as jobs and ``ffmpeg.media_run`` as local processes.

* **split**: the source's video is cut by stream copy (the segment muxer, never a
  re-encode) at *clean* keyframes: a keyframe that no later packet displays before, so a
  chunk decodes on its own and no frame belongs to two chunks (an open GOP's leading
  pictures would). Split points sit near multiples of ``chunk_seconds``, on the segment grid
  when a clean keyframe is there.
* **encode** ``(chunk, rendition)``: the chunk's frames put back at their source times
  (``setpts``; the muxer may have shifted them), resampled onto the output frame grid from the
  chunk's snapped start, padded by cloning and trimmed at the snapped end, so each chunk gives
  exactly its share of the output frames; keyframes are forced on the plan's segment grid (or
  the copied rung's cut points) and the chunk's first frame is one too.
* **concat**: per rendition, the encoded chunks are joined by stream copy with explicit
  durations (frames / rate), so timestamps run on without gap or overlap; the packaging then
  proceeds as for a single-pass encode (one init segment per rendition, the HLS muxer cutting
  on the shared keyframes).

Audio is never chunked: it is encoded once for the whole duration (``render.encode_args``
with only the audio branch), so AAC priming never lands at a chunk boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from aivedio.config.media import MediaConfig
from aivedio.pipeline.media.keyframes import Packet
from aivedio.pipeline.media.sniff import MP4, Sniff, input_args

NUT = Sniff("nut", "nut", "nut", None)
CONCAT_FORMATS = "concat," + (MP4.format_whitelist or "")
SPLIT_EPSILON = 0.0005  # the segment muxer cuts at the first keyframe at or after a time
GRID_TOLERANCE = 0.001  # a keyframe this close to a segment boundary is on the grid
# Outputs the chunked path makes (the rest render from the source as usual).
CHUNK_OUTPUTS = ("playback", "hls", "keyframes")


class Chunking(msgspec.Struct, frozen=True, kw_only=True):
    """Where the source is cut: chunk ``i`` is ``[starts[i], starts[i+1])`` (the last ends
    at ``end``), in source seconds; ``frames[i]`` its source video packets; ``grid_starts``
    the same starts snapped to the output frame grid from ``origin``."""

    starts: list[float]
    end: float
    origin: float
    frames: list[int]
    grid_starts: list[float]
    grid_end: float
    chunk_seconds: float

    @property
    def count(self) -> int:
        return len(self.starts)

    def span(self, index: int) -> float:
        """Seconds of output chunk ``index`` makes (its snapped span)."""
        stop = self.grid_end if index + 1 == self.count else self.grid_starts[index + 1]
        return stop - self.grid_starts[index]

    def output_frames(self, index: int, rate: float) -> int:
        """Output frames chunk ``index`` makes: the whole grid steps in its snapped span."""
        stop = self.grid_end if index + 1 == self.count else self.grid_starts[index + 1]
        return round((stop - self.grid_starts[index]) * rate)


def clean_keyframes(packets: Sequence[Packet]) -> list[float]:
    """Keyframe times (decode order in, ascending out) that no later packet displays
    before: cutting there leaves no leading picture without its reference."""
    result: list[float] = []
    later_min = math.inf
    for packet in reversed(packets):
        if packet.pts is None:
            continue
        if packet.key and packet.pts <= later_min + 1e-9:
            result.append(packet.pts)
        later_min = min(later_min, packet.pts)
    return sorted(result)


def _on_grid(time: float, segment_seconds: float) -> bool:
    steps = time / segment_seconds
    return abs(steps - round(steps)) * segment_seconds < GRID_TOLERANCE


def choose_splits(
    keys: Sequence[float],
    *,
    origin: float,
    end: float,
    chunk_seconds: float,
    segment_seconds: float,
    allowed: Sequence[float] | None = None,
) -> list[float]:
    """Chunk start times: ``origin``, then one clean keyframe near each further multiple of
    ``chunk_seconds``, preferring one on the segment grid. ``allowed`` (a copied rung's cut
    points) restricts the candidates. No chunk is shorter than one segment, and a tail
    shorter than half a chunk joins the chunk before it."""
    candidates = sorted(keys)
    if allowed is not None:
        wanted = list(allowed)
        candidates = [k for k in candidates if any(abs(k - a) < GRID_TOLERANCE for a in wanted)]
    starts = [origin]
    target = origin + chunk_seconds
    while target < end - chunk_seconds / 2:
        low = max(starts[-1] + segment_seconds, target - chunk_seconds / 2)
        high = min(end - segment_seconds, target + chunk_seconds / 2)
        window = [k for k in candidates if low <= k <= high]
        if window:
            on_grid = [k for k in window if _on_grid(k, segment_seconds)]
            pool = on_grid or window
            starts.append(min(pool, key=lambda k: (abs(k - target), k)))
            target = starts[-1] + chunk_seconds
        else:
            target += chunk_seconds
    return starts


def make_chunking(
    packets: Sequence[Packet],
    *,
    end: float,
    rate: float,
    chunk_seconds: float,
    segment_seconds: float,
    allowed: Sequence[float] | None = None,
) -> Chunking | None:
    """The chunking of a source from its video packets, or None when it cannot be split
    into at least two chunks (no clean keyframe where one is needed)."""
    times = [p.pts for p in packets if p.pts is not None]
    if not times:
        return None
    origin = min(times)
    keys = clean_keyframes(packets)
    starts = choose_splits(
        keys,
        origin=origin,
        end=end,
        chunk_seconds=chunk_seconds,
        segment_seconds=segment_seconds,
        allowed=allowed,
    )
    if len(starts) < 2:
        return None
    bounds = [*starts[1:], math.inf]
    frames = [
        sum(1 for t in times if lo - 1e-6 <= t < hi - 1e-6)
        for lo, hi in zip(starts, bounds, strict=True)
    ]

    def snap(time: float) -> float:
        return origin + round((time - origin) * rate) / rate

    grid_end = snap(end)
    return Chunking(
        starts=starts,
        end=end,
        origin=origin,
        frames=frames,
        grid_starts=[snap(s) for s in starts],
        grid_end=grid_end,
        chunk_seconds=chunk_seconds,
    )


# -- argv ----------------------------------------------------------------------------------


def chunk_name(index: int) -> str:
    return f"chunk_{index:04d}.nut"


def split_args(
    sniff: Sniff,
    source: Path,
    chunking: Chunking,
    video_map: str,
    media: MediaConfig,
    directory: Path,
) -> list[str]:
    """Stream-copy the source's video into one NUT file per chunk (timestamps kept)."""
    times = ",".join(f"{t - SPLIT_EPSILON:.6f}" for t in chunking.starts[1:])
    return [
        *input_args(sniff, source, max_streams=media.max_streams),
        "-map",
        video_map,
        "-c",
        "copy",
        "-avoid_negative_ts",
        "disabled",
        "-f",
        "segment",
        "-segment_format",
        "nut",
        "-segment_times",
        times,
        "-reset_timestamps",
        "0",
        str(directory / "chunk_%04d.nut"),
    ]


def forced_keyframes(
    chunking: Chunking, index: int, *, segment_seconds: float, cut_points: list[float] | None
) -> list[str]:
    """``-force_key_frames`` for one chunk: the segment grid (or the copied rung's cut points)
    inside its snapped span; its first frame is a keyframe anyway."""
    start = chunking.grid_starts[index]
    stop = chunking.grid_end if index + 1 == chunking.count else chunking.grid_starts[index + 1]
    if cut_points is not None:
        times = [t for t in cut_points if start - GRID_TOLERANCE <= t < stop - GRID_TOLERANCE]
    else:
        first = math.ceil((start - GRID_TOLERANCE) / segment_seconds)
        times = []
        step = first
        while step * segment_seconds < stop - GRID_TOLERANCE:
            times.append(step * segment_seconds)
            step += 1
    times = [max(t - SPLIT_EPSILON, 0.0) for t in times] or [max(start, 0.0)]
    return ["-force_key_frames", ",".join(f"{t:.6f}" for t in times)]


def timing_filter(chunking: Chunking, index: int, rate_expr: str) -> str:
    """Frames back at source time, onto the output grid, exactly the chunk's span."""
    start = chunking.starts[index]
    grid_start = chunking.grid_starts[index]
    stop = chunking.grid_end if index + 1 == chunking.count else chunking.grid_starts[index + 1]
    return (
        f"setpts=PTS-STARTPTS+{start:.6f}/TB,fps={rate_expr}:start_time={grid_start:.6f},"
        f"tpad=stop=-1:stop_mode=clone,trim=end={stop:.6f}"
    )


def concat_list(pieces: Sequence[tuple[Path, int]], rate: float) -> str:
    """The concat demuxer's list: each piece with its exact duration (frames / rate)."""
    lines = ["ffconcat version 1.0"]
    for path, frames in pieces:
        quoted = str(path.resolve()).replace("'", "'\\''")
        lines += [f"file 'file:{quoted}'", f"duration {frames / rate:.9f}"]
    return "\n".join(lines) + "\n"


def concat_args(list_file: Path, output: Path, *, origin: float) -> list[str]:
    """Join one rendition's pieces by stream copy, starting where the source did."""
    return [
        "-protocol_whitelist",
        "file",
        "-format_whitelist",
        CONCAT_FORMATS,
        "-f",
        "concat",
        "-safe",
        "0",
        "-i",
        f"file:{list_file.resolve()}",
        "-map",
        "0:v:0",
        "-c",
        "copy",
        "-output_ts_offset",
        f"{origin:.6f}",
        "-f",
        "mp4",
        str(output),
    ]
