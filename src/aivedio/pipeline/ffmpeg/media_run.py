"""The media DAG on one machine: inspect, plan, render, package, finalize, verify.

Nodes are outputs (``playback``, ``poster``, ``hls``, ``proxy``, ``sprite``, ``waveform``,
``keyframes``). Where it pays, one ffmpeg decode feeds several nodes (``render.encode_args``);
if such a shared pass fails, the required nodes are retried together without the optional
ones, then each optional node alone, so a failed optional node never blocks the required
set and a failed node is retried alone.

Every node's files are verified (exist, non-empty, the right magic, faststart where it
matters) and hashed before the node counts as done; the records and the checks live in
``outputs``. ``aivedio process`` runs this directly; the worker's media stage runs it inside
a job and uploads what it made.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import anyio

from aivedio.config.media import ToleranceConfig
from aivedio.errors import (
    AivedioError,
    DatabaseError,
    InvalidMediaError,
    RenderError,
    ResourceExhaustedError,
)
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.finalize import Finalizing
from aivedio.pipeline.ffmpeg.outputs import NodeOutcome, Report
from aivedio.pipeline.ffmpeg.sandbox import RunResult
from aivedio.pipeline.ffmpeg.verdict import Verdict, checked_verdict, inspect_file
from aivedio.pipeline.media.chunks import CHUNK_OUTPUTS
from aivedio.pipeline.media.ffmpeg_args import (
    EncodeJob,
    encode_args,
    encode_job,
    measure_args,
    merge_runs,
    package_args,
    poster_seek_args,
)
from aivedio.pipeline.media.loudness import MEASURED, Loudness, parse_measurement
from aivedio.pipeline.media.plan import Plan, make_plan
from aivedio.pipeline.media.sniff import Sniff, sniff_file
from aivedio.pipeline.media.validate import Declared, MediaSummary

log = get_logger("aivedio.media")


class MediaRun(Finalizing):
    """One source through the DAG in a scratch directory. Not reusable.

    The planning and running of the DAG is here; the processes (``RunProcesses``), the
    packet scans (``PacketScans``) and the finalizing of each node (``Finalizing``) are its
    bases."""

    # -- entry points ----------------------------------------------------------------------

    def normalizes_audio(self, summary: MediaSummary) -> bool:
        """Whether this run's plan may normalize the source's audio (the tenant's switch,
        ``[media.loudness] normalize``, and an audio track to normalize): such a plan is
        made with the audio's loudness measured first."""
        loudness = self.media.loudness
        return self.normalize and loudness.normalize and summary.audio_stream_index is not None

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
        self,
        *,
        declared: Declared | None = None,
        tolerance: ToleranceConfig | None = None,
        decode: bool = True,
    ) -> Report:
        """The verdict; ``decode=False`` defers its decode check (``check_decode``)."""
        started = time.monotonic()
        runs: list[RunResult] = []
        verdict, _ = await inspect_file(
            self.sandbox,
            self.source,
            declared=declared,
            tolerance=tolerance,
            record=runs,
            decode=decode,
            provenance=self.provenance_reader,
            require_provenance=self.require_provenance,
        )
        self.report = Report(verdict=verdict, origin=started)
        if verdict.provenance is not None:
            self.source_provenance = verdict.provenance
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
        decode: bool = True,
        measure: bool = True,
    ) -> Report:
        """Inspect (unless already done), plan, and produce ``wants`` (default: all).
        ``plan_only``: stop after the plan (the probe job), a plan good for every output.
        ``decode=False``: the inspection's decode check is deferred (``check_decode``).
        ``measure``: a plan that may normalize the audio is made with its loudness (an
        audio-only pass); False: the caller measures it in a pass of its own (the fast
        path's frames pass) and replans (``plan.with_loudness``)."""
        started = time.monotonic()
        wants = None if wants is None else list(wants)
        inspected_before = self.report is not None
        report = self.report or await self.inspect(
            declared=declared, tolerance=tolerance, decode=decode
        )
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
            measured = (
                await self._measure_loudness(summary)
                if measure and self.normalizes_audio(summary)
                else None
            )
            plan = make_plan(
                summary,
                self.media,
                source_keyframes=source_keys,
                stream_start=start,
                video_packets=packets,
                source_earliest=earliest,
                measured=measured,
                normalize=self.normalize,
                av1=self.av1,
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

    async def run_checked(
        self,
        *,
        wants: Iterable[str] | None = None,
        declared: Declared | None = None,
        tolerance: ToleranceConfig | None = None,
    ) -> Report:
        """``run`` with the decode check beside the outputs instead of before them: the
        verdict without it, then the check and the DAG at once. A failed check cancels the
        DAG and the report's verdict is invalid (what was made is not to be used)."""
        started = time.monotonic()
        report = await self.inspect(declared=declared, tolerance=tolerance, decode=False)
        if not report.verdict.valid:
            report.wall_seconds = time.monotonic() - started
            return report
        async with anyio.create_task_group() as group:

            async def produce() -> None:
                await self.run(wants=wants)

            group.start_soon(produce)
            verdict = await self.check_decode()
            if not verdict.valid:
                group.cancel_scope.cancel()
        if not report.verdict.valid:
            report.outputs.clear()  # made from media that does not decode: never used
        report.wall_seconds = time.monotonic() - started
        return report

    async def check_decode(self) -> Verdict:
        """Run the decode check ``inspect(decode=False)`` deferred; the report's verdict
        becomes the checked one (invalid if the check failed)."""
        assert self.report is not None and self._sniff is not None
        runs: list[RunResult] = []
        started = time.monotonic()
        self.layout.make_dirs(wants=())  # the process's cwd
        try:
            self.report.verdict = await checked_verdict(
                self.sandbox,
                self.report.verdict,
                self._sniff,
                self.source,
                cwd=self.layout.work,
                record=runs,
            )
        finally:
            for run in runs:
                self.report.record(f"inspect:{run.tool}", run)
            self.report.steps["decode_check"] = time.monotonic() - started
        return self.report.verdict

    async def _measure_loudness(self, summary: MediaSummary) -> Loudness | None:
        """The source audio's loudness by an audio-only pass (``measure_args``); None when
        the pass fails (the audio is then published as it is: a measurement is never a
        reason to fail a source whose decode check passed). Running out of time or memory
        raises, as any process does."""
        assert self._sniff is not None and summary.audio_stream_index is not None
        started = time.monotonic()
        measured = self.layout.work / MEASURED
        args = measure_args(
            summary.audio_stream_index, self.media, self._sniff, self.source, measured
        )
        try:
            await self._ffmpeg("loudness", args, summary.duration_seconds)
            text = await anyio.Path(measured).read_text("utf-8", "replace")
        except (RenderError, OSError) as exc:
            log.warning("loudness_not_measured", detail=str(exc)[:300])
            return None
        finally:
            if self.report is not None:
                self.report.steps["loudness"] = time.monotonic() - started
        return parse_measurement(text)

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

    async def adopt(self, node: str, made: Path, plan: Plan) -> Report:
        """``node`` made by another pass over this very source (the fast path's pass over
        the source takes a remux's poster while it decodes it): moved to its place in the
        layout, then finalized and verified as if this run had made it. When that pass did
        not write it, the node is made here as usual."""
        assert self.report is not None and self._summary is not None
        places = {"poster": self.layout.poster}
        if node not in places:
            raise ValueError(f"no other pass makes {node!r}")
        self.layout.make_dirs(plan, {node})
        if not await anyio.Path(made).is_file():
            return await self.run(wants=[node], plan=plan)
        await anyio.Path(made).replace(places[node])
        if self.report.wanted is not None:
            self.report.wanted.add(node)
        try:
            await self._finalize_nodes([node], plan, self._summary, 0.0)
        except (RenderError, ResourceExhaustedError, InvalidMediaError, OSError) as exc:
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
        job = encode_job(plan, wants, has_audio=has_audio, encoded=self.encoded_rungs)
        if encoded:
            job = EncodeJob(
                rungs=(), proxy=False, poster=False, sprite=False, pcm=False, audio=False
            )
        if not job.empty:
            # A rider goes with the first pass that decodes the video, and only with it.
            rider, self.rider = (self.rider, None) if job.rungs else (None, self.rider)
            args = encode_args(
                plan,
                job,
                self.media,
                self._sniff,
                self.source,
                self.layout,
                audio_channels=summary.audio_channels,
                audio_rate=summary.audio_sample_rate,
                rider=rider,
            )
            encodes_av1 = any(rung.codec == "av1" for rung in job.rungs)
            await self._ffmpeg(
                f"encode[{','.join(sorted(wants))}]",
                args,
                plan.duration_seconds,
                encodes_av1=encodes_av1,
            )
            self.rider_ran = self.rider_ran or rider is not None
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
        await self._finalize_nodes(nodes, plan, summary, time.monotonic() - started)

    async def _finalize_nodes(
        self, nodes: list[str], plan: Plan, summary: MediaSummary, shared: float
    ) -> None:
        """Finalize and verify each node whose files are in the layout, and hand it to
        ``on_done``; ``shared``: the seconds of the processes that made them."""
        assert self.report is not None
        for node in nodes:
            node_started = time.monotonic()
            record = await self._finalize(node, plan, summary)
            if self.on_done is not None:
                try:
                    await self.on_done(record)
                except DatabaseError:
                    raise  # the database is down, not the output: the job retries
                except AivedioError as exc:
                    self._fail(node, exc)
                    continue
            self.report.outputs[node] = record
            self.report.nodes[node] = NodeOutcome(
                name=node,
                status="done",
                seconds=round(shared / len(nodes) + time.monotonic() - node_started, 4),
            )
