"""The processes of a media run: the scratch layout, the sandboxed ffmpeg and ffprobe runs
recorded in the run's report (a long ffmpeg run logs its progress, and each run's share of
its timeline goes to the job's ``progress.Meter`` when it has one), and the chunked path's
steps on the same processes. ``MediaRun`` plans and runs the DAG on top of this."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aivedio import progress as job_progress
from aivedio.config.media import MediaConfig
from aivedio.errors import RenderError
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.chunk_steps import ChunkSteps
from aivedio.pipeline.ffmpeg.outputs import OutputRecord, Report
from aivedio.pipeline.ffmpeg.provenance_read import ProvenanceReader
from aivedio.pipeline.ffmpeg.sandbox import RunResult, Sandbox, media_deadline
from aivedio.pipeline.media import av1
from aivedio.pipeline.media.layout import Layout
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.provenance import Provenance
from aivedio.pipeline.media.rider import Rider
from aivedio.pipeline.media.signing import Signing
from aivedio.pipeline.media.sniff import Sniff
from aivedio.pipeline.media.validate import MediaSummary

log = get_logger("aivedio.media")


PROGRESS_LOG_SECONDS = 10.0

OnDone = Callable[[OutputRecord], Awaitable[None]]


class RunProcesses:
    """One source's scratch directory and the processes run over it, each recorded."""

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
        # Rungs whose video a caller put in ``work/`` already (``Layout.rung_video``).
        self.encoded_rungs: set[str] = set()
        # Whether the plan may normalize the audio's loudness (the tenant's switch; the
        # ``[media.loudness] normalize`` one applies as well).
        self.normalize = True
        # Whether the plan gets the AV1 ladder (the tenant's or the pipeline version's:
        # ``av1.wanted``).
        self.av1 = False
        # C2PA: the outputs signed before they are hashed (None: nothing is signed), and the
        # source's provenance, read by ``inspect`` or given by a caller that skips it.
        self.signing: Signing | None = None
        self.source_provenance: Provenance | None = None
        # The reader of the source's manifest store at ``inspect`` (None: not read), and
        # whether the verdict requires the source to have valid provenance.
        self.provenance_reader: ProvenanceReader | None = None
        self.require_provenance = False
        # Outputs that ride along the next encode pass's decode (the fast path's stills
        # and decode check on a transcode: ``Rider``), taken by that pass; ``rider_ran``:
        # the pass that took them succeeded.
        self.rider: Rider | None = None
        self.rider_ran = False

    async def _ffmpeg(
        self, step: str, args: list[str], duration: float, *, encodes_av1: bool = False
    ) -> RunResult:
        """``encodes_av1``: the run encodes AV1 rungs, and gets their wall and CPU time on
        top of the H.264 budget (``av1.deadline_extra_seconds``, ``av1.cpu_extra_seconds``)."""
        assert self.report is not None
        progress = _ProgressLog(step, duration, job_progress.current.get())
        deadline = media_deadline(self.media, duration)
        limits = None
        if encodes_av1:
            deadline += av1.deadline_extra_seconds(self.media, duration)
            base = self.sandbox.limits
            extra = av1.cpu_extra_seconds(self.media, duration)
            limits = dataclasses.replace(base, cpu_seconds=base.cpu_seconds + extra)
        try:
            result = await self.sandbox.run(
                "ffmpeg",
                args,
                cwd=self.layout.work,
                deadline_seconds=deadline,
                on_progress=progress,
                limits=limits,
            )
        finally:
            progress.finish()
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

    @property
    def sniff(self) -> Sniff:
        assert self._sniff is not None, "inspect() or assume_valid() first"
        return self._sniff

    def chunk_steps(self, plan: Plan) -> ChunkSteps:
        """The chunked path's steps, running their processes as this run's."""
        return ChunkSteps(self._ffmpeg, self._ffprobe_csv, self.media, plan, self.layout)


class _ProgressLog:
    """Logs a long ffmpeg run's progress (``-progress pipe:1``) every PROGRESS_LOG_SECONDS,
    and gives each block's share of the timeline to the job's meter (if any)."""

    def __init__(self, step: str, duration: float, meter: job_progress.Meter | None) -> None:
        self.step = step
        self.duration = duration
        self.started = time.monotonic()
        self.last = self.started
        self.meter = meter
        self.token = meter.start() if meter is not None else 0

    def finish(self) -> None:
        if self.meter is not None:
            self.meter.finish(self.token)

    def __call__(self, block: dict[str, str]) -> None:
        if self.meter is not None:
            fraction = job_progress.fraction_of(block, self.duration)
            if fraction is not None:
                self.meter.update(self.token, fraction)
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
