"""Frames for moderation, and the pass that takes them from the source with its decode check.

Moderation looks at stills: the first, middle and last frames, and up to
``max_scene_frames`` at scene changes (the ``scene`` score of ffmpeg's ``select`` filter; the
times the ``metadata`` filter prints to a file, read back as numbers, never parsed from
stderr). Two ways to take them:

* ``sample_frames`` (the ``moderate`` job): from the playback MP4 a render already made, the
  video opened three times (from the start, at the middle, one second before the end).
* ``source_frames_args`` (the probe job's fast path): from the source itself, ONE opening
  decoded from the first packet to the last, split into the stills and the scene branch,
  the audio decoded too, under ``-xerror``. That decode is the decode check: a source whose
  tail does not decode fails the pass, which is a verdict on the media (INVALID_MEDIA), and
  the moderator never sees a frame of it. The scene branch needs every frame decoded
  anyway, so the full check costs nothing over the sampled one, and the frames exist before
  any output is made: moderation no longer waits for the playback. For a remux the frames
  are the playback's own (the same bitstream); for a transcode they are what it was
  encoded from. The same pass takes a remux's poster (``PosterShot``): the frame at the
  poster's time, at the source's size, which the render would otherwise decode again.
  ``frames_halves`` runs it as two processes, one per core, each over half of the video
  (``frames_graph_part``), and falls back to this one pass when they fail.

Every still is scaled to at most ``frame_width`` wide and written as a JPEG in the scratch
directory; ``read_frames`` collects them with their times.

The audio decoded by the source pass goes through ``ebur128`` on its way to the null
muxer (``measure``): the source's loudness, measured by the decode that was made anyway
(``read_loudness``), with which the plan decides whether and how to normalize it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import anyio

from aivedio.config.moderation import ModerationConfig
from aivedio.errors import RenderError
from aivedio.pipeline.ffmpeg.probe import raise_decode_failed
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox, media_deadline
from aivedio.pipeline.media.ffmpeg_args import POSTER_JPEG_QUALITY
from aivedio.pipeline.media.loudness import MEASURED, Loudness, measure_filter, parse_measurement
from aivedio.pipeline.media.rider import RIDER_VIDEO, Rider
from aivedio.pipeline.media.sniff import MP4, Sniff, input_args
from aivedio.pipeline.media.validate import MediaSummary

# The scene frames' times, as the metadata filter prints them (in the scratch directory).
SCENE_TIMES = "scene_times.txt"
_RELATIVE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*/")
STILLS = ("first", "middle", "last")
JPEG_QUALITY = "4"
# The pass over the source looks for the last frame this many frames (at the average
# rate) before the end, and never less than this many seconds.
LAST_WINDOW_FRAMES = 4
LAST_WINDOW_MIN_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class PosterShot:
    """A remux's poster, taken by the fast path's pass over the source: the frame at
    ``seconds`` on the video's own clock, at the video's own size, as a JPEG at ``path``
    (what the render's input seek makes, without decoding the source a second time)."""

    seconds: float
    path: Path


@dataclass(frozen=True, slots=True)
class Frame:
    kind: str  # first | middle | last | scene
    seconds: float
    jpeg: bytes


def video_seconds(summary: MediaSummary) -> float:
    """How long the video track itself lasts (the container's duration counts an audio track
    longer than the video, and a late start)."""
    seconds = summary.video_duration_seconds or summary.duration_seconds
    return seconds if seconds > 0 else 0.0


def still_times(duration: float, last_window: float = 1.0) -> dict[str, float]:
    """Where the first, middle and last stills are taken (the last: the final frame of the
    ``last_window`` seconds before the end)."""
    return {
        "first": 0.0,
        "middle": max(duration / 2, 0.0),
        "last": max(duration - last_window, 0.0),
    }


def last_window(summary: MediaSummary) -> float:
    """How far before the end the pass over the source starts looking for its last frame:
    a few frames' worth at the average rate (at least ``LAST_WINDOW_MIN_SECONDS``). Every
    frame in the window is scaled and written as a JPEG (the last one written wins), so a
    whole second of 1080p30 cost about 0.15 s of CPU on the critical path for one still.
    When the window misses the final frame (a stream that ends earlier than its container
    says, gaps of a variable rate), the still is missing and the fast path hands the
    decision to the moderate job, which takes its stills from the playback: slower, never
    unmoderated."""
    rate = summary.frame_rate if summary.frame_rate > 0 else 1.0
    return max(LAST_WINDOW_MIN_SECONDS, LAST_WINDOW_FRAMES / rate)


def _scale(config: ModerationConfig) -> str:
    return f"scale='min({config.frame_width},iw)':-2"


def _scene_branch(config: ModerationConfig, files: str = "") -> str:
    select = f"select='gt(scene,{config.scene_threshold})'"
    return f"{select},metadata=mode=print:file={files}{SCENE_TIMES},{_scale(config)}"


def _scene_output(config: ModerationConfig, scratch: Path) -> list[str]:
    return [
        "-map",
        "[scene]",
        "-fps_mode",
        "passthrough",
        "-frames:v",
        str(config.max_scene_frames),
        "-q:v",
        JPEG_QUALITY,
        str(scratch / "scene_%03d.jpg"),
    ]


def _still_output(label: str, scratch: Path, *, one: bool) -> list[str]:
    frames = ["-frames:v", "1"] if one else []
    path = str(scratch / f"{label}.jpg")
    return ["-map", f"[{label}]", *frames, "-q:v", JPEG_QUALITY, "-update", "1", path]


def playback_frames_args(
    video: Path, duration: float, config: ModerationConfig, scratch: Path
) -> list[str]:
    """``sample_frames``' ffmpeg: three openings of a playback MP4 (start, middle, one second
    before the end); the first one also through the scene filter. The seeks make the three
    stills cheap, and the scene pass decodes the video once."""
    scale = _scale(config)
    middle = still_times(duration)["middle"]
    inputs = [
        "-ss",
        "0",
        *input_args(MP4, video),
        "-ss",
        f"{middle:.3f}",
        *input_args(MP4, video),
        "-sseof",
        "-1",
        *input_args(MP4, video),
    ]
    # trim: a still's branch ends at its frame. Without it the graph goes on decoding that
    # opening (and scaling the first's) to the end: twice the CPU on a long video.
    still = f"trim=end_frame=1,{scale}"
    graph = [f"[1:v]{still}[middle]", f"[2:v]{scale}[last]"]
    outputs = [
        *_still_output("first", scratch, one=True),
        *_still_output("middle", scratch, one=True),
        *_still_output("last", scratch, one=False),
    ]
    if config.max_scene_frames:
        graph[:0] = [
            "[0:v]split=2[whole][scenes]",
            f"[whole]{still}[first]",
            f"[scenes]{_scene_branch(config)}[scene]",
        ]
        outputs += _scene_output(config, scratch)
    else:
        graph[:0] = [f"[0:v]{still}[first]"]
    return [*inputs, "-filter_complex", ";".join(graph), *outputs]


@dataclass(frozen=True, slots=True)
class FramesGraph:
    """The stills' (and scenes', poster's, loudness's) part of a filter graph and its
    outputs, fed by the video at ``video_in`` and the audio at ``audio_in`` (labels)."""

    graph: list[str]
    outputs: list[str]


def frames_graph(
    video_in: str,
    audio_in: str | None,
    summary: MediaSummary,
    config: ModerationConfig,
    scratch: Path,
    *,
    poster: PosterShot | None = None,
    measure: bool = False,
    files: str = "",
) -> FramesGraph:
    """The video from ``video_in`` split into the three stills and the scene branch (and
    ``poster``'s); the audio from ``audio_in`` decoded into the null muxer (through
    ``ebur128`` when ``measure``: ``read_loudness``). Used by the pass over the source
    (``source_frames_args``) and, riding along its decode, by a transcode's render
    (``frames_rider``). ``files``: where the printed times and loudness go, relative to the
    process's working directory (``scratch`` itself by default)."""
    return frames_graph_part(
        video_in, audio_in, summary, config, scratch, poster=poster, measure=measure, files=files
    )


def frames_graph_part(
    video_in: str,
    audio_in: str | None,
    summary: MediaSummary,
    config: ModerationConfig,
    scratch: Path,
    *,
    start: float = 0.0,
    stop: float | None = None,
    poster: PosterShot | None = None,
    measure: bool = False,
    files: str = "",
) -> FramesGraph:
    """``frames_graph`` for the part of the video from ``start`` (where ``video_in``'s first
    frame is, on the video's own clock) to ``stop`` (None: to its end), as one of the
    pass's halves (``frames_halves``) takes it: the stills whose times fall in the part (the
    last one only in the part that reaches the end), the scene branch over its frames; a
    part with a ``stop`` keeps the frame at ``stop`` for the scene branch and none after."""
    times = still_times(video_seconds(summary), last_window(summary))

    def within(seconds: float) -> bool:
        return seconds >= start and (stop is None or seconds < stop)

    scale = _scale(config)
    stills = [k for k in ("first", "middle") if within(times[k])]
    stills += ["last"] if stop is None else []
    branches = stills + (["scenes"] if config.max_scene_frames else [])
    shot = poster is not None and within(poster.seconds)
    branches += ["poster"] if shot else []
    # The video's own clock from 0 (setpts): a container that starts late, or an audio
    # track longer than the video, must not move the stills' times past its last frame.
    # Each still's branch ends at its frame (trim), the last one's keeps overwriting its
    # file (-update 1) until the final frame: nothing is held in memory, nothing reversed.
    # A part that stops keeps half a frame past ``stop``: its outputs all end there, and
    # with them the process.
    rate = summary.frame_rate if summary.frame_rate > 0 else 30.0
    head = f"{video_in}setpts=PTS-STARTPTS"
    head += f",trim=end={stop - start + 0.5 / rate:.6f}" if stop is not None else ""
    split = f",split={len(branches)}" + "".join(f"[v_{b}]" for b in branches)
    graph = [head + split]
    outputs: list[str] = []
    for still in stills:
        at = max(times[still] - start, 0.0)
        one = still != "last"
        begin = f"trim=start={at:.3f}," if at > 0 else ""
        graph.append(f"[v_{still}]{begin}{'trim=end_frame=1,' if one else ''}{scale}[{still}]")
        outputs += _still_output(still, scratch, one=one)
    if config.max_scene_frames:
        graph.append(f"[v_scenes]{_scene_branch(config, files)}[scene]")
        outputs += _scene_output(config, scratch)
    if shot and poster is not None:
        at = max(poster.seconds - start, 0.0)
        graph.append(f"[v_poster]trim=start={at:.3f},trim=end_frame=1[poster]")
        outputs += ["-map", "[poster]", "-frames:v", "1", "-q:v", POSTER_JPEG_QUALITY]
        outputs += ["-update", "1", "-f", "image2", str(poster.path)]
    if audio_in is not None and measure:
        graph.append(f"[{audio_in}]{measure_filter(files + MEASURED)}[loudness]")
        outputs += ["-map", "[loudness]", "-f", "null", "-"]
    elif audio_in is not None:
        outputs += ["-map", audio_in, "-f", "null", "-"]
    return FramesGraph(graph, outputs)


def source_frames_args(
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
) -> list[str]:
    """The fast path's pass over the source: one opening, decoded whole, into
    ``frames_graph``. ``check``: under ``-xerror`` (the decode check), so any decode error
    fails the process. Streams are named by absolute index: the stream validated is the
    stream decoded and looked at."""
    video, audio = summary.video_stream_index, summary.audio_stream_index
    frames = frames_graph(
        f"[0:{video}]",
        None if audio is None else f"0:{audio}",
        summary,
        config,
        scratch,
        poster=poster,
        measure=measure,
    )
    opening = input_args(sniff, source, max_streams=max_streams, max_pixels=max_pixels)
    return [
        *(["-xerror"] if check else []),
        *opening,
        "-filter_complex",
        ";".join(frames.graph),
        *frames.outputs,
    ]


def frames_rider(
    summary: MediaSummary,
    config: ModerationConfig,
    scratch: Path,
    work: Path,
    *,
    check: bool = True,
    measure: bool = False,
) -> Rider:
    """``frames_graph`` riding along a render's encode pass (``MediaRun.rider``), whose
    working directory is ``work``: the stills from the video that pass decodes, the audio
    decoded beside it, under ``-xerror`` with ``check``, so that pass is the decode check
    too. A transcode's required set and its frames from one decode of the source."""
    files = f"{os.path.relpath(scratch, work)}/"
    if not _RELATIVE.fullmatch(files):  # a filter argument: nothing to escape in it
        raise ValueError(f"frames directory {files!r} is not a plain relative path")
    audio = summary.audio_stream_index
    frames = frames_graph(
        RIDER_VIDEO,
        None if audio is None else f"0:{audio}",
        summary,
        config,
        scratch,
        measure=measure,
        files=files,
    )
    return Rider(frames.graph, frames.outputs, xerror=check)


async def rider_frames(scratch: Path, summary: MediaSummary) -> list[Frame]:
    """The frames a ``frames_rider`` took."""
    return await read_frames(scratch, still_times(video_seconds(summary), last_window(summary)))


async def source_frames(
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
) -> list[Frame]:
    """Run ``source_frames_args`` in the sandbox and read the frames. With ``check``, a
    failed pass over media whose plain whole decode fails too is the decode check's verdict
    (``InvalidMediaError``: ``decode_failed``, or the parser limit or crash that stopped
    it); any other failed pass is ``RenderError``. Running out of time or memory is
    ``ResourceExhaustedError``."""
    media = sandbox.media
    seconds = video_seconds(summary)
    result = await sandbox.run(
        "ffmpeg",
        source_frames_args(
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
        ),
        cwd=scratch,
        deadline_seconds=media_deadline(media, summary.duration_seconds),
        record=record,
    )
    if not result.ok:
        result.raise_if_exhausted()
        if check:
            # The pass also filters, encodes JPEGs and writes files, which can fail for
            # reasons that are not the media's (a file limit, the scratch disk): only a
            # plain whole decode that fails too is a verdict on it.
            confirm = await sandbox.run(
                "ffmpeg",
                plain_decode_args(sniff, source, summary, media.max_streams, media.max_pixels),
                cwd=scratch,
                deadline_seconds=media_deadline(media, summary.duration_seconds),
                record=record,
            )
            if not confirm.ok:
                raise_decode_failed(confirm)
        # A failed pass over media that decodes is a failed render step (a crash counts
        # toward the poison rule), never a verdict on the media.
        raise RenderError(f"frames: {result.error_detail()}")
    return await read_frames(scratch, still_times(seconds, last_window(summary)))


def plain_decode_args(
    sniff: Sniff, source: Path, summary: MediaSummary, max_streams: int, max_pixels: int
) -> list[str]:
    """The whole decode alone (video and audio into the null muxer, ``-xerror``): what
    confirms that a failed frames pass failed on the media itself."""
    video, audio = summary.video_stream_index, summary.audio_stream_index
    maps = ["-map", f"0:{video}", *(["-map", f"0:{audio}"] if audio is not None else [])]
    opening = input_args(sniff, source, max_streams=max_streams, max_pixels=max_pixels)
    return ["-xerror", *opening, *maps, "-f", "null", "-"]


async def read_loudness(scratch: Path) -> Loudness | None:
    """The loudness a pass with ``measure`` printed in ``scratch``; None when it printed
    none (no audio, or none decoded)."""
    path = anyio.Path(scratch / MEASURED)
    if not await path.is_file():
        return None
    return parse_measurement(await path.read_text("utf-8", "replace"))


async def read_frames(scratch: Path, times: dict[str, float]) -> list[Frame]:
    """The stills and scene frames a pass wrote to ``scratch``, with their times (the
    stills' from ``times``, where the pass took them)."""

    def read() -> list[Frame]:
        frames = [
            Frame(kind, at, (scratch / f"{kind}.jpg").read_bytes())
            for kind, at in times.items()
            if (scratch / f"{kind}.jpg").exists()
        ]
        printed = scratch / SCENE_TIMES
        lines = printed.read_text("utf-8", "replace").splitlines() if printed.exists() else []
        scenes = [pts_time(line) for line in lines if "pts_time:" in line]
        for index, path in enumerate(sorted(scratch.glob("scene_*.jpg"))):
            at = scenes[index] if index < len(scenes) else 0.0
            frames.append(Frame("scene", at, path.read_bytes()))
        return frames

    return await anyio.to_thread.run_sync(read)


def pts_time(line: str) -> float:
    try:
        return float(line.split("pts_time:", 1)[1].split()[0])
    except (IndexError, ValueError):
        return 0.0
