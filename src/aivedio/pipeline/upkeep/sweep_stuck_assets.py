"""The scan for assets with no live job left to move them.

An unpublished asset stuck probing or building, a published asset whose rebuild lost its
jobs, and a published revision whose optional outputs will never finish: each is moved on
through the normal path where one is safe (enqueue the stage again, its PENDING outputs
FAILED, a compare-and-set to FAILED or PROCESSING_FAILED) and otherwise reported and logged
for a person. A moderator's pending review is not stuck.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from aivedio.config.sweeper import SweeperConfig
from aivedio.errors import StaleStateError
from aivedio.logs import get_logger
from aivedio.pipeline.jobs import moderate_spec, probe_spec, publish_spec
from aivedio.pipeline.upkeep.sweep_report import Finding, SweepReport
from aivedio.states import Entity
from aivedio.store import sweep_stuck
from aivedio.store.database import Pool, map_db_errors
from aivedio.store.queue import Enqueued, JobSpec, Queue
from aivedio.store.records import transition
from aivedio.supervision import RowGuard

log = get_logger("aivedio.sweeper")


class StuckAssets:
    """The ``stuck_assets`` scan. It owns re-enqueueing a stuck asset's stage and failing
    what no job will finish (PENDING outputs, the revision, an unpublished asset); it never
    touches objects in the store, never moves a published asset off its current revision,
    and changes states only by compare-and-set."""

    def __init__(
        self,
        cfg: SweeperConfig,
        *,
        pool: Pool,
        queue: Queue,
        rows: RowGuard | None = None,
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.queue = queue
        self.rows = rows or RowGuard()

    async def stuck(self, report: SweepReport, now: datetime) -> None:
        cutoff = now - timedelta(seconds=self.cfg.processing_budget_seconds)
        for row in await sweep_stuck.stuck_assets(self.pool, cutoff):
            with report.isolate(self.rows, "stuck_assets", row["id"]):
                await self._stuck_asset(report, row)
        for row in await sweep_stuck.stuck_enrichment(self.pool, cutoff):
            with report.isolate(self.rows, "stuck_assets", row["id"]):
                await self._stuck_enrichment(report, row)

    async def _stuck_asset(self, report: SweepReport, row: Any) -> None:
        asset_id, tenant_id, status = row["id"], row["tenant_id"], row["status"]
        try:
            if status in ("QUARANTINED", "PROBING"):
                action, detail = await self._stuck_probe(report, asset_id, tenant_id, status)
            else:
                action, detail = await self._stuck_building(report, asset_id, tenant_id, status)
        except StaleStateError:
            action, detail = "skipped", "changed while the sweeper looked"
        log.error(
            "asset_stuck", asset_id=str(asset_id), status=status, action=action, detail=detail
        )
        report.add(
            "stuck_assets",
            Finding(
                subject=str(asset_id), action=action, detail=f"{status} with no live job: {detail}"
            ),
        )

    async def _stuck_enrichment(self, report: SweepReport, row: Any) -> None:
        states = await sweep_stuck.variant_states(self.pool, row["id"], row["revision"])
        pending = [r["variant_type"] for r in states if r["status"] == "PENDING"]
        failed = await self._fail_pending(report, row["id"], row["revision"], pending)
        spec = publish_spec(row["id"], row["revision"], row["tenant_id"], enrich=True)
        await self._enqueue(report, spec)
        report.add(
            "stuck_assets",
            Finding(
                subject=str(row["id"]),
                action=report.act("failed_pending_outputs"),
                detail=f"published revision {row['revision']}: outputs {failed} never finished",
            ),
        )

    async def _enqueue(self, report: SweepReport, spec: JobSpec) -> tuple[bool, Any]:
        """(created, previous job row). A key that was ever used is a no-op in the queue, so
        a dead job's stage cannot be re-enqueued; the caller decides what that means."""
        with map_db_errors(sweep_stuck.ACTION):
            async with self.pool.acquire() as conn:
                previous = await sweep_stuck.job_for_key(conn, spec.idempotency_key)
                if previous is not None or report.dry_run:
                    return previous is None, previous
                done: Enqueued = await self.queue.enqueue_one(conn, spec)
        return done.created, None

    async def _stuck_probe(
        self, report: SweepReport, asset_id: uuid.UUID, tenant_id: int, status: str
    ) -> tuple[str, str]:
        """No probe job: enqueue one. A probe job that ran and ended without moving the asset
        (dead on its last lease, say) cannot be enqueued again: PROCESSING_FAILED, 'stuck'."""
        created, previous = await self._enqueue(report, probe_spec(asset_id, tenant_id))
        if created:
            return report.act("probe_enqueued"), "no probe job had been enqueued"
        detail = f"probe job {previous['job_id']} ended {previous['status']}"
        detail += f" ({previous['error_class']})" if previous["error_class"] else ""
        await self._fail(report, asset_id, status, None, detail)
        return report.act("processing_failed"), detail

    async def _stuck_building(
        self, report: SweepReport, asset_id: uuid.UUID, tenant_id: int, status: str
    ) -> tuple[str, str]:
        """The revision's render jobs are gone: its PENDING outputs become FAILED, then the
        required-set rule of the media stage decides (a FAILED required output fails the
        revision; a complete required set moves on to moderation and publish, and when those
        jobs already ran and ended, the revision fails). For a published asset (a rebuild)
        only the revision fails: the asset keeps serving its current revision."""
        revision = await sweep_stuck.latest_revision(self.pool, asset_id)
        if revision is None or revision["status"] != "BUILDING":
            detail = (
                "no building revision"
                if revision is None
                else (f"revision {revision['revision']} is {revision['status']}")
            )
            await self._fail(report, asset_id, status, None, detail)
            return report.act("processing_failed"), detail
        number = revision["revision"]
        states = {
            r["variant_type"]: r["status"]
            for r in await sweep_stuck.variant_states(self.pool, asset_id, number)
        }
        pending = [name for name, state in states.items() if state == "PENDING"]
        failed = await self._fail_pending(report, asset_id, number, pending)
        states.update(dict.fromkeys(failed, "FAILED"))
        lost = [name for name in revision["required_outputs"] if states.get(name) != "SUCCEEDED"]
        if lost:
            detail = f"revision {number}: required {lost} never finished"
            await self._fail(report, asset_id, status, number, detail)
            return report.act("revision_failed"), detail
        verdict = revision["moderation_verdict"]
        if verdict == "review":  # waiting for a person is not stuck
            return "reported", f"revision {number}: awaiting a moderator's review"
        spec = (
            moderate_spec(asset_id, number, tenant_id)
            if verdict is None
            else publish_spec(asset_id, number, tenant_id)
            if verdict == "allow"
            else None
        )
        created, previous = (False, None) if spec is None else await self._enqueue(report, spec)
        if created and spec is not None:
            outputs = f", outputs {failed} failed" if failed else ""
            return report.act(f"{spec.kind}_enqueued"), f"revision {number}{outputs}"
        detail = f"revision {number}: verdict {verdict}"
        if previous is not None:
            detail += f", {previous['status']} job {previous['job_id']}"
        await self._fail(report, asset_id, status, number, detail)
        return report.act("revision_failed"), detail

    async def _fail_pending(
        self, report: SweepReport, asset_id: uuid.UUID, revision: int, pending: list[str]
    ) -> list[str]:
        if report.dry_run:
            return pending
        failed = await sweep_stuck.fail_pending_variants(
            self.pool, asset_id, revision, {"error": "stuck: no render job left (sweeper)"}
        )
        return sorted(failed)

    async def _fail(
        self,
        report: SweepReport,
        asset_id: uuid.UUID,
        status: str,
        revision: int | None,
        detail: str,
    ) -> None:
        """The revision FAILED; an unpublished asset PROCESSING_FAILED ('stuck'); in one
        transaction, each step a CAS."""
        if report.dry_run:
            return
        values = {"last_error_class": "stuck", "last_error_detail": detail[:1000]}
        with map_db_errors(sweep_stuck.ACTION):
            async with self.pool.acquire() as conn, conn.transaction():
                if revision is not None:
                    await transition(
                        conn,
                        Entity.REVISION,
                        (asset_id, revision),
                        expected="BUILDING",
                        new="FAILED",
                    )
                if status == "QUARANTINED":
                    await transition(
                        conn, Entity.ASSET, (asset_id,), expected=status, new="PROBING"
                    )
                    status = "PROBING"
                if status in ("PROBING", "PROCESSING"):
                    await transition(
                        conn,
                        Entity.ASSET,
                        (asset_id,),
                        expected=status,
                        new="PROCESSING_FAILED",
                        values=values,
                    )
