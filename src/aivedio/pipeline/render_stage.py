"""The ``render`` job: one per output, most of them never run.

Under a per-revision advisory lock (held on its own connection, so a crashed worker releases
it), a render's first attempt renders every output still pending in one DAG run (one decode
feeds many outputs). An output that run fails gets a render job of its own with the same key
scheme, and the outputs it puts off under backlog pressure get one together (the job of the
first of them, whose first attempt renders them all); a job retried after a failure renders
its own output alone and gives every other pending output its own job, as does a job that
fails for good or finds its output made. So every pending output always has a job that will
make it, and a healthy revision costs one render job, not one per output. Each output's
files are uploaded under the revision prefix, read back and verified (size and SHA-256)
before its variant becomes SUCCEEDED. An output that exhausts its retries becomes FAILED: a
required one fails the revision (PROCESSING_FAILED); an optional one never blocks the
required set. When every required variant has succeeded the revision's required set is
complete and the publish stage takes over.

Under backlog pressure (``pipeline/upkeep/backlog.py``) a render makes the required set
only: the optional outputs stay PENDING with ``deferred_at`` set, and one render job for
them defers itself (``DeferredError``, attempt refunded, error class ``backlog_deferred``)
until the pressure is gone or they have waited ``defer_max_seconds``, then renders them in
one DAG run; the enrichment path publishes them.
"""

from __future__ import annotations

import random
import shutil
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.errors import (
    AivedioError,
    ChecksumMismatchError,
    DeferredError,
    NotFoundError,
    RenderError,
    ResourceExhaustedError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.pipeline import chunk_pieces, media_objects
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import OutputRecord
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.pipeline.media_poison import PoisonGuard
from aivedio.pipeline.media_seams import NO_SEAMS, WorkerSeams
from aivedio.pipeline.revisions import Revisions, stopped_since, will_retry
from aivedio.pipeline.upkeep.backlog import DEFERRED_CLASS
from aivedio.store import asset_variants, media_assets, media_pieces
from aivedio.store.objects import keys
from aivedio.store.queue import Job

log = get_logger("aivedio.media")


LOCK_BUSY_RETRY_SECONDS = 5.0


class RenderStage:
    """The render job: the outputs of a revision made, uploaded, verified and recorded, and
    a job for every output still pending. It owns the revision lock and the deferral of
    optional outputs; it never probes, never moves the asset out of PROBING and never
    publishes but through the worker's publish stage (``WorkerSeams.here``)."""

    def __init__(self, revisions: Revisions, poison: PoisonGuard) -> None:
        self.revisions = revisions
        self.poison = poison
        self.services = revisions.services

    async def render(self, job: Job, seams: WorkerSeams = NO_SEAMS) -> dict[str, Any]:
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        revision = int(job.payload["revision"])
        variant_type = str(job.payload["variant_type"])
        asset, state = await self.revisions.asset_and_revision(asset_id, revision, variant_type)
        if state is None:
            return {"outcome": "no_such_revision"}
        # READY: published with its required set; its optional outputs still render, to be
        # released by an enrichment revision.
        if state["status"] not in ("BUILDING", "READY"):
            return {"outcome": "revision_" + state["status"].lower()}
        if asset is None or stopped_since(asset, state):
            await self.revisions.stop_outputs(asset_id, revision)
            return {"outcome": "asset_deleted_or_cancelled"}
        mine, deferred_at = state["mine_status"], state["mine_deferred_at"]
        if mine != "PENDING":
            # A run that made this output may have died before the rest (a retried lead job
            # lands here): whatever is still pending gets a job of its own, and the revision
            # is looked at again (that run may have died before its check after the run).
            await self._spawn_rest(asset_id, revision, state, variant_type)
            await self.revisions.check_revision(asset_id, revision, here=seams.here(job))
            return {"outcome": "already_" + (mine.lower() if mine else "missing")}
        handled = False
        try:
            deferring = await seams.deferring()
            if (
                deferring
                and variant_type not in state["required_outputs"]
                and not self._overdue(deferred_at)
            ):
                if deferred_at is None:  # marked once; later looks change nothing
                    # A first attempt renders every pending output: all the optional ones
                    # wait with it (the fast path's revision leads with an optional one).
                    names = [variant_type]
                    if job.attempts <= 1:
                        required = set(state["required_outputs"])
                        pending = await asset_variants.pending(
                            self.services.pool, asset_id, revision
                        )
                        names = [n for n in pending if n not in required] or names
                    await self._defer_outputs(asset_id, revision, names, seams)
                raise self._deferred(variant_type, seams, deferred_at)
            async with self.revision_lock(asset_id, revision) as acquired:
                if not acquired:
                    raise DeferredError(
                        "another render of this revision is running",
                        retry_after_seconds=LOCK_BUSY_RETRY_SECONDS,
                    )
                try:
                    return await self._render_locked(
                        job, asset, revision, variant_type, state, seams, deferring=deferring
                    )
                except DeferredError:
                    raise
                except AivedioError as exc:
                    handled = True  # under the lock, as the run's own failures are
                    await self._give_up_if_last(job, exc, asset_id, revision, variant_type, state)
                    raise
        except DeferredError:
            raise
        except AivedioError as exc:
            # Before the lock or in taking it (the database, the lock session): the last
            # attempt must not leave this output, or those put off with it, without a job.
            if not handled:
                await self._give_up_if_last(job, exc, asset_id, revision, variant_type, state)
            raise

    async def _give_up_if_last(
        self,
        job: Job,
        exc: AivedioError,
        asset_id: uuid.UUID,
        revision: int,
        variant_type: str,
        state: Mapping[str, Any],
    ) -> None:
        """The queue makes the same decision from the same rule; when it will not retry, the
        output is FAILED now rather than PENDING forever, and every other pending output gets
        a job of its own (the outputs put off together wait on one job: this one)."""
        if will_retry(exc, job):
            return
        with anyio.CancelScope(shield=True):
            await self.revisions.mark_failed(asset_id, revision, variant_type, exc.detail)
            await self._spawn_rest(asset_id, revision, state, variant_type)

    async def _render_locked(
        self,
        job: Job,
        asset: asyncpg.Record,
        revision: int,
        variant_type: str,
        state: Mapping[str, Any],
        seams: WorkerSeams,
        *,
        deferring: bool,
    ) -> dict[str, Any]:
        asset_id: uuid.UUID = asset["id"]
        rows = await asset_variants.pending_with_overdue(
            self.services.pool, asset_id, revision, self.services.config.backlog.defer_max_seconds
        )
        plan = msgspec.convert(state["plan"], Plan)
        by_chunks = set(chunk_pieces.chunk_outputs(plan))  # the assembly makes these
        if by_chunks and await media_pieces.split_failed(self.services.pool, asset_id, revision):
            # The source could not be cut: this revision's chunk outputs take the single pass.
            by_chunks = set()
            plan = msgspec.structs.replace(plan, chunking=None)
        pending = [row["variant_type"] for row in rows if row["variant_type"] not in by_chunks]
        if variant_type not in pending:
            await self._spawn_rest(asset_id, revision, state, variant_type)
            return {"outcome": "already_done"}
        await self.poison.refuse_poison(job, asset_id, seams, known=asset["media_crashes"])
        summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
        # First attempt: everything pending in one DAG run. A retry: this output alone, and
        # every other pending output gets a job of its own (idempotent if it has one).
        group = pending if job.attempts <= 1 else [variant_type]
        if job.attempts > 1:
            await self._spawn(
                asset, revision, plan, summary, [n for n in pending if n != variant_type]
            )
        put_off: list[str] = []
        required = set(state["required_outputs"])
        if deferring:
            # Under pressure: the required set only; optional outputs wait for enrichment.
            overdue = {row["variant_type"] for row in rows if row["overdue"]}
            put_off = [
                n for n in group if n not in required and n not in overdue and n != variant_type
            ]
            group = [n for n in group if n not in put_off]
            await self._defer_outputs(asset_id, revision, put_off, seams)
        prefix = keys.revision_prefix(asset["tenant_id"], asset_id, revision)
        with self.services.sandbox.scratch() as root:
            source = root / "source.bin"
            await media_objects.download_source(self.services.store, asset, source)
            done: list[str] = []
            later: list[OutputRecord] = []
            asked: set[str] = set()  # jobs the checks of this run enqueued

            async def record_now(record: OutputRecord) -> None:
                # Upload and verify each output as soon as it is made. Playback (moderation
                # starts on it) and the required set (publish waits for it) are recorded at
                # once and can move the revision on while optional outputs still render; the
                # optional ones are recorded together when the run ends (one statement).
                await media_objects.upload_and_verify(
                    self.services.store, prefix, root / "out", record
                )
                if record.variant_type != "playback" and record.variant_type not in required:
                    later.append(record)
                elif await media_objects.record_variant(
                    self.services.pool, asset_id, revision, record, prefix
                ):
                    done.append(record.variant_type)
                    if record.variant_type == "playback":
                        # Playback alone opens no gate (moderation reads it: no verdict
                        # exists before it), so it asks for moderation without a look.
                        await self.revisions.ask_moderation(
                            asset_id, revision, asset["tenant_id"], asked
                        )
                    else:
                        await self.revisions.check_revision(
                            asset_id, revision, asked, seams.here(job)
                        )

            run = MediaRun(self.services.sandbox, source, root, on_done=record_now)
            self.services.equip(run, asset)
            run.assume_valid(summary)
            if "keyframes" in group and "playback" not in group:
                await media_objects.download(
                    self.services.store, f"{prefix}/playback.mp4", run.layout.playback
                )
            if "hls" in group and "playback" not in group and not plan.top.copy:
                await self._reuse_top_rung(run, plan, asset_id, revision)

            ran = False
            try:
                async with self.poison.watch_crashes(job, asset_id, run, seams):
                    report = await run.run(wants=group, plan=plan)
                ran = True
            finally:
                # Even when the run fails or is cancelled: what was made and verified counts.
                with anyio.CancelScope(shield=True):
                    try:
                        recorded = await media_objects.record_variants(
                            self.services.pool, asset_id, revision, later, prefix
                        )
                    except AivedioError as exc:
                        if ran:
                            raise
                        # The run's own error is the one to report; these are made again.
                        log.warning(
                            "outputs_not_recorded",
                            asset_id=str(asset_id),
                            revision=revision,
                            outputs=[r.variant_type for r in later],
                            error=exc.detail,
                        )
                        recorded = set()
                done += [r.variant_type for r in later if r.variant_type in recorded]
        if seams.metrics is not None:
            seams.metrics.media_processed(
                plan.path,
                plan.mode,
                sum(p.wall_seconds for p in report.processes),
                plan.duration_seconds,
            )
        failed = {n.name: n for n in report.failed()}
        log.info(
            "render_done",
            asset_id=str(asset_id),
            revision=revision,
            group=group,
            done=done,
            failed=sorted(failed),
            deferred=put_off,
            job_id=job.id,
        )
        await self.revisions.check_revision(asset_id, revision, asked, seams.here(job))
        # Each output of this run that failed gets a job (retried alone); the ones put off
        # share one, whose first run renders every pending output together: under a long
        # backlog one job per revision looks at the pressure again, not one per output.
        await self._spawn(
            asset,
            revision,
            plan,
            summary,
            [n for n in [*failed, *put_off[:1]] if n != variant_type],
        )
        if variant_type in failed:
            outcome = failed[variant_type]
            detail = outcome.detail or f"{variant_type} failed"
            if outcome.error_class == ResourceExhaustedError.error_class:
                raise ResourceExhaustedError(detail)
            raise RenderError(detail)
        result: dict[str, Any] = {
            "outcome": "rendered",
            "done": done,
            "failed": sorted(failed),
            "network_isolated": self.services.sandbox.network_isolated,
        }
        if put_off:
            result["deferred"] = put_off
        return result

    async def _reuse_top_rung(
        self, run: MediaRun, plan: Plan, asset_id: uuid.UUID, revision: int
    ) -> None:
        """The playback's video IS the top rung's encode (one x264 pass feeds both): when the
        playback is recorded already (the fast path published it first), the ladder encodes
        the rungs below it and takes that one from it, read back at its recorded size and
        SHA-256. Not recorded, or not readable as recorded: the rung is encoded."""
        row = await asset_variants.made_one(self.services.pool, asset_id, revision, "playback")
        if row is None:
            return
        try:
            await media_objects.download_piece(self.services.store, row, run.layout.playback)
        except (NotFoundError, TransientError, ChecksumMismatchError, OSError) as exc:
            log.warning(
                "playback_not_reused",
                asset_id=str(asset_id),
                revision=revision,
                key=row["object_key"],
                error=str(exc)[:300],
            )
            run.layout.playback.unlink(missing_ok=True)
            return
        run.layout.work.mkdir(parents=True, exist_ok=True)
        await anyio.to_thread.run_sync(
            shutil.copyfile, run.layout.playback, run.layout.rung_video(plan.top)
        )
        run.encoded_rungs.add(plan.top.name)

    async def _spawn(
        self,
        asset: asyncpg.Record,
        revision: int,
        plan: Plan,
        summary: MediaSummary,
        outputs: Sequence[str],
    ) -> None:
        """A render job of its own for each of ``outputs`` (same key as ever: idempotent)."""
        if not outputs:
            return
        async with media_assets.connection(self.services.pool, "enqueuing renders") as conn:
            await self.services.queue.enqueue(
                conn, self.revisions.render_specs(asset, revision, plan, summary, outputs)
            )

    async def _spawn_rest(
        self, asset_id: uuid.UUID, revision: int, state: Mapping[str, Any], done_with: str
    ) -> None:
        """This job is finished with its output for good: any other output still pending
        gets its own job (the run that would have made it may never have started)."""
        pending = await asset_variants.pending(self.services.pool, asset_id, revision)
        plan = msgspec.convert(state["plan"], Plan)
        skip = {done_with}
        if not await media_pieces.split_failed(self.services.pool, asset_id, revision):
            skip.update(chunk_pieces.chunk_outputs(plan))
        rest = [name for name in pending if name not in skip]
        if rest:
            asset = await self.revisions.asset(asset_id)
            summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
            await self._spawn(asset, revision, plan, summary, rest)

    def _overdue(self, deferred_at: datetime | None) -> bool:
        """Deferred for longer than ``defer_max_seconds``: rendered whatever the pressure."""
        limit = timedelta(seconds=self.services.config.backlog.defer_max_seconds)
        return deferred_at is not None and datetime.now(UTC) - deferred_at > limit

    def _deferred(
        self, variant_type: str, seams: WorkerSeams, deferred_at: datetime | None = None
    ) -> DeferredError:
        cfg = self.services.config.backlog
        why = seams.backlog.reading.describe() if seams.backlog is not None else "pressure"
        # Each look waits about as long as the output has already waited (doubling, from
        # defer_seconds), so a long backlog costs a few looks per job, not one a minute;
        # never past defer_max_seconds. Jittered, so a burst's jobs do not look at once.
        waited = (datetime.now(UTC) - deferred_at).total_seconds() if deferred_at else 0.0
        delay = max(cfg.defer_seconds, min(waited, cfg.defer_max_seconds - waited))
        error = DeferredError(
            f"optional output {variant_type} deferred under backlog pressure ({why})",
            retry_after_seconds=delay * (0.5 + random.random() / 2),
        )
        error.error_class = DEFERRED_CLASS
        return error

    async def _defer_outputs(
        self, asset_id: uuid.UUID, revision: int, names: Sequence[str], seams: WorkerSeams
    ) -> None:
        """Mark PENDING outputs deferred (the first time only: that is what is counted)."""
        if not names:
            return
        newly = sorted(await asset_variants.defer(self.services.pool, asset_id, revision, names))
        if not newly:
            return
        if seams.metrics is not None:
            for name in newly:
                seams.metrics.outputs_deferred.labels(name).inc()
        log.info(
            "outputs_deferred",
            asset_id=str(asset_id),
            revision=revision,
            outputs=newly,
            reason=seams.backlog.reading.describe() if seams.backlog else "",
        )

    @asynccontextmanager
    async def revision_lock(self, asset_id: uuid.UUID, revision: int) -> AsyncIterator[bool]:
        """A session advisory lock (``SessionLocks``: not a pooled connection, which a long
        render must not pin), released on exit or when the session dies with its worker."""
        key = zlib.crc32(f"render:{asset_id}:{revision}".encode()) - 2**31
        async with self.services.locks.hold(key) as acquired:
            yield acquired
