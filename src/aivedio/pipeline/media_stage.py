"""The media stage in the worker: the ``probe`` job and one ``render`` job per output.

``probe`` (one per asset): fetch the quarantined source into a scratch directory, check it
against the checksum recorded at fetch, run the verdict (sniff, probe, validate, decode
check). Invalid media moves the asset to INVALID_MEDIA with its reason codes and the job
ends (never retried). Valid media gets, in one transaction: the media columns, the plan, a
BUILDING revision, one PENDING variant per output and ONE render job, for the first output
(a chunked plan's split and audio jobs too, see ``chunk_stage``), keyed
``render:{asset}:{revision}:{variant_type}:v{pipeline_version}``.

``render``: under a per-revision advisory lock (held on its own connection, so a crashed
worker releases it), its first attempt renders every output still pending in one DAG run
(one decode feeds many outputs). An output that run fails gets a render job of its own with
the same key scheme, and the outputs it puts off under backlog pressure get one together
(the job of the first of them, whose first attempt renders them all); a job retried after a
failure renders its own output alone and gives every other pending output its own job, as
does a job that fails for good or finds its output made. So every pending output always has
a job that will make it, and a healthy revision costs one render job, not one per output.
Each output's files are uploaded under the revision prefix, read back and verified (size
and SHA-256) before its variant becomes SUCCEEDED. An output that exhausts its retries
becomes FAILED: a required one fails the revision (PROCESSING_FAILED); an optional one never
blocks the required set. When every required variant has succeeded the revision's required
set is complete and the publish stage takes over.

Under backlog pressure (``pipeline/upkeep/backlog.py``) a render makes the required set only: the
optional outputs stay PENDING with ``deferred_at`` set, and one render job for them defers
itself (``DeferredError``, attempt refunded, error class ``backlog_deferred``) until the
pressure is gone or they have waited ``defer_max_seconds``, then renders them in one DAG run;
the enrichment path publishes them.

Poison media (seed 002 §11.11.3). Every attempt in which a sandboxed ffmpeg/ffprobe over the
source died of a crash signal is a row in ``media_crashes``, and so is every media job whose
worker died holding its lease (written by the queue's reap). Before a job runs ffmpeg on a
source with ``poison_crash_count`` crashes, and right after the attempt that reaches it, the
asset is quarantined: its PENDING outputs FAILED; a revision still building without its
required set FAILED and an unpublished asset PROCESSING_FAILED with error class
``poison_media`` (a published one keeps serving); the job ends with ``PoisonMediaError``,
which is never retried. The source stays in quarantine storage for inspection.
"""

from __future__ import annotations

import contextlib
import random
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.config.load import Config
from aivedio.errors import (
    AivedioError,
    DeferredError,
    NotFoundError,
    PoisonMediaError,
    RenderError,
    ResourceExhaustedError,
    StaleStateError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline import chunk_stage, jobs, media_objects
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.outputs import MIME, PRIMARY, OutputRecord
from aivedio.pipeline.ffmpeg.sandbox import CRASH_SIGNALS, Sandbox
from aivedio.pipeline.ffmpeg.verdict import verdict_json
from aivedio.pipeline.jobs import JobContext, Registry, moderate_spec
from aivedio.pipeline.media.plan import Plan
from aivedio.pipeline.media.validate import MediaSummary
from aivedio.pipeline.publish import Here, PublishStage, enrich_now_or_later, publish_when_ready
from aivedio.pipeline.upkeep.backlog import DEFERRED_CLASS, BacklogMonitor
from aivedio.pipeline.upkeep.lifecycle import retire_if_cancelled
from aivedio.scheduling import decide_retry
from aivedio.states import Entity
from aivedio.store import (
    asset_variants,
    ledger,
    media_assets,
    media_crashes,
    media_pieces,
    outbox,
    revisions,
)
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectStore, open_object_store
from aivedio.store.queue import Job, JobSpec, Queue
from aivedio.store.records import stale, transition, transition_part
from aivedio.store.session_locks import SessionLocks
from aivedio.store.together import Part, write_together

log = get_logger("aivedio.media")

PROBE_KIND = jobs.PROBE.name
REPROCESS_KIND = jobs.REPROCESS.name
PROBE_VERSION = jobs.PROBE_VERSION
RENDER_KIND = jobs.RENDER.name
LANE = jobs.RENDER.lane
LOCK_BUSY_RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Hooks:
    """What a job of this stage takes from its worker: the shared backlog reading (deferral
    of optional outputs), the worker's metrics and its publish stage. All optional: without
    them nothing is deferred, nothing counted, and a render that opens the last gate
    enqueues the publish instead of publishing in its own job."""

    backlog: BacklogMonitor | None = None
    metrics: WorkerMetrics | None = None
    publisher: PublishStage | None = None

    def here(self, job: Job) -> Here | None:
        return Here(self.publisher, job) if self.publisher is not None else None

    async def deferring(self) -> bool:
        if self.backlog is None:
            return False
        await self.backlog.current()
        return self.backlog.defer_optional


NO_HOOKS = Hooks()


@dataclass
class MediaServices:
    config: Config
    pool: Pool
    queue: Queue
    store: ObjectStore
    sandbox: Sandbox
    locks: SessionLocks


class MediaStage:
    def __init__(self, services: MediaServices) -> None:
        self.s = services

    # -- probe -----------------------------------------------------------------------------

    async def probe(self, job: Job, hooks: Hooks = NO_HOOKS) -> dict[str, Any]:
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        asset = await self._asset(asset_id)
        if asset["status"] not in ("QUARANTINED", "PROBING"):
            return {"outcome": "already_probed", "status": asset["status"]}
        retain_days = self.s.config.moderation.reject_retention_days
        cancelled = asset["task_status"] == "CANCELLED"  # checked again under its lock
        if cancelled and await retire_if_cancelled(self.s.pool, asset_id, retain_days=retain_days):
            return {"outcome": "cancelled", "source_retained": True}
        if asset["status"] == "QUARANTINED":
            async with media_assets.connection(self.s.pool, "starting the probe") as conn:
                # Another delivery of this job may have moved it first: PROBING either way.
                with contextlib.suppress(StaleStateError):
                    await transition(
                        conn, Entity.ASSET, (asset_id,), expected="QUARANTINED", new="PROBING"
                    )
        try:
            await self._refuse_poison(job, asset_id, hooks, known=asset["media_crashes"])
            return await self._probe(job, asset, hooks)
        except DeferredError:
            raise
        except AivedioError as exc:
            # Out of retries (the queue's own rule): the asset must not wait in PROBING.
            if not _will_retry(exc, job):
                with anyio.CancelScope(shield=True):
                    await self._probe_failed(asset_id, exc)
            raise

    async def _probe_failed(self, asset_id: uuid.UUID, exc: AivedioError) -> None:
        async with media_assets.connection(
            self.s.pool, "failing the probe", transaction=True
        ) as conn:
            try:
                await transition(
                    conn,
                    Entity.ASSET,
                    (asset_id,),
                    expected="PROBING",
                    new="PROCESSING_FAILED",
                    values={
                        "last_error_class": exc.error_class,
                        "last_error_detail": exc.detail[:1000],
                    },
                )
            except StaleStateError:
                return
            await self._compensate(conn, asset_id, f"probe_failed:{exc.error_class}")
        log.error(
            "probe_failed",
            asset_id=str(asset_id),
            error_class=exc.error_class,
            detail=exc.detail[:300],
        )

    async def _probe(self, job: Job, asset: asyncpg.Record, hooks: Hooks) -> dict[str, Any]:
        asset_id: uuid.UUID = asset["id"]
        media = self.s.config.media
        with self.s.sandbox.scratch() as root:
            source = root / "source.bin"
            await media_objects.download_source(self.s.store, asset, source)
            run = MediaRun(self.s.sandbox, source, root)
            # A crash in the verdict itself is the verdict (INVALID_MEDIA, decoder_crashed);
            # one in the keyframe scans after it fails the attempt and counts as a crash.
            async with self._watch_crashes(job, asset_id, run, hooks):
                report = await run.run(plan_only=True)
            verdict = verdict_json(report.verdict)
            if not report.verdict.valid:
                return await self._invalid(asset_id, verdict)
            assert report.plan is not None and report.verdict.media is not None
            return await self._start_revision(
                asset, report.verdict.media, report.plan, verdict, job, media.pipeline_version
            )

    async def reprocess(self, job: Job, hooks: Hooks = NO_HOOKS) -> dict[str, Any]:
        """A new revision from the retained source under the current pipeline version; the
        published revision serves until the new one is published. Nothing is re-fetched."""
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        asset = await self._asset(asset_id)
        if asset["status"] not in ("PLAYABLE", "ENRICHED"):
            return {"outcome": "not_published", "status": asset["status"]}
        building = await revisions.building_rebuild(
            self.s.pool, asset_id, asset["current_revision"]
        )
        if building is not None:
            return {"outcome": "already_building", "revision": building}
        await self._refuse_poison(job, asset_id, hooks)
        with self.s.sandbox.scratch() as root:
            source = root / "source.bin"
            await media_objects.download_source(self.s.store, asset, source)
            run = MediaRun(self.s.sandbox, source, root)
            async with self._watch_crashes(job, asset_id, run, hooks):
                report = await run.run(plan_only=True)
            verdict = verdict_json(report.verdict)
            if not report.verdict.valid or report.plan is None:
                log.warning(
                    "reprocess_source_invalid", asset_id=str(asset_id), reasons=verdict["reasons"]
                )
                return {"outcome": "invalid_media", "reasons": verdict["reasons"]}
            assert report.verdict.media is not None
            return await self._start_revision(
                asset,
                report.verdict.media,
                report.plan,
                verdict,
                job,
                self.s.config.media.pipeline_version,
                reprocess=True,
            )

    async def _compensate(self, conn: Any, asset_id: uuid.UUID, reason: str) -> None:
        """The platform failed after the provider succeeded: the ledger's compensation (by
        policy, once per provider task), in the caller's transaction."""
        row = await media_assets.provider_charge(conn, asset_id)
        if row is None:
            return  # an upload: no provider charge to compensate
        await ledger.record_compensation(
            conn,
            cfg=self.s.config.ledger,
            tenant_id=row["tenant_id"],
            provider=row["provider"],
            provider_task_id=row["provider_task_id"],
            reason=reason,
            asset_id=asset_id,
        )

    async def _invalid(self, asset_id: uuid.UUID, verdict: dict[str, Any]) -> dict[str, Any]:
        detail = ", ".join(verdict["reasons"]) + (
            f" ({verdict['detail']})" if verdict.get("detail") else ""
        )
        async with media_assets.connection(
            self.s.pool, "recording invalid media", transaction=True
        ) as conn:
            tenant_id = await media_assets.tenant_of(conn, asset_id)
            await outbox.emit(
                conn,
                "asset.invalid",
                tenant_id=tenant_id,
                aggregate_id=asset_id,
                payload={"asset_id": str(asset_id), "reasons": verdict["reasons"]},
            )
            await transition(
                conn,
                Entity.ASSET,
                (asset_id,),
                expected="PROBING",
                new="INVALID_MEDIA",
                values={
                    "probe": verdict,
                    "last_error_class": "invalid_media",
                    "last_error_detail": detail[:1000],
                },
            )
        log.warning("asset_invalid_media", asset_id=str(asset_id), reasons=verdict["reasons"])
        return {
            "outcome": "invalid_media",
            "reasons": verdict["reasons"],
            "network_isolated": verdict["network_isolated"],
        }

    async def _start_revision(
        self,
        asset: asyncpg.Record,
        summary: MediaSummary,
        plan: Plan,
        verdict: dict[str, Any],
        job: Job,
        pipeline_version: int,
        *,
        reprocess: bool = False,
    ) -> dict[str, Any]:
        asset_id: uuid.UUID = asset["id"]
        tenant_id: int = asset["tenant_id"]
        num, den = _rate_fraction(summary.frame_rate)
        # A new asset's first revision: the number read with the asset (``_asset_row``; the
        # move out of PROBING below makes one run the one). A rebuild reads it now: an
        # enrichment may have taken the next number while its source was probed.
        revision = int(asset["next_revision"])
        if reprocess:
            revision = await revisions.next_number(self.s.pool, asset_id)
        prefix = keys.revision_prefix(tenant_id, asset_id, revision)
        outputs = plan.outputs
        parts: dict[str, Part] = {}
        if reprocess:
            # A published asset keeps serving its current revision until the new one is
            # published; only the probe result is refreshed.
            parts["asset"] = media_assets.refresh_probe_part(asset_id, verdict)
        else:
            parts["asset"] = transition_part(
                Entity.ASSET,
                (asset_id,),
                expected="PROBING",
                new="PROCESSING",
                values={
                    "probe": verdict,
                    "media_type": "video",
                    "duration_us": int(summary.duration_seconds * 1_000_000),
                    "width": summary.display_width,
                    "height": summary.display_height,
                    "video_codec": summary.video_codec,
                    "audio_codec": summary.audio_codec,
                    "frame_rate_num": num,
                    "frame_rate_den": den,
                    "last_error_class": None,
                    "last_error_detail": None,
                },
            )
        # Everything below is written only when the asset's move (``asset``) won: this is one
        # statement, with no transaction to roll back.
        won = revisions.wrote("asset")
        parts["revision"] = revisions.insert_part(
            asset_id,
            revision,
            pipeline_version,
            plan.required,
            plan.optional,
            msgspec.to_builtins(plan),
            asset["delete_version"],
            asset["cancel_version"],
            when=won,
        )
        parts["outputs"] = asset_variants.insert_pending_part(
            asset_id,
            revision,
            outputs,
            [f"{prefix}/{_primary(o, plan)}" for o in outputs],
            [MIME.get(Path(_primary(o, plan)).suffix, "application/octet-stream") for o in outputs],
            when=won,
        )
        specs: list[JobSpec] = []
        by_chunks = chunk_stage.chunk_outputs(plan)
        if by_chunks:
            media = self.s.config.media
            parts["pieces"], chunk_specs = chunk_stage.start(
                asset_id,
                tenant_id,
                revision,
                plan,
                media.process_timeout_seconds,
                media.process_timeout_per_media_second,
                when=won,
            )
            specs += chunk_specs
        # One render job, for the first output the chunk jobs do not make: its first run
        # renders every pending output in one DAG run. An output it fails gets a job of its
        # own then, the outputs it puts off one together (``_spawn``), and a job that finds
        # its output made spawns jobs for the rest (``_spawn_rest``): no output ever waits
        # without a job that will make it.
        lead = [o for o in outputs if o not in by_chunks][:1]
        timeout = _render_timeout(self.s.config, summary)
        specs += [_render_spec(asset_id, tenant_id, revision, o, plan, timeout) for o in lead]
        jobs = self.s.queue.enqueuing(specs, name="jobs", when=won)
        if jobs is not None:
            parts.update(jobs.parts)
        # The asset's move, the revision, its outputs and jobs: one statement.
        async with media_assets.connection(self.s.pool, "starting a revision") as conn:
            got = await write_together(conn, parts, "starting a revision")
        if jobs is not None:
            jobs.made(got)
        if not got["asset"] and reprocess:
            raise StaleStateError(f"asset {asset_id} disappeared")
        if not got["asset"]:
            raise stale(Entity.ASSET, (asset_id,), expected="PROBING", new="PROCESSING")
        log.info(
            "revision_building",
            asset_id=str(asset_id),
            revision=revision,
            mode=plan.mode,
            path=plan.path,
            outputs=plan.outputs,
            job_id=job.id,
        )
        return {
            "outcome": "processing",
            "revision": revision,
            "plan": plan.mode,
            "path": plan.path,
            "network_isolated": verdict["network_isolated"],
        }

    # -- render ----------------------------------------------------------------------------

    async def render(self, job: Job, hooks: Hooks = NO_HOOKS) -> dict[str, Any]:
        asset_id = uuid.UUID(str(job.payload["asset_id"]))
        revision = int(job.payload["revision"])
        variant_type = str(job.payload["variant_type"])
        asset, state = await self._asset_and_revision(asset_id, revision, variant_type)
        if state is None:
            return {"outcome": "no_such_revision"}
        # READY: published with its required set; its optional outputs still render, to be
        # released by an enrichment revision.
        if state["status"] not in ("BUILDING", "READY"):
            return {"outcome": "revision_" + state["status"].lower()}
        if asset is None or _stopped_since(asset, state):
            await self._stop_outputs(asset_id, revision)
            return {"outcome": "asset_deleted_or_cancelled"}
        mine, deferred_at = state["mine_status"], state["mine_deferred_at"]
        if mine != "PENDING":
            # A run that made this output may have died before the rest (a retried lead job
            # lands here): whatever is still pending gets a job of its own, and the revision
            # is looked at again (that run may have died before its check after the run).
            await self._spawn_rest(asset_id, revision, state, variant_type)
            await self._check_revision(asset_id, revision, here=hooks.here(job))
            return {"outcome": "already_" + (mine.lower() if mine else "missing")}
        handled = False
        try:
            deferring = await hooks.deferring()
            if (
                deferring
                and variant_type not in state["required_outputs"]
                and not self._overdue(deferred_at)
            ):
                if deferred_at is None:  # marked once; later looks change nothing
                    await self._defer_outputs(asset_id, revision, [variant_type], hooks)
                raise self._deferred(variant_type, hooks, deferred_at)
            async with self._revision_lock(asset_id, revision) as acquired:
                if not acquired:
                    raise DeferredError(
                        "another render of this revision is running",
                        retry_after_seconds=LOCK_BUSY_RETRY_SECONDS,
                    )
                try:
                    return await self._render_locked(
                        job, asset, revision, variant_type, state, hooks, deferring=deferring
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
        if _will_retry(exc, job):
            return
        with anyio.CancelScope(shield=True):
            await self._mark_failed(asset_id, revision, variant_type, exc.detail)
            await self._spawn_rest(asset_id, revision, state, variant_type)

    async def _render_locked(
        self,
        job: Job,
        asset: asyncpg.Record,
        revision: int,
        variant_type: str,
        state: Mapping[str, Any],
        hooks: Hooks,
        *,
        deferring: bool,
    ) -> dict[str, Any]:
        asset_id: uuid.UUID = asset["id"]
        rows = await asset_variants.pending_with_overdue(
            self.s.pool, asset_id, revision, self.s.config.backlog.defer_max_seconds
        )
        plan = msgspec.convert(state["plan"], Plan)
        by_chunks = set(chunk_stage.chunk_outputs(plan))  # the assembly makes these
        if by_chunks and await media_pieces.split_failed(self.s.pool, asset_id, revision):
            # The source could not be cut: this revision's chunk outputs take the single pass.
            by_chunks = set()
            plan = msgspec.structs.replace(plan, chunking=None)
        pending = [row["variant_type"] for row in rows if row["variant_type"] not in by_chunks]
        if variant_type not in pending:
            await self._spawn_rest(asset_id, revision, state, variant_type)
            return {"outcome": "already_done"}
        await self._refuse_poison(job, asset_id, hooks, known=asset["media_crashes"])
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
            await self._defer_outputs(asset_id, revision, put_off, hooks)
        prefix = keys.revision_prefix(asset["tenant_id"], asset_id, revision)
        with self.s.sandbox.scratch() as root:
            source = root / "source.bin"
            await media_objects.download_source(self.s.store, asset, source)
            done: list[str] = []
            later: list[OutputRecord] = []
            asked: set[str] = set()  # jobs the checks of this run enqueued

            async def record_now(record: OutputRecord) -> None:
                # Upload and verify each output as soon as it is made. Playback (moderation
                # starts on it) and the required set (publish waits for it) are recorded at
                # once and can move the revision on while optional outputs still render; the
                # optional ones are recorded together when the run ends (one statement).
                await media_objects.upload_and_verify(self.s.store, prefix, root / "out", record)
                if record.variant_type != "playback" and record.variant_type not in required:
                    later.append(record)
                elif await media_objects.record_variant(
                    self.s.pool, asset_id, revision, record, prefix
                ):
                    done.append(record.variant_type)
                    if record.variant_type == "playback":
                        # Playback alone opens no gate (moderation reads it: no verdict
                        # exists before it), so it asks for moderation without a look.
                        await self._ask_moderation(asset_id, revision, asset["tenant_id"], asked)
                    else:
                        await self._check_revision(asset_id, revision, asked, hooks.here(job))

            run = MediaRun(self.s.sandbox, source, root, on_done=record_now)
            run.assume_valid(summary)
            if "keyframes" in group and "playback" not in group:
                await media_objects.download(
                    self.s.store, f"{prefix}/playback.mp4", run.layout.playback
                )
            ran = False
            try:
                async with self._watch_crashes(job, asset_id, run, hooks):
                    report = await run.run(wants=group, plan=plan)
                ran = True
            finally:
                # Even when the run fails or is cancelled: what was made and verified counts.
                with anyio.CancelScope(shield=True):
                    try:
                        recorded = await media_objects.record_variants(
                            self.s.pool, asset_id, revision, later, prefix
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
        if hooks.metrics is not None:
            hooks.metrics.media_processed(
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
        await self._check_revision(asset_id, revision, asked, hooks.here(job))
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
            "network_isolated": self.s.sandbox.network_isolated,
        }
        if put_off:
            result["deferred"] = put_off
        return result

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
        async with media_assets.connection(self.s.pool, "enqueuing renders") as conn:
            await self.s.queue.enqueue(
                conn, self.render_specs(asset, revision, plan, summary, outputs)
            )

    def render_specs(
        self,
        asset: asyncpg.Record,
        revision: int,
        plan: Plan,
        summary: MediaSummary,
        outputs: Sequence[str],
    ) -> list[JobSpec]:
        timeout = _render_timeout(self.s.config, summary)
        return [
            _render_spec(asset["id"], asset["tenant_id"], revision, o, plan, timeout)
            for o in outputs
        ]

    async def _spawn_rest(
        self, asset_id: uuid.UUID, revision: int, state: Mapping[str, Any], done_with: str
    ) -> None:
        """This job is finished with its output for good: any other output still pending
        gets its own job (the run that would have made it may never have started)."""
        pending = await asset_variants.pending(self.s.pool, asset_id, revision)
        plan = msgspec.convert(state["plan"], Plan)
        skip = {done_with}
        if not await media_pieces.split_failed(self.s.pool, asset_id, revision):
            skip.update(chunk_stage.chunk_outputs(plan))
        rest = [name for name in pending if name not in skip]
        if rest:
            asset = await self._asset(asset_id)
            summary = msgspec.convert(asset["probe"]["media"], MediaSummary)
            await self._spawn(asset, revision, plan, summary, rest)

    # -- deferral under backlog pressure ---------------------------------------------------

    def _overdue(self, deferred_at: datetime | None) -> bool:
        """Deferred for longer than ``defer_max_seconds``: rendered whatever the pressure."""
        limit = timedelta(seconds=self.s.config.backlog.defer_max_seconds)
        return deferred_at is not None and datetime.now(UTC) - deferred_at > limit

    def _deferred(
        self, variant_type: str, hooks: Hooks, deferred_at: datetime | None = None
    ) -> DeferredError:
        cfg = self.s.config.backlog
        why = hooks.backlog.reading.describe() if hooks.backlog is not None else "pressure"
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
        self, asset_id: uuid.UUID, revision: int, names: Sequence[str], hooks: Hooks
    ) -> None:
        """Mark PENDING outputs deferred (the first time only: that is what is counted)."""
        if not names:
            return
        newly = sorted(await asset_variants.defer(self.s.pool, asset_id, revision, names))
        if not newly:
            return
        if hooks.metrics is not None:
            for name in newly:
                hooks.metrics.outputs_deferred.labels(name).inc()
        log.info(
            "outputs_deferred",
            asset_id=str(asset_id),
            revision=revision,
            outputs=newly,
            reason=hooks.backlog.reading.describe() if hooks.backlog else "",
        )

    # -- poison media ------------------------------------------------------------------------

    @asynccontextmanager
    async def _watch_crashes(
        self, job: Job, asset_id: uuid.UUID, run: MediaRun, hooks: Hooks
    ) -> AsyncIterator[None]:
        """Around one attempt's DAG run: if any of its processes died of a crash signal,
        one ``media_crashes`` row for this attempt, and the poison rule applied (which raises
        PoisonMediaError at the limit, in place of the attempt's own outcome)."""
        try:
            yield
        except AivedioError:
            with anyio.CancelScope(shield=True):
                await self._note_crashes(job, asset_id, run, hooks)
            raise
        await self._note_crashes(job, asset_id, run, hooks)

    async def _note_crashes(
        self, job: Job, asset_id: uuid.UUID, run: MediaRun, hooks: Hooks
    ) -> None:
        processes = run.report.processes if run.report is not None else []
        crashed = [p for p in processes if p.returncode in CRASH_SIGNALS]
        if not crashed:
            return
        detail = "; ".join(
            f"{p.step}: {p.tool} killed by signal {-p.returncode}" for p in crashed[:5]
        )
        await media_crashes.record_decoder_crash(
            self.s.pool, job.id, job.lease_token, asset_id, job.kind, detail[:1000]
        )
        log.error(
            "media_decoder_crashed",
            asset_id=str(asset_id),
            job_id=job.id,
            kind=job.kind,
            detail=detail,
        )
        await self._refuse_poison(job, asset_id, hooks)

    async def _refuse_poison(
        self, job: Job, asset_id: uuid.UUID, hooks: Hooks, *, known: int | None = None
    ) -> None:
        """Raise PoisonMediaError (after quarantining the asset) when the source has crashed
        its media jobs ``poison_crash_count`` times; nothing otherwise. ``known``: the count
        as read with the asset row (``_asset``); below the limit, nothing more is read."""
        limit = self.s.config.backlog.poison_crash_count
        if limit <= 0 or (known is not None and known < limit):
            return
        crashes = await media_crashes.of_asset(self.s.pool, asset_id)
        if len(crashes) < limit:
            return
        listed = ", ".join(f"{c['cause']} in {c['kind']} job {c['job_id']}" for c in crashes[:6])
        detail = (
            f"poison media: the source crashed its media jobs {len(crashes)} times "
            f"({listed}); quarantined, not retried; the source is kept"
        )
        with anyio.CancelScope(shield=True):
            await self._quarantine(asset_id, detail, job, hooks)
        raise PoisonMediaError(detail)

    async def _quarantine(self, asset_id: uuid.UUID, detail: str, job: Job, hooks: Hooks) -> None:
        """No more media work on this source: PENDING outputs FAILED, a building revision
        without its required set FAILED, an unpublished asset PROCESSING_FAILED (unless a
        revision with a complete required set can still be published). Idempotent."""
        values = {
            "last_error_class": PoisonMediaError.error_class,
            "last_error_detail": detail[:1000],
        }
        async with media_assets.connection(
            self.s.pool, "quarantining poison media", transaction=True
        ) as conn:
            asset = await media_assets.lock_state(conn, asset_id)
            if asset is None:
                return
            failed = await asset_variants.fail_asset(conn, asset_id, {"error": detail[:1000]})
            failed_revisions: set[int] = set()
            publishable = False
            for rev in await revisions.building_completeness(conn, asset_id):
                if rev["complete"]:
                    publishable = True
                    continue
                await transition(
                    conn,
                    Entity.REVISION,
                    (asset_id, rev["revision"]),
                    expected="BUILDING",
                    new="FAILED",
                )
                failed_revisions.add(rev["revision"])
            status = asset["status"]
            ended = False
            if status in ("QUARANTINED", "PROBING", "PROCESSING") and not publishable:
                if status == "QUARANTINED":
                    await transition(
                        conn, Entity.ASSET, (asset_id,), expected=status, new="PROBING"
                    )
                    status = "PROBING"
                await transition(
                    conn,
                    Entity.ASSET,
                    (asset_id,),
                    expected=status,
                    new="PROCESSING_FAILED",
                    values=values,
                )
                await self._compensate(conn, asset_id, "poison_media")
                ended = True
            elif asset["last_error_class"] != PoisonMediaError.error_class:
                # Published (or about to be): it keeps serving; the error says why its
                # remaining outputs will not come.
                await media_assets.set_error(
                    conn, asset_id, values["last_error_class"], values["last_error_detail"]
                )
        if not (ended or failed or failed_revisions):
            return
        if hooks.metrics is not None:
            hooks.metrics.poison_quarantined.labels(job.kind).inc()
        log.error(
            "poison_media_quarantined",
            asset_id=str(asset_id),
            job_id=job.id,
            kind=job.kind,
            asset_failed=ended,
            outputs_failed=len(failed),
            revisions_failed=sorted(failed_revisions),
            detail=detail,
        )
        # What is left (a complete required set, a published revision's finished outputs)
        # goes on by the usual rule: moderation and publish, or enrichment.
        for revision in sorted({r["revision"] for r in failed} - failed_revisions):
            await self._check_revision(asset_id, revision)

    async def _stop_outputs(self, asset_id: uuid.UUID, revision: int) -> None:
        """Deleted or cancelled since the revision started: its outputs still PENDING will
        not be made (seed §11.8.2), so they are FAILED, not left pending forever. (A
        published revision's pending outputs keep its whole prefix from garbage collection;
        once none is pending, the files a stopped run uploaded without recording go.)"""
        stopped = await asset_variants.fail_revision(
            self.s.pool,
            asset_id,
            revision,
            {"error": "stopped: the asset was deleted or cancelled"},
        )
        if stopped:
            log.info(
                "outputs_stopped",
                asset_id=str(asset_id),
                revision=revision,
                outputs=sorted(stopped),
            )

    async def _mark_failed(
        self, asset_id: uuid.UUID, revision: int, variant_type: str, detail: str
    ) -> None:
        """This job's own output is out of retries: FAILED, and the revision re-checked."""
        await asset_variants.fail_one(
            self.s.pool, asset_id, revision, variant_type, {"error": detail[:1000]}
        )
        log.error(
            "variant_failed",
            asset_id=str(asset_id),
            revision=revision,
            variant_type=variant_type,
            detail=detail[:300],
        )
        await self._check_revision(asset_id, revision)

    async def _check_revision(
        self,
        asset_id: uuid.UUID,
        revision: int,
        asked: set[str] | None = None,
        here: Here | None = None,
    ) -> None:
        """After an output is recorded or failed: a FAILED required output fails a building
        revision and its asset; a complete required set goes to moderation (then publish);
        a published revision whose outputs are all done goes to enrichment. ``asked``: the
        jobs this run already enqueued (a render checks more than once), not asked again.
        ``here``: the render job that checks, with its worker's publish stage: a publish or
        an enrichment the check calls for runs in it (``publish.Here``)."""
        asked = set() if asked is None else asked
        rows = await revisions.outputs_state(self.s.pool, asset_id, revision)
        if not rows:
            return
        revision_status, tenant_id = rows[0]["revision_status"], rows[0]["tenant_id"]
        required = set(rows[0]["required_outputs"])
        status = {r["variant_type"]: r["status"] for r in rows}
        if revision_status == "READY":
            if all(value != "PENDING" for value in status.values()):
                await enrich_now_or_later(
                    self.s.pool, self.s.queue, asset_id, revision, tenant_id, here
                )
            return
        if revision_status != "BUILDING":
            return
        if any(status.get(name) == "FAILED" for name in required):
            async with media_assets.connection(
                self.s.pool, "failing the revision", transaction=True
            ) as conn:
                try:
                    await transition(
                        conn,
                        Entity.REVISION,
                        (asset_id, revision),
                        expected="BUILDING",
                        new="FAILED",
                    )
                    asset = await media_assets.state(conn, asset_id)
                    # A failed rebuild of a published asset leaves the published revision.
                    if asset is not None and asset["status"] == "PROCESSING":
                        await transition(
                            conn,
                            Entity.ASSET,
                            (asset_id,),
                            expected="PROCESSING",
                            new="PROCESSING_FAILED",
                            values={
                                "last_error_class": "render_failed",
                                "last_error_detail": "a required output failed",
                            },
                        )
                        await self._compensate(conn, asset_id, "processing_failed")
                except StaleStateError:
                    return
            log.error("revision_failed", asset_id=str(asset_id), revision=revision)
            return
        # Moderation looks at the playback output: it starts as soon as that exists, in
        # parallel with the rest of the required set; not again once it has a verdict.
        verdict = rows[0]["moderation_verdict"]
        if status.get("playback") == "SUCCEEDED" and verdict is None:
            await self._ask_moderation(asset_id, revision, tenant_id, asked)
        if verdict == "allow" and all(status.get(name) == "SUCCEEDED" for name in required):
            # Read after our own commit, as moderation reads after its own: whichever
            # finishes last sees both gates open and enqueues the publish (idempotent). A
            # verdict not yet allow here is moderation's to act on once it commits.
            await publish_when_ready(self.s.pool, self.s.queue, asset_id, revision, here)

    async def _ask_moderation(
        self, asset_id: uuid.UUID, revision: int, tenant_id: int, asked: set[str]
    ) -> None:
        """The revision's moderation job, once per run (its key makes it once anyway)."""
        if "moderate" in asked:
            return
        async with media_assets.connection(self.s.pool, "enqueuing the moderation") as conn:
            await self.s.queue.enqueue_one(conn, moderate_spec(asset_id, revision, tenant_id))
        asked.add("moderate")

    async def _stopped(self, asset_id: uuid.UUID, revision: asyncpg.Record) -> bool:
        """Deleted or cancelled since the revision started: no more rendering (seed §11.8.2
        stops optional work at once)."""
        return _stopped_since(await self._asset_row(asset_id), revision)

    # -- database helpers ------------------------------------------------------------------

    async def _asset(self, asset_id: uuid.UUID) -> asyncpg.Record:
        row = await self._asset_row(asset_id)
        if row is None:
            raise NotFoundError(f"asset {asset_id} does not exist")
        return row

    async def _asset_row(self, asset_id: uuid.UUID) -> asyncpg.Record | None:
        """The asset row, with what the media jobs decide on, read with it so that each
        costs no round trip of its own: ``media_crashes`` (how many media jobs its source
        crashed: the poison rule), ``task_status`` (its generation task's provider status,
        None for an upload: a cancel) and ``next_revision`` (the number a new one takes)."""
        return await media_assets.asset_row(self.s.pool, asset_id)

    async def _asset_and_revision(
        self, asset_id: uuid.UUID, revision: int, output: str
    ) -> tuple[asyncpg.Record | None, Mapping[str, Any] | None]:
        """``_asset_row`` and ``_revision`` (with ``output``'s own state) in one round trip:
        the asset, and the revision's row with ``mine_status`` and ``mine_deferred_at``
        (None for a revision that does not exist)."""
        row = await media_assets.asset_and_revision(self.s.pool, asset_id, revision, output)
        if row is None or row["revision_row"] is None:
            return row, None
        # As JSON: the revision's columns read here are JSON-typed (no timestamps).
        state = dict(row["revision_row"])
        state.update(mine_status=row["mine_status"], mine_deferred_at=row["mine_deferred_at"])
        return row, state

    async def _revision(self, asset_id: uuid.UUID, revision: int) -> asyncpg.Record | None:
        """The revision's row (None when there is none)."""
        return await revisions.revision_row(self.s.pool, asset_id, revision)

    @asynccontextmanager
    async def _revision_lock(self, asset_id: uuid.UUID, revision: int) -> AsyncIterator[bool]:
        """A session advisory lock (``SessionLocks``: not a pooled connection, which a long
        render must not pin), released on exit or when the session dies with its worker."""
        key = zlib.crc32(f"render:{asset_id}:{revision}".encode()) - 2**31
        async with self.s.locks.hold(key) as acquired:
            yield acquired


def _will_retry(exc: AivedioError, job: Job) -> bool:
    """The queue's own decision for this failure (scheduling.decide_retry, one rule)."""
    return decide_retry(
        retry_class=exc.retry,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        base_seconds=1.0,
        max_seconds=1.0,
    ).retry


def _render_spec(
    asset_id: uuid.UUID, tenant_id: int, revision: int, output: str, plan: Plan, timeout: float
) -> JobSpec:
    return jobs.render_spec(
        asset_id,
        tenant_id,
        revision,
        output,
        pipeline_version=plan.pipeline_version,
        required=output in plan.required,
        timeout=timeout,
    )


def _primary(output: str, plan: Plan) -> str:
    return PRIMARY[output].format(zoom=plan.waveform_zooms[0])


def _rate_fraction(rate: float) -> tuple[int | None, int | None]:
    if rate <= 0:
        return None, None
    fraction = Fraction(rate).limit_denominator(1001)
    return fraction.numerator, fraction.denominator


def _render_timeout(config: Config, summary: MediaSummary) -> float:
    media = config.media
    per_run = media.process_timeout_seconds + media.process_timeout_per_media_second * max(
        summary.duration_seconds, 0.0
    )
    return per_run * 3 + 120  # the encode pass, the packaging runs and the uploads


@asynccontextmanager
async def open_media_stage(
    config: Config, pool: Pool, queue: Queue, store: ObjectStore | None = None
) -> AsyncIterator[MediaStage]:
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(open_object_store(config.storage))
        sandbox = Sandbox(config.media)
        # Refuse to start (ConfigError) rather than fail assets: ffmpeg, ffprobe and prlimit
        # must be there and, if required, the network namespace must work.
        await sandbox.check()
        locks = SessionLocks(config.database)
        stack.push_async_callback(locks.aclose)
        services = MediaServices(
            config=config, pool=pool, queue=queue, store=store, sandbox=sandbox, locks=locks
        )
        yield MediaStage(services)


async def handle_probe(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _stage(ctx).probe(job, _hooks(ctx))


async def handle_render(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _stage(ctx).render(job, _hooks(ctx))


def _hooks(ctx: JobContext) -> Hooks:
    backlog = ctx.services.get("backlog")
    metrics = ctx.services.get("metrics")
    publisher = ctx.services.get("publish")
    return Hooks(
        backlog=backlog if isinstance(backlog, BacklogMonitor) else None,
        metrics=metrics if isinstance(metrics, WorkerMetrics) else None,
        publisher=publisher if isinstance(publisher, PublishStage) else None,
    )


def _stage(ctx: JobContext) -> MediaStage:
    stage = ctx.services.get("media")
    if not isinstance(stage, MediaStage):
        raise TransientError("this worker has no media stage configured")
    return stage


async def handle_reprocess(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _stage(ctx).reprocess(job, _hooks(ctx))


def _chunks(ctx: JobContext) -> chunk_stage.ChunkStage:
    return chunk_stage.ChunkStage(_stage(ctx), _will_retry)


async def handle_chunk_split(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _chunks(ctx).split(job)


async def handle_chunk_encode(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _chunks(ctx).encode(job, _hooks(ctx).metrics)


async def handle_chunk_assemble(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    return await _chunks(ctx).assemble(job)


def register(registry: Registry) -> None:
    registry.bind(jobs.CHUNK_SPLIT, handle_chunk_split)
    registry.bind(jobs.CHUNK_ENCODE, handle_chunk_encode)
    registry.bind(jobs.CHUNK_ASSEMBLE, handle_chunk_assemble)
    registry.bind(jobs.REPROCESS, handle_reprocess)
    registry.bind(jobs.PROBE, handle_probe)
    registry.bind(jobs.RENDER, handle_render)


def _stopped_since(
    row: asyncpg.Record | None, revision: asyncpg.Record | Mapping[str, Any]
) -> bool:
    """Whether the asset (its row) was deleted or cancelled since the revision started."""
    return (
        row is None
        or row["status"] == "DELETED"
        or (
            row["delete_version"] != revision["delete_version_at_start"]
            or row["cancel_version"] != revision["cancel_version_at_start"]
        )
    )
