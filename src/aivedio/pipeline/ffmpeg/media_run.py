"""The media DAG on one machine: inspect, plan, render, package, finalize, verify.

Nodes are outputs (``playback``, ``poster``, ``hls``, ``proxy``, ``sprite``, ``waveform``,
``keyframes``). Where it pays, one ffmpeg decode feeds several nodes (``render.encode_args``);
if such a shared pass fails, the required nodes are retried together without the optional
ones, then each optional node alone, so a failed optional node never blocks the required
set (seed 004) and a failed node is retried alone.

Every node's files are verified (exist, non-empty, the right magic, faststart where it
matters) and hashed before the node counts as done; the records and the checks live in
``outputs``. ``aivedio process`` runs this directly; the worker's media stage runs it inside
a job and uploads what it made.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import msgspec

from aivedio.config.media import MediaConfig, ToleranceConfig
from aivedio.errors import AivedioError, InvalidMediaError, RenderError, ResourceExhaustedError
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.chunk_steps import ChunkSteps
from aivedio.pipeline.ffmpeg.outputs import (
    NodeOutcome,
    OutputRecord,
    Report,
    describe,
    require_faststart,
    require_jpeg,
)
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox, media_deadline
from aivedio.pipeline.ffmpeg.verdict import Verdict, inspect_file
from aivedio.pipeline.media import hls, keyframes, thumbnails, waveform
from aivedio.pipeline.media.chunks import CHUNK_OUTPUTS
from aivedio.pipeline.media.ffmpeg_args import (
    EncodeJob,
    Layout,
    encode_args,
    encode_job,
    merge_runs,
    package_args,
    poster_seek_args,
)
from aivedio.pipeline.media.plan import Plan, make_plan
from aivedio.pipeline.media.sniff import MP4, Sniff, input_args, sniff_file
from aivedio.pipeline.media.validate import Declared, MediaSummary

log = get_logger("aivedio.media")

PROGRESS_LOG_SECONDS = 10.0
# Packets read from the head of a file to find its earliest timestamp (reorder delay and
# audio priming show up within the first few).
HEAD_PACKETS = 48
AUDIO_HEAD_PACKETS = 8  # the audio's start: its first packets
# A scan of every stream prints every audio packet: at ~40 bytes a line, 500,000 are ~20 MB
# of ffprobe output, a third of the sandbox's stdout cap (an hour of 60 fps video with AAC
# at 48 kHz is about 385,000).
ONE_SCAN_MAX_PACKETS = 500_000

OnDone = Callable[[OutputRecord], Awaitable[None]]


class MediaRun:
    """One source through the DAG in a scratch directory. Not reusable."""

    def __init__(
        self,
        sandbox: Sandbox,
        source: Path,
        root: Path,
        *,
        on_done: OnDone | None = None,
        parallel: int = 1,
    ) -> None:
        """``on_done(record)`` runs as each output is verified (the worker uploads and
        records it then, so the required set is published without waiting for the rest);
        if it raises, that output counts as failed. ``parallel``: ffmpeg processes at once
        on the chunked path (the media lane's slots)."""
        self.on_done = on_done
        self.parallel = max(1, parallel)
        self.sandbox = sandbox
        self.media: MediaConfig = sandbox.media
        self.source = source
        self.layout = Layout(root)
        self.report: Report | None = None
        self._sniff: Sniff | None = None
        self._summary: MediaSummary | None = None

    # -- entry points ----------------------------------------------------------------------

    def assume_valid(self, summary: MediaSummary, *, sniff: Sniff | None = None) -> None:
        """Skip the verdict: the probe job already passed this source (same bytes, checked
        against the recorded SHA-256 on download). ``sniff``: the source's, when the source
        itself is not in the scratch directory (a chunked assembly that never reads it)."""
        self._sniff = sniff or sniff_file(self.source)
        self._summary = summary
        self.report = Report(
            verdict=Verdict(
                verdict="valid",
                error_class=None,
                reasons=[],
                container=self._sniff.kind,
                media=summary,
                decode_check="skipped",
                network_isolated=None,
            )
        )

    async def inspect(
        self, *, declared: Declared | None = None, tolerance: ToleranceConfig | None = None
    ) -> Report:
        started = time.monotonic()
        runs: list[RunResult] = []
        verdict, _ = await inspect_file(
            self.sandbox, self.source, declared=declared, tolerance=tolerance, record=runs
        )
        self.report = Report(verdict=verdict, origin=started)
        for run in runs:
            self.report.record(f"inspect:{run.tool}", run)
        self.report.steps["inspect"] = time.monotonic() - started
        self._sniff = sniff_file(self.source)
        self._summary = verdict.media
        return self.report

    async def run(
        self,
        *,
        wants: Iterable[str] | None = None,
        declared: Declared | None = None,
        tolerance: ToleranceConfig | None = None,
        plan: Plan | None = None,
        plan_only: bool = False,
    ) -> Report:
        """Inspect (unless already done), plan, and produce ``wants`` (default: all).
        ``plan_only``: stop after the plan (the probe job), a plan good for every output."""
        started = time.monotonic()
        wants = None if wants is None else list(wants)
        inspected_before = self.report is not None
        report = self.report or await self.inspect(declared=declared, tolerance=tolerance)
        if not report.verdict.valid:
            report.wall_seconds = time.monotonic() - started
            return report
        summary = self._summary
        assert summary is not None
        if plan is None:
            self.layout.make_dirs(wants=())  # the scans' cwd
            # Only HLS needs the source's keyframes (the cut points of a copied rung).
            # (and the chunked path: a long source is split at its keyframes).
            needs_cuts = plan_only or wants is None or "hls" in set(wants)
            needs_cuts = needs_cuts or 0 < self.media.chunk_threshold_seconds < (
                summary.duration_seconds
            )
            source_keys, start, packets, earliest = (
                await self._source_keyframes(summary) if needs_cuts else (None, None, None, None)
            )
            plan = make_plan(
                summary,
                self.media,
                source_keyframes=source_keys,
                stream_start=start,
                video_packets=packets,
                source_earliest=earliest,
            )
        report.plan = plan
        if plan_only:
            wants = []
        want = set(plan.outputs if wants is None else wants) & set(plan.outputs)
        self.layout.make_dirs(plan, want)
        report.wanted = want
        await self._produce(plan, summary, want)
        report.wall_seconds = time.monotonic() - started
        if inspected_before:
            report.wall_seconds += report.steps.get("inspect", 0.0)
        return report

    # -- steps ---------------------------------------------------------------------------

    async def _ffmpeg(self, step: str, args: list[str], duration: float) -> RunResult:
        assert self.report is not None
        progress = _ProgressLog(step, duration)
        result = await self.sandbox.run(
            "ffmpeg",
            args,
            cwd=self.layout.work,
            deadline_seconds=media_deadline(self.media, duration),
            on_progress=progress,
        )
        self.report.record(step, result)
        if not result.ok:
            result.raise_if_exhausted()
            raise RenderError(f"{step}: {result.error_detail()}")
        return result

    async def _ffprobe_csv(self, step: str, args: list[str]) -> str:
        assert self.report is not None
        result = await self.sandbox.run(
            "ffprobe",
            args,
            cwd=self.layout.work,
            deadline_seconds=self.media.probe_timeout_seconds,
            capture_stdout=True,
        )
        self.report.record(step, result)
        if not result.ok:
            result.raise_if_exhausted()
            raise RenderError(f"{step}: {result.error_detail()}")
        return result.stdout.decode("utf-8", "replace")

    async def _source_keyframes(
        self, summary: MediaSummary
    ) -> tuple[list[float], float | None, list[keyframes.Packet], float | None]:
        """The source's video keyframe times, the earliest audio packet's time, the video
        packets (decode order) the chunked path splits by, and the earliest pts or dts among
        the first packets of both (``Plan.source_earliest``)."""
        assert self._sniff is not None and self.report is not None
        started = time.monotonic()
        video, audio = summary.video_stream_index, summary.audio_stream_index
        heads: list[keyframes.Packet] = []
        if audio is not None and _one_scan(summary):
            # One scan of every stream (ffprobe demuxes them all either way), split here: a
            # process fewer than a scan per stream, for the audio lines the split skips.
            args = _packet_args(
                self._sniff,
                self.source,
                stream=None,
                indexed=True,
                max_streams=self.media.max_streams,
            )
            text = await self._ffprobe_csv("keyframe_scan", args)
            parts = keyframes.by_stream(text, {video: None, audio: AUDIO_HEAD_PACKETS})
            packets = keyframes.parse_packets(parts[video])
            heads = keyframes.parse_packets(parts[audio])
        else:
            # Other tracks (up to max_streams), audio of unknown or high packet rate, or
            # just too many packets: the other lines are never printed, a scan per stream.
            args = _packet_args(
                self._sniff, self.source, stream=str(video), max_streams=self.media.max_streams
            )
            packets = keyframes.parse_packets(await self._ffprobe_csv("keyframe_scan", args))
            if audio is not None:
                args = _packet_args(
                    self._sniff,
                    self.source,
                    stream=str(audio),
                    first=AUDIO_HEAD_PACKETS,
                    max_streams=self.media.max_streams,
                )
                heads = keyframes.parse_packets(await self._ffprobe_csv("audio_start_scan", args))
        starts = [p.pts for p in heads if p.pts is not None]
        audio_start = min(starts) if starts else None
        times = keyframes.keyframe_pts(packets)
        stamps = [
            value
            for packet in (*packets[:HEAD_PACKETS], *heads)
            for value in (packet.pts, packet.dts)
            if value is not None
        ]
        self.report.steps["keyframe_scan"] = time.monotonic() - started
        return times, audio_start, packets, min(stamps, default=None)

    async def _hls_offset(self, plan: Plan, has_audio: bool) -> float:
        """The one timestamp offset for every rendition: the earliest timestamp among the
        packets that will be muxed, negated (1 ms margin), or 0."""
        inputs: list[tuple[Sniff | None, Path, str | None]] = []
        earliest = 0.0
        encoded = [r for r in plan.rungs if not r.copy]
        if plan.top.copy:
            # The source's own packets: known from the probe's scans, when it recorded them;
            # else scanned, the planned streams only (an ignored track may start earlier).
            if plan.source_earliest is None:
                inputs.append((self._sniff, self.source, str(plan.video_stream)))
                if has_audio and plan.audio_stream is not None:
                    inputs.append((self._sniff, self.source, str(plan.audio_stream)))
            else:
                earliest = min(earliest, plan.source_earliest)
        inputs += [(None, self.layout.rung_video(r), None) for r in encoded]
        # The audio file is muxed with the encoded rungs only (a copied one takes the
        # source's own audio).
        if has_audio and encoded and self.layout.audio.exists():
            inputs.append((None, self.layout.audio, None))
        for sniff, path, stream in inputs:
            args = _packet_args(
                sniff, path, stream=stream, first=HEAD_PACKETS, max_streams=self.media.max_streams
            )
            for packet in keyframes.parse_packets(await self._ffprobe_csv("ts_scan", args)):
                for value in (packet.pts, packet.dts):
                    if value is not None:
                        earliest = min(earliest, value)
        return 0.0 if earliest >= 0 else round(-earliest + 0.001, 3)

    @property
    def sniff(self) -> Sniff:
        assert self._sniff is not None, "inspect() or assume_valid() first"
        return self._sniff

    def chunk_steps(self, plan: Plan) -> ChunkSteps:
        """The chunked path's steps, running their processes as this run's."""
        return ChunkSteps(self._ffmpeg, self._ffprobe_csv, self.media, plan, self.layout)

    async def package_encoded(self, plan: Plan, nodes: list[str]) -> Report:
        """The chunked assembly: the rung videos (and the audio) are already in ``work/``;
        package, finalize and verify ``nodes`` (a failure fails them all)."""
        assert self.report is not None and self._summary is not None
        self.report.plan = plan
        nodes = [n for n in CHUNK_OUTPUTS if n in nodes]
        self.layout.make_dirs(plan, nodes)
        self.report.wanted = set(nodes)
        try:
            await self._run_group(nodes, plan, self._summary, encoded=True)
        except (RenderError, ResourceExhaustedError, InvalidMediaError, OSError) as exc:
            for node in nodes:
                if node not in self.report.nodes:
                    self._fail(node, exc)
        return self.report

    async def _produce(self, plan: Plan, summary: MediaSummary, want: set[str]) -> None:
        if plan.chunking is not None:
            chunked = [n for n in CHUNK_OUTPUTS if n in want]
            want = want - set(chunked)
            if chunked:
                await self._chunked(plan, summary, chunked)
        required = [n for n in plan.required if n in want]
        optional = [n for n in plan.optional if n in want]
        if plan.mode == "remux":
            # The required set needs no encode pass: copies and a poster by seek, in one
            # process, before the optional outputs' decode.
            await self._attempt(required, plan, summary)
            await self._attempt([n for n in optional], plan, summary)
        else:
            await self._attempt(required + optional, plan, summary)

    async def _chunked(self, plan: Plan, summary: MediaSummary, nodes: list[str]) -> None:
        """The fleet's chunked path on one machine: split, every ``(chunk, rendition)`` and
        the audio as concurrent local processes (up to ``parallel``), join, package."""
        assert self._sniff is not None and self.report is not None
        sniff = self._sniff
        started = time.monotonic()
        steps = self.chunk_steps(plan)
        try:
            chunks = await steps.split(sniff, self.source)
            pieces: dict[tuple[str, int], tuple[Path, int]] = {}
            limiter = anyio.CapacityLimiter(self.parallel)

            async def encode(index: int, chunk: Path) -> None:
                # Every rendition of a chunk from one decode of it, as a worker's first
                # attempt at a chunk's piece does when its siblings are not taken.
                async with limiter:
                    made = await steps.encode_many(steps.encoded_rungs, index, chunk)
                for rung, piece in zip(steps.encoded_rungs, made, strict=True):
                    pieces[(rung.name, index)] = piece

            async def audio() -> None:
                async with limiter:
                    await steps.audio(sniff, self.source, summary)

            async with anyio.create_task_group() as group:
                if plan.audio != "none":
                    group.start_soon(audio)
                for index, chunk in enumerate(chunks):
                    group.start_soon(encode, index, chunk)
            for rung in steps.encoded_rungs:
                await steps.join(rung, [pieces[(rung.name, i)] for i in range(len(chunks))])
        except (RenderError, ResourceExhaustedError, InvalidMediaError, OSError) as exc:
            for node in nodes:
                self._fail(node, exc)
            return
        finally:
            self.report.steps["chunked_encode"] = time.monotonic() - started
        try:
            await self._run_group(nodes, plan, summary, encoded=True)
        except (RenderError, ResourceExhaustedError, InvalidMediaError, OSError) as exc:
            for node in nodes:
                if node not in self.report.nodes:
                    self._fail(node, exc)

    async def _attempt(self, nodes: list[str], plan: Plan, summary: MediaSummary) -> None:
        """Run ``nodes`` together; on failure split them (required first, then one by one)."""
        nodes = [n for n in nodes if n != "keyframes"] + (
            ["keyframes"] if "keyframes" in nodes else []
        )
        if not nodes:
            return
        try:
            await self._run_group(nodes, plan, summary)
        except (RenderError, ResourceExhaustedError, InvalidMediaError, OSError) as exc:
            if len(nodes) == 1:
                self._fail(nodes[0], exc)
                return
            required = [n for n in nodes if n in plan.required]
            optional = [n for n in nodes if n not in plan.required]
            if required and optional:
                await self._attempt_pending(required, plan, summary, exc)
                for node in optional:
                    await self._attempt_pending([node], plan, summary, exc)
            else:
                for node in nodes:
                    await self._attempt_pending([node], plan, summary, exc)

    async def _attempt_pending(
        self, nodes: list[str], plan: Plan, summary: MediaSummary, cause: BaseException
    ) -> None:
        assert self.report is not None
        pending = [n for n in nodes if n not in self.report.nodes]
        if pending:
            await self._attempt(pending, plan, summary)

    def _fail(self, node: str, exc: BaseException) -> None:
        assert self.report is not None
        error_class = exc.error_class if isinstance(exc, AivedioError) else "render_failed"
        self.report.nodes[node] = NodeOutcome(
            name=node,
            status="failed",
            seconds=0.0,
            error_class=error_class,
            detail=str(exc)[:500],
        )

    async def _run_group(
        self, nodes: list[str], plan: Plan, summary: MediaSummary, *, encoded: bool = False
    ) -> None:
        """Encode (unless ``encoded``: the chunked path made the rung videos and the audio),
        package, then finalize and verify each node."""
        assert self._sniff is not None and self.report is not None
        wants = set(nodes)
        has_audio = summary.audio_codec is not None
        started = time.monotonic()
        job = encode_job(plan, wants, has_audio=has_audio)
        if encoded:
            job = EncodeJob(
                rungs=(), proxy=False, poster=False, sprite=False, pcm=False, audio=False
            )
        if not job.empty:
            args = encode_args(
                plan,
                job,
                self.media,
                self._sniff,
                self.source,
                self.layout,
                audio_channels=summary.audio_channels,
                audio_rate=summary.audio_sample_rate,
            )
            await self._ffmpeg(f"encode[{','.join(sorted(wants))}]", args, plan.duration_seconds)
        elif job.audio:
            audio_only = EncodeJob(
                rungs=(), proxy=False, poster=False, sprite=False, pcm=False, audio=True
            )
            args = encode_args(
                plan,
                audio_only,
                self.media,
                self._sniff,
                self.source,
                self.layout,
                audio_channels=summary.audio_channels,
                audio_rate=summary.audio_sample_rate,
            )
            await self._ffmpeg("audio", args, plan.duration_seconds)
        offset = await self._hls_offset(plan, has_audio) if "hls" in wants else 0.0
        runs = package_args(
            plan,
            wants,
            self.media,
            self._sniff,
            self.source,
            self.layout,
            has_audio=has_audio,
            hls_offset=offset,
        )
        named = ["package"] if runs else []
        if "poster" in wants and not job.poster:  # no encode pass makes it: one frame by seek
            runs.append(poster_seek_args(plan, self.media, self._sniff, self.source, self.layout))
            named.append("poster_seek")
        if runs:  # one process for every output that needs no encode pass
            await self._ffmpeg("+".join(named), merge_runs(runs), plan.duration_seconds)
        shared = time.monotonic() - started
        for node in nodes:
            node_started = time.monotonic()
            record = await self._finalize(node, plan, summary)
            if self.on_done is not None:
                try:
                    await self.on_done(record)
                except AivedioError as exc:
                    self._fail(node, exc)
                    continue
            self.report.outputs[node] = record
            self.report.nodes[node] = NodeOutcome(
                name=node,
                status="done",
                seconds=round(shared / len(nodes) + time.monotonic() - node_started, 4),
            )

    # -- finalize and verify ---------------------------------------------------------------

    async def _finalize(self, node: str, plan: Plan, summary: MediaSummary) -> OutputRecord:
        layout = self.layout
        top = plan.top
        required = node in plan.required
        if node == "playback":
            require_faststart(layout.playback)
            return await self._record(
                node,
                "playback.mp4",
                [layout.playback],
                required,
                width=top.width,
                height=top.height,
                codec="h264",
            )
        if node == "poster":
            require_jpeg(layout.poster)
            return await self._record(node, "poster.jpg", [layout.poster], required)
        if node == "proxy":
            require_faststart(layout.proxy)
            assert plan.proxy is not None
            return await self._record(
                node,
                "proxy.mp4",
                [layout.proxy],
                required,
                width=plan.proxy.width,
                height=plan.proxy.height,
                codec="h264",
            )
        if node == "hls":
            renditions = [
                hls.Rendition(
                    name=r.name,
                    width=r.width,
                    height=r.height,
                    frame_rate=summary.frame_rate if r.copy else plan.frame_rate,
                    has_audio=summary.audio_codec is not None,
                )
                for r in plan.rungs
            ]
            files: list[Path] = []
            for rendition in renditions:
                files += hls.files_of(layout.hls, rendition.name)
            master = layout.hls / "master.m3u8"
            master.write_text(hls.master_playlist(layout.hls, renditions))
            return await self._record(
                node,
                "hls/master.m3u8",
                [master, *files],
                required,
                width=top.width,
                height=top.height,
                codec="h264",
            )
        if node == "sprite":
            return await self._finalize_sprite(plan, summary, required)
        if node == "waveform":
            return await self._finalize_waveform(plan, summary, required)
        if node == "keyframes":
            return await self._finalize_keyframes(plan, required)
        raise ValueError(f"unknown output {node!r}")

    async def _finalize_sprite(
        self, plan: Plan, summary: MediaSummary, required: bool
    ) -> OutputRecord:
        layout = self.layout
        sheet_layout = thumbnails.sprite_layout(
            plan.duration_seconds,
            interval=plan.sprite_interval,
            columns=self.media.sprite_columns,
            rows=self.media.sprite_rows,
        )
        sheets = sorted(layout.sprites.glob("sprite_*.jpg"))
        if len(sheets) < sheet_layout.sheets:
            raise RenderError(f"sprite: {len(sheets)} sheets made, {sheet_layout.sheets} expected")
        sheets = sheets[: sheet_layout.sheets]
        for sheet in sheets:
            require_jpeg(sheet)
        width, height = thumbnails.jpeg_dimensions(sheets[0])
        thumb_w = width // self.media.sprite_columns
        thumb_h = height // self.media.sprite_rows
        vtt = layout.sprites / "thumbnails.vtt"
        vtt.write_text(
            thumbnails.webvtt_index(sheet_layout, thumb_width=thumb_w, thumb_height=thumb_h)
        )
        return await self._record(
            "sprite",
            "sprites/thumbnails.vtt",
            [vtt, *sheets],
            required,
            width=thumb_w,
            height=thumb_h,
        )

    async def _finalize_waveform(
        self, plan: Plan, summary: MediaSummary, required: bool
    ) -> OutputRecord:
        layout = self.layout
        if summary.audio_codec is None:
            peaks = waveform.silent_waveform(
                plan.duration_seconds, plan.waveform_sample_rate, plan.waveform_zooms
            )
        else:
            peaks = await anyio.to_thread.run_sync(
                lambda: waveform.compute_peaks(
                    layout.pcm, sample_rate=plan.waveform_sample_rate, zooms=plan.waveform_zooms
                )
            )
        paths = waveform.write_waveforms(peaks, layout.waveform)
        primary = f"waveform/waveform_{plan.waveform_zooms[0]}.json"
        return await self._record("waveform", primary, paths, required)

    async def _finalize_keyframes(self, plan: Plan, required: bool) -> OutputRecord:
        layout = self.layout
        if not layout.playback.exists():
            raise RenderError("keyframes: the playback MP4 is not there (it failed)")
        text = await self._ffprobe_csv("keyframes", _packet_args(None, layout.playback))
        index = keyframes.keyframe_index(
            keyframes.parse_packets(text), duration_seconds=plan.duration_seconds
        )
        layout.keyframes.write_bytes(msgspec.json.encode(index))
        return await self._record("keyframes", "keyframes.json", [layout.keyframes], required)

    async def _record(
        self,
        node: str,
        primary: str,
        paths: list[Path],
        required: bool,
        *,
        width: int | None = None,
        height: int | None = None,
        codec: str | None = None,
    ) -> OutputRecord:
        out = self.layout.out
        files = await anyio.to_thread.run_sync(lambda: [describe(p, out) for p in paths])
        record = OutputRecord(
            variant_type=node,
            primary=primary,
            files=files,
            required=required,
            width=width,
            height=height,
            codec=codec,
        )
        if node in ("playback", "proxy") and self.report and self.report.plan:
            seconds = max(self.report.plan.duration_seconds, 0.001)
            record.bitrate = int(record.primary_file().size * 8 / seconds)
        return record


class _ProgressLog:
    """Logs a long ffmpeg run's progress (``-progress pipe:1``) every PROGRESS_LOG_SECONDS."""

    def __init__(self, step: str, duration: float) -> None:
        self.step = step
        self.duration = duration
        self.started = time.monotonic()
        self.last = self.started

    def __call__(self, block: dict[str, str]) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_LOG_SECONDS:
            return
        self.last = now
        try:
            done = int(block.get("out_time_us", "0")) / 1e6
        except ValueError:
            done = 0.0
        log.info(
            "render_progress",
            step=self.step,
            media_seconds=round(done, 2),
            of_seconds=round(self.duration, 2),
            speed=block.get("speed"),
            elapsed_seconds=round(now - self.started, 1),
        )


def _one_scan(summary: MediaSummary) -> bool:
    """Whether one scan of every stream is bounded: the file holds just the video and the
    AAC audio a render uses (an AAC packet is 1,024 samples: a known rate), and their
    packets together stay under ONE_SCAN_MAX_PACKETS (ffprobe's output under its cap)."""
    others = summary.subtitle_streams + summary.attachment_streams + summary.data_streams
    if summary.video_streams != 1 or summary.audio_streams != 1 or others:
        return False
    if summary.audio_codec != "aac" or not summary.audio_sample_rate:
        return False
    per_second = max(summary.frame_rate, summary.real_frame_rate) + summary.audio_sample_rate / 1024
    return summary.duration_seconds * per_second <= ONE_SCAN_MAX_PACKETS


def _packet_args(
    sniff: Sniff | None,
    path: Path,
    *,
    stream: str | None = "v:0",
    first: int | None = None,
    indexed: bool = False,
    max_streams: int | None = None,
) -> list[str]:
    """ffprobe's packets of ``stream`` (None: every stream), ``pts_time,dts_time,pos,flags``
    a line (``indexed``: ``stream_index`` first, for ``keyframes.by_stream``). The source is
    opened under the same stream cap as the verdict's probe (``max_streams``)."""
    source = input_args(sniff or MP4, path, max_streams=max_streams)
    head = ["-read_intervals", f"%+#{first}"] if first else []
    select = ["-select_streams", stream] if stream else []
    fields = ("stream_index," if indexed else "") + "pts_time,dts_time,pos,flags"
    return [*source, *head, *select, "-show_entries", f"packet={fields}", "-of", "csv=p=0"]
