"""The fast path's pass over the source in two halves, one per core.

The whole decode under ``-xerror`` (the decode check, and the scene branch that needs every
frame) is the critical path of a remux to PLAYABLE, and ffmpeg's frame threads keep little
more than one core busy on it. So the pass runs as two ffmpeg processes side by side, cut at
the middle still's time ``T``:

* the **head** decodes from the first packet and stops (its every output done) at the first
  frame past ``T``: the first still, the poster (when it is before ``T``), and the scene
  branch up to and including the frame at ``T`` (so a cut exactly at ``T`` is scored against
  the frame before it);
* the **tail** opens the source at ``T`` (an input seek: decoded from the keyframe at or
  before ``T``, frames before ``T`` dropped) and decodes to the last packet: the middle still
  (its first frame), the last still, the poster (when at or after ``T``), the scene branch
  (its first frame scores 0: the head scored it), and, from a second opening of the same
  file, the whole audio (the decode check's audio and the loudness measurement).

Every packet is decoded by one of them: the head's frames before ``T`` need every packet
before the keyframe the tail starts at. Scene frames are the head's then the tail's, at most
``max_scene_frames`` in all, as one pass would take them. A source the halves fail on for any
reason (a half that cannot seek cleanly, an open GOP's leading pictures, a limit) is passed
over whole (``frames.source_frames``), which gives the verdict; the halves never do.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from aivedio.config.moderation import ModerationConfig
from aivedio.pipeline.ffmpeg.frames import (
    Frame,
    PosterShot,
    frames_graph_part,
    last_window,
    read_frames,
    source_frames,
    still_times,
    video_seconds,
)
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox, media_deadline
from aivedio.pipeline.media.loudness import MEASURED
from aivedio.pipeline.media.sniff import Sniff, input_args
from aivedio.pipeline.media.validate import MediaSummary

# A source shorter than this is passed over whole: two processes' start-up (about 40 ms each)
# and the GOP the tail decodes twice would eat what the second core gives.
HALVES_MIN_SECONDS = 4.0
HEAD, TAIL = "head", "tail"


def halves_pay(summary: MediaSummary, cores: int | None = None) -> bool:
    """Whether the pass runs in halves: two cores or more for this process, and a video long
    enough (``HALVES_MIN_SECONDS``)."""
    return usable_cores(cores) >= 2 and video_seconds(summary) >= HALVES_MIN_SECONDS


def usable_cores(cores: int | None = None) -> int:
    """``cores``, or the CPUs this process may run on."""
    return cores if cores is not None else len(os.sched_getaffinity(0))


def cut_seconds(summary: MediaSummary) -> float:
    """Where the halves meet: the middle still's time, on the video's own clock."""
    return still_times(video_seconds(summary), last_window(summary))["middle"]


def halves_args(
    sniff: Sniff,
    source: Path,
    summary: MediaSummary,
    config: ModerationConfig,
    scratch: Path,
    *,
    max_streams: int,
    max_pixels: int,
    check: bool = True,
    poster: PosterShot | None = None,
    measure: bool = False,
    cores: int | None = None,
) -> tuple[list[str], list[str]]:
    """The head's and the tail's ffmpeg arguments; each writes into ``scratch/head`` or
    ``scratch/tail`` (its working directory), the poster to ``poster.path``. Each half's
    video decoder gets half the cores: frame threads beyond them only contend (on two
    cores, one thread each: the pass 0.78-0.82 s against 0.87-0.93 s with ffmpeg's own
    count, and 0.95-0.99 s whole, 8 s of 1080p H.264)."""
    cut = cut_seconds(summary)
    threads = ["-threads", str(max(1, usable_cores(cores) // 2))]
    video, audio = summary.video_stream_index, summary.audio_stream_index
    opening = input_args(sniff, source, max_streams=max_streams, max_pixels=max_pixels)
    xerror = ["-xerror"] if check else []
    # The head keeps the frame at the cut (for the scene branch) and no other after it.
    head = frames_graph_part(
        f"[0:{video}]",
        None,
        summary,
        config,
        scratch / HEAD,
        stop=cut,
        poster=poster,
    )
    tail = frames_graph_part(
        f"[0:{video}]",
        None if audio is None else f"1:{audio}",
        summary,
        config,
        scratch / TAIL,
        start=cut,
        poster=poster,
        measure=measure,
    )
    head_args = [
        *xerror,
        *threads,
        *opening,
        "-filter_complex",
        ";".join(head.graph),
        *head.outputs,
    ]
    # The tail's audio comes from a second opening of the file, whole from its start.
    audio_opening = [] if audio is None else opening
    tail_args = [
        *xerror,
        *threads,
        "-ss",
        f"{cut:.6f}",
        *opening,
        *audio_opening,
        "-filter_complex",
        ";".join(tail.graph),
        *tail.outputs,
    ]
    return head_args, tail_args


async def halves_frames(
    sandbox: Sandbox,
    sniff: Sniff,
    source: Path,
    summary: MediaSummary,
    config: ModerationConfig,
    scratch: Path,
    *,
    check: bool = True,
    poster: PosterShot | None = None,
    measure: bool = False,
    record: list[RunResult] | None = None,
) -> list[Frame] | None:
    """Run the halves side by side and read their frames (and move the tail's loudness to
    ``scratch``, where ``read_loudness`` looks); None when either failed (the caller then
    passes over the source whole, which decides)."""
    media = sandbox.media
    head_args, tail_args = halves_args(
        sniff,
        source,
        summary,
        config,
        scratch,
        max_streams=media.max_streams,
        max_pixels=media.max_pixels,
        check=check,
        poster=poster,
        measure=measure,
    )
    deadline = media_deadline(media, summary.duration_seconds)
    results: dict[str, RunResult] = {}

    async def run(name: str, args: list[str], group: anyio.abc.TaskGroup) -> None:
        directory = scratch / name
        await anyio.Path(directory).mkdir(parents=True, exist_ok=True)
        result = await sandbox.run(
            "ffmpeg", args, cwd=directory, deadline_seconds=deadline, record=record
        )
        results[name] = result
        if not result.ok:
            group.cancel_scope.cancel()  # the whole pass decides: the other half is moot

    async with anyio.create_task_group() as group:
        group.start_soon(run, HEAD, head_args, group)
        group.start_soon(run, TAIL, tail_args, group)
    if len(results) != 2 or not all(r.ok for r in results.values()):
        return None
    if measure and await anyio.Path(scratch / TAIL / MEASURED).is_file():
        await anyio.Path(scratch / TAIL / MEASURED).replace(scratch / MEASURED)
    times = still_times(video_seconds(summary), last_window(summary))
    cut = cut_seconds(summary)
    head = await read_frames(scratch / HEAD, {"first": times["first"]})
    tail = await read_frames(scratch / TAIL, {k: times[k] for k in ("middle", "last")})
    scenes = [f for f in head if f.kind == "scene"]
    scenes += [Frame(f.kind, f.seconds + cut, f.jpeg) for f in tail if f.kind == "scene"]
    # The head has the first still, the tail the middle and the last: already in order.
    stills = [f for f in head + tail if f.kind != "scene"]
    return stills + scenes[: config.max_scene_frames]


async def source_pass(
    sandbox: Sandbox,
    sniff: Sniff,
    source: Path,
    summary: MediaSummary,
    config: ModerationConfig,
    scratch: Path,
    *,
    check: bool = True,
    poster: PosterShot | None = None,
    measure: bool = False,
    record: list[RunResult] | None = None,
    cores: int | None = None,
) -> list[Frame]:
    """The fast path's pass over the source: in halves where they pay (``halves_pay``), else,
    or when they fail, whole (``frames.source_frames``, which gives the verdict)."""
    if halves_pay(summary, cores):
        frames = await halves_frames(
            sandbox,
            sniff,
            source,
            summary,
            config,
            scratch,
            check=check,
            poster=poster,
            measure=measure,
            record=record,
        )
        if frames is not None:
            return frames
    return await source_frames(
        sandbox,
        sniff,
        source,
        summary,
        config,
        scratch,
        check=check,
        poster=poster,
        measure=measure,
        record=record,
    )
