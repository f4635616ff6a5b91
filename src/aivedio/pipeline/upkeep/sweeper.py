"""The compensation sweeper: the last line, not the main path.

Every stage already cleans up after itself on the paths it can see. The sweeper exists for
the paths nobody sees: a worker killed between writing an object and recording it, a job
that died on its last lease, a URL about to expire with its fetch stuck, an object deleted
from under a published playlist. Each pass runs every scan below and reports what it
found and what it did; ``dry_run`` reports the same findings and changes nothing.

This module is the orchestration: a pass runs the scans in order, one failing scan never
stops the others (whatever it raised), and the pass runs as a periodic job. Inside a scan,
one failing row never stops the scan: each row's work runs under the pass's row guard
(``supervision.RowGuard``), so a row whose work raises is logged (``scan_row_failed``),
counted (``aivedio_scan_row_errors_total{scan}``), listed in the report's ``skipped`` and
passed over. Skipped rows do not make a pass incomplete; a failed scan does. Each pass is
counted by outcome in ``aivedio_sweeps_total``, which an alert reads to say when no sweep
has run for a while. The report is ``sweep_report``; the scans live in modules named for
what they do: ``sweep_scans`` (work left stalled on the fetch side: leases, fetches, URLs
near expiry, watches, uploads), ``sweep_stuck_assets`` (assets with no live job left to
move them), ``integrity`` (the audit of published revisions and their rebuild) and ``gc``
(orphan objects, collected from roots).

Scheduling. ``sweep`` is a control-lane job that runs one pass at a time across the fleet
(a session advisory lock on its own connection). The queue has no "run after" for new jobs,
so each job carries ``not_before`` and is keyed by its time bucket
(``sweep:{interval}:{bucket}``); claimed early, it defers itself until then (the attempt is
refunded). A running job first enqueues the next bucket's job, so the chain survives a pass
that fails, and any number of workers seeding the current bucket at start make one job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio

from aivedio.config.load import Config, DatabaseConfig
from aivedio.config.sweeper import SweeperConfig, validate_sweeper
from aivedio.errors import AivedioError, DeferredError, TransientError
from aivedio.logs import get_logger, redact_text
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline import jobs
from aivedio.pipeline.jobs import JobContext, Registry, sweep_spec
from aivedio.pipeline.upkeep.gc import ROOT_REVISIONS, OrphanCollector
from aivedio.pipeline.upkeep.integrity import (
    INTEGRITY_EVENT,
    IntegrityAudit,
    playlist_uris,
    resolve_uri,
)
from aivedio.pipeline.upkeep.sweep_report import Finding, SweepReport
from aivedio.pipeline.upkeep.sweep_scans import StalledWork
from aivedio.pipeline.upkeep.sweep_stuck_assets import StuckAssets
from aivedio.store.database import Pool, acquired, map_db_errors, open_connection
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Enqueued, Job, Queue
from aivedio.store.sweep_lock import release_sweeper_lock, try_sweeper_lock
from aivedio.supervision import RowGuard, error_class

# The public names; INTEGRITY_EVENT, ROOT_REVISIONS, Finding, SweepReport, playlist_uris and
# resolve_uri are defined by the scan modules and re-exported for the modules importing them here.
__all__ = [
    "INTEGRITY_EVENT",
    "KIND",
    "LANE",
    "ROOT_REVISIONS",
    "Finding",
    "SweepReport",
    "Sweeper",
    "handle",
    "open_sweeper",
    "playlist_uris",
    "register",
    "resolve_uri",
    "seed_periodic_sweep",
    "sweep_spec",
]

log = get_logger("aivedio.sweeper")

KIND = jobs.SWEEP.name
LANE = jobs.SWEEP.lane


def _utcnow() -> datetime:
    return datetime.now(UTC)


# -- the sweeper -----------------------------------------------------------------------------


class Sweeper:
    def __init__(
        self,
        cfg: SweeperConfig,
        *,
        pool: Pool,
        store: ObjectStore,
        queue: Queue,
        database: DatabaseConfig,
        pipeline_version: int,
        clock: Callable[[], datetime] = _utcnow,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.store = store
        self.queue = queue
        self.database = database
        self.pipeline_version = pipeline_version
        self.clock = clock
        self.metrics = metrics
        rows = RowGuard(metrics.supervision if metrics is not None else None)
        self.stalled = StalledWork(cfg, pool=pool, store=store, queue=queue, rows=rows)
        self.stuck = StuckAssets(cfg, pool=pool, queue=queue, rows=rows)
        self.integrity = IntegrityAudit(
            cfg, pool=pool, store=store, queue=queue, pipeline_version=pipeline_version, rows=rows
        )
        self.gc = OrphanCollector(cfg, pool=pool, store=store, rows=rows)
        if metrics is not None:  # every outcome at 0 from the start, so increase() sees a pass
            for outcome in ("swept", "incomplete", "another_sweeper_running"):
                metrics.sweeps.labels(outcome)

    async def sweep(self, *, dry_run: bool) -> SweepReport:
        """One pass of every scan. A real pass runs alone across the fleet; a dry run needs
        no lock (it changes nothing)."""
        report = SweepReport(dry_run=dry_run, started_at=self.clock())
        if dry_run:
            await self._scans(report)
        else:
            async with self._exclusive() as acquired:
                if not acquired:
                    report.outcome = "another_sweeper_running"
                    self._count(report.outcome)
                    return report
                await self._scans(report)
        report.finished_at = self.clock()
        self._count("incomplete" if report.errors else "swept")
        log.info(
            "sweep_done",
            dry_run=dry_run,
            counts=report.counts,
            errors=len(report.errors),
            skipped_rows=report.counts.get("row_errors", 0),
        )
        return report

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.sweeps.labels(outcome).inc()

    async def _scans(self, report: SweepReport) -> None:
        stalled, gc = self.stalled, self.gc
        scans = (
            ("fetching_stale", stalled.fetching),
            ("near_expiry", stalled.near_expiry),
            ("tasks_without_output", stalled.tasks_without_output),
            ("orphaned_watches", stalled.orphaned_watches),
            ("stale_uploads", stalled.stale_uploads),
            ("expired_uploads", stalled.expired_uploads),
            ("expired_idempotency_keys", stalled.expired_idempotency_keys),
            ("stuck_assets", self.stuck.stuck),
            ("integrity", self.integrity.audit),
            ("orphan_objects", gc.collect_assets),
            ("quarantine_orphans", gc.collect_quarantine),
        )
        for name, scan in scans:
            try:
                with map_db_errors(f"sweeping {name}"):
                    await scan(report, self.clock())
            except Exception as exc:
                # One broken scan must not stop the others, whatever it raised: this is the
                # last line. (Its rows are isolated inside it; this is the scan itself.)
                detail = exc.detail if isinstance(exc, AivedioError) else redact_text(str(exc))
                detail = f"{error_class(exc)}: {detail}"[:300]
                report.errors.append(Finding(subject=name, detail=detail, action="failed"))
                log.error(
                    "sweep_scan_failed", scan=name, error_class=error_class(exc), detail=detail
                )

    @asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[bool]:
        """A session advisory lock on a connection of its own: released on exit, or by the
        server when the connection dies with its worker."""
        async with open_connection(self.database) as conn:
            acquired = await try_sweeper_lock(conn)
            try:
                yield acquired
            finally:
                if acquired:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await release_sweeper_lock(conn)

    async def run_job(self, job: Job) -> dict[str, Any]:
        now = self.clock()
        wait = float(job.payload.get("not_before", 0)) - now.timestamp()
        if wait > 0:
            raise DeferredError("the next sweep is not due yet", retry_after_seconds=wait)
        async with acquired(self.pool) as conn:
            following = sweep_spec(now, self.cfg.interval_seconds, following=True)
            with map_db_errors("enqueueing the next sweep"):
                nxt = await self.queue.enqueue_one(conn, following)
        report = await self.sweep(dry_run=False)
        return {
            "outcome": report.outcome,
            "next_job_id": nxt.job_id,
            "counts": report.counts,
            "errors": [e.subject for e in report.errors],
        }


async def seed_periodic_sweep(pool: Pool, queue: Queue, cfg: SweeperConfig) -> Enqueued:
    """The current bucket's sweep job (a no-op when it exists); call at worker start."""
    # The acquire too: a worker starting while PostgreSQL restarts gets a DatabaseError
    # (a clean exit its supervisor restarts), not a raw socket error.
    with map_db_errors("seeding the periodic sweep"):
        async with pool.acquire() as conn:
            return await queue.enqueue_one(
                conn, sweep_spec(_utcnow(), cfg.interval_seconds, following=False)
            )


def sweeper_config_of(config: Config) -> SweeperConfig:
    return config.sweeper


@asynccontextmanager
async def open_sweeper(
    config: Config,
    pool: Pool,
    store: ObjectStore | None = None,
    *,
    sweeper: SweeperConfig | None = None,
    clock: Callable[[], datetime] = _utcnow,
    metrics: WorkerMetrics | None = None,
) -> AsyncIterator[Sweeper]:
    cfg = sweeper or sweeper_config_of(config)
    validate_sweeper(cfg)
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(open_object_store(config.storage))
        queue = Queue(pool, default_start_within_seconds=config.queue.default_start_within_seconds)
        yield Sweeper(
            cfg,
            pool=pool,
            store=store,
            queue=queue,
            database=config.database,
            pipeline_version=config.media.pipeline_version,
            clock=clock,
            metrics=metrics,
        )


async def handle(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    sweeper = ctx.services.get("sweeper")
    if not isinstance(sweeper, Sweeper):
        raise TransientError("this worker has no sweeper configured")
    return await sweeper.run_job(job)


def register(registry: Registry) -> None:
    registry.bind(jobs.SWEEP, handle)
