"""Poison media: a source that keeps crashing the media jobs over it is quarantined.

Every attempt in which a sandboxed ffmpeg/ffprobe over the source died of a crash signal is
a row in ``media_crashes``, and so is every media job whose worker died holding its lease
(written by the queue's reap). Before a job runs ffmpeg on a source with
``poison_crash_count`` crashes, and right after the attempt that reaches it, the asset is
quarantined: its PENDING outputs FAILED; a revision still building without its required set
FAILED and an unpublished asset PROCESSING_FAILED with error class ``poison_media`` (a
published one keeps serving); the job ends with ``PoisonMediaError``, which is never
retried. The source stays in quarantine storage for inspection.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from aivedio.errors import AivedioError, PoisonMediaError
from aivedio.logs import get_logger
from aivedio.pipeline.ffmpeg.media_run import MediaRun
from aivedio.pipeline.ffmpeg.sandbox import CRASH_SIGNALS
from aivedio.pipeline.media_seams import WorkerSeams
from aivedio.pipeline.revisions import Revisions
from aivedio.states import Entity
from aivedio.store import asset_variants, media_assets, media_crashes, revision_rows
from aivedio.store.queue import Job
from aivedio.store.records import transition

log = get_logger("aivedio.media")


class PoisonGuard:
    """The poison rule around the media jobs' ffmpeg runs: counts the crashes of an attempt
    and quarantines the asset at the limit. It owns the ``media_crashes`` rows; it never
    runs ffmpeg itself and never enqueues a render."""

    def __init__(self, revisions: Revisions) -> None:
        self.revisions = revisions
        self.services = revisions.services

    @asynccontextmanager
    async def watch_crashes(
        self, job: Job, asset_id: uuid.UUID, run: MediaRun, seams: WorkerSeams
    ) -> AsyncIterator[None]:
        """Around one attempt's DAG run: if any of its processes died of a crash signal,
        one ``media_crashes`` row for this attempt, and the poison rule applied (which raises
        PoisonMediaError at the limit, in place of the attempt's own outcome)."""
        try:
            yield
        except AivedioError:
            with anyio.CancelScope(shield=True):
                await self._note_crashes(job, asset_id, run, seams)
            raise
        await self._note_crashes(job, asset_id, run, seams)

    async def _note_crashes(
        self, job: Job, asset_id: uuid.UUID, run: MediaRun, seams: WorkerSeams
    ) -> None:
        processes = run.report.processes if run.report is not None else []
        crashed = [p for p in processes if p.returncode in CRASH_SIGNALS]
        if not crashed:
            return
        detail = "; ".join(
            f"{p.step}: {p.tool} killed by signal {-p.returncode}" for p in crashed[:5]
        )
        await media_crashes.record_decoder_crash(
            self.services.pool, job.id, job.lease_token, asset_id, job.kind, detail[:1000]
        )
        log.error(
            "media_decoder_crashed",
            asset_id=str(asset_id),
            job_id=job.id,
            kind=job.kind,
            detail=detail,
        )
        await self.refuse_poison(job, asset_id, seams)

    async def refuse_poison(
        self, job: Job, asset_id: uuid.UUID, seams: WorkerSeams, *, known: int | None = None
    ) -> None:
        """Raise PoisonMediaError (after quarantining the asset) when the source has crashed
        its media jobs ``poison_crash_count`` times; nothing otherwise. ``known``: the count
        as read with the asset row (``Revisions.asset``); below the limit, nothing more is read."""
        limit = self.services.config.backlog.poison_crash_count
        if limit <= 0 or (known is not None and known < limit):
            return
        crashes = await media_crashes.of_asset(self.services.pool, asset_id)
        if len(crashes) < limit:
            return
        listed = ", ".join(f"{c['cause']} in {c['kind']} job {c['job_id']}" for c in crashes[:6])
        detail = (
            f"poison media: the source crashed its media jobs {len(crashes)} times "
            f"({listed}); quarantined, not retried; the source is kept"
        )
        with anyio.CancelScope(shield=True):
            await self._quarantine(asset_id, detail, job, seams)
        raise PoisonMediaError(detail)

    async def _quarantine(
        self, asset_id: uuid.UUID, detail: str, job: Job, seams: WorkerSeams
    ) -> None:
        """No more media work on this source: PENDING outputs FAILED, a building revision
        without its required set FAILED, an unpublished asset PROCESSING_FAILED (unless a
        revision with a complete required set can still be published). Idempotent."""
        values = {
            "last_error_class": PoisonMediaError.error_class,
            "last_error_detail": detail[:1000],
        }
        async with media_assets.connection(
            self.services.pool, "quarantining poison media", transaction=True
        ) as conn:
            asset = await media_assets.lock_state(conn, asset_id)
            if asset is None:
                return
            failed = await asset_variants.fail_asset(conn, asset_id, {"error": detail[:1000]})
            failed_revisions: set[int] = set()
            publishable = False
            for rev in await revision_rows.building_completeness(conn, asset_id):
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
                await self.revisions.compensate(conn, asset_id, "poison_media")
                ended = True
            elif asset["last_error_class"] != PoisonMediaError.error_class:
                # Published (or about to be): it keeps serving; the error says why its
                # remaining outputs will not come.
                await media_assets.set_error(
                    conn, asset_id, values["last_error_class"], values["last_error_detail"]
                )
        if not (ended or failed or failed_revisions):
            return
        if seams.metrics is not None:
            seams.metrics.poison_quarantined.labels(job.kind).inc()
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
            await self.revisions.check_revision(asset_id, revision)
