"""The sweep report, and the scans for work a dead worker left behind (seed 002 §11.9.6).

Every stage cleans up after itself on the paths it can see; these scans find the ones it
cannot: a job that died holding its lease, a fetch left FETCHING with no job to finish it, a
provider URL about to expire before its output is stored, a task the provider finished with
no output recorded, a multipart upload nobody will complete, and an asset (or a rebuild, or a
published revision's optional outputs) with no live job left to move it. Each repairs through
the normal path where one is safe (reap the lease, enqueue the stage again, a CAS to FAILED)
and otherwise reports and logs for a person.

The report lives here, with the scans that fill it, so that the GC (``gc``) and the integrity
audit (``integrity``) can write to it without importing the orchestrator (``sweeper``), which
imports them.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar

import msgspec

from aivedio.config.sweeper import SweeperConfig
from aivedio.errors import StaleStateError
from aivedio.logs import get_logger
from aivedio.pipeline import poller
from aivedio.pipeline.jobs import moderate_spec, probe_spec, publish_spec
from aivedio.states import Entity
from aivedio.store import sweep_stalled, sweep_stuck
from aivedio.store.database import Pool, map_db_errors
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import Enqueued, JobSpec, Queue
from aivedio.store.records import transition
from aivedio.store.sweep_stalled import REPORT_LIMIT
from aivedio.store.uploads import reap_expired_uploads
from aivedio.supervision import Row, RowGuard, error_class

log = get_logger("aivedio.sweeper")

# Intake records a task and its outputs in one transaction; a PROVIDER_SUCCEEDED task this
# long without any output is an anomaly, not a commit in flight.
TASK_SETTLE_SECONDS = 60.0
_PRESENT = {
    "deleted": "delete",
    "aborted": "abort",
    "requeued": "requeue",
    "buried": "bury",
    "gave_up": "give_up",
}

# -- the report ----------------------------------------------------------------------------


def _owner(key: str) -> str:
    """The id a key belongs to: quarantine/{tenant}/{output or video}/…,
    assets/{tenant}/{asset}/…"""
    parts = key.split("/")
    return parts[2] if len(parts) > 2 else ""


class Finding(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One thing a scan found: what (a key or an id), why, and what the sweep did about it
    (``would_…`` in a dry run; ``reported`` when reporting is all there is to do)."""

    subject: str
    detail: str
    action: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class SweepReport(msgspec.Struct, kw_only=True):
    SCANS: ClassVar[tuple[str, ...]] = (
        "reaped_jobs",
        "fetching_stale",
        "near_expiry",
        "tasks_without_output",
        "orphaned_watches",
        "stale_uploads",
        "expired_uploads",
        "stuck_assets",
        "integrity",
        "orphan_objects",
        "quarantine_orphans",
    )

    outcome: str = "swept"  # or "another_sweeper_running"
    dry_run: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    reaped_jobs: list[Finding] = msgspec.field(default_factory=list)
    fetching_stale: list[Finding] = msgspec.field(default_factory=list)
    near_expiry: list[Finding] = msgspec.field(default_factory=list)
    tasks_without_output: list[Finding] = msgspec.field(default_factory=list)
    orphaned_watches: list[Finding] = msgspec.field(default_factory=list)
    stale_uploads: list[Finding] = msgspec.field(default_factory=list)
    expired_uploads: list[Finding] = msgspec.field(default_factory=list)
    stuck_assets: list[Finding] = msgspec.field(default_factory=list)
    integrity: list[Finding] = msgspec.field(default_factory=list)
    orphan_objects: list[Finding] = msgspec.field(default_factory=list)
    quarantine_orphans: list[Finding] = msgspec.field(default_factory=list)
    # Findings per scan, including those past REPORT_LIMIT; plus listing statistics.
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    errors: list[Finding] = msgspec.field(default_factory=list)
    # Rows a scan skipped because their work raised (``row_errors`` counts them all): the
    # scan went on; the pass is still complete.
    skipped: list[Finding] = msgspec.field(default_factory=list)

    def add(self, scan: str, finding: Finding) -> None:
        self.counts[scan] = self.counts.get(scan, 0) + 1
        found: list[Finding] = getattr(self, scan)
        if len(found) < REPORT_LIMIT:
            found.append(finding)

    def bump(self, stat: str, by: int = 1) -> None:
        self.counts[stat] = self.counts.get(stat, 0) + by

    def isolate(self, rows: RowGuard, scan: str, row_id: object) -> AbstractContextManager[Row]:
        """``rows.row`` for one row of ``scan``: a row whose work raises is skipped, and
        recorded here."""
        return rows.row(scan, row_id, on_skip=self.skip)

    def skip(self, scan: str, row_id: str, exc: Exception) -> None:
        self.bump("row_errors")
        if len(self.skipped) < REPORT_LIMIT:
            detail = f"{error_class(exc)}: {exc}"[:300]
            self.skipped.append(
                Finding(subject=f"{scan} {row_id}", detail=detail, action="skipped")
            )

    def act(self, verb: str) -> str:
        """``verb`` (what was done), or in a dry run what would have been."""
        return f"would_{_PRESENT.get(verb, verb)}" if self.dry_run else verb

    def to_json(self) -> str:
        return msgspec.json.encode(self).decode()

    def text(self) -> str:
        """A few lines for people: each scan's count, then its findings."""
        head = "sweep (dry run)" if self.dry_run else "sweep"
        lines = [f"{head}: {self.outcome}"]
        for scan in self.SCANS:
            found: list[Finding] = getattr(self, scan)
            lines.append(f"  {scan}: {self.counts.get(scan, 0)}")
            lines += [f"    {f.action:<22} {f.subject}  {f.detail}" for f in found]
        stats = {k: v for k, v in self.counts.items() if k not in self.SCANS}
        if stats:
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in sorted(stats.items())))
        lines += [f"  error in {e.subject}: {e.detail}" for e in self.errors]
        lines += [f"  skipped row in {f.subject}: {f.detail}" for f in self.skipped]
        return "\n".join(lines)


# -- the scans -------------------------------------------------------------------------------


class StalledWork:
    """The scans of jobs, fetches, uploads and assets that stopped moving."""

    def __init__(
        self,
        cfg: SweeperConfig,
        *,
        pool: Pool,
        store: ObjectStore,
        queue: Queue,
        rows: RowGuard | None = None,
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.store = store
        self.queue = queue
        self.rows = rows or RowGuard()

    # -- queue and fetch scans ----------------------------------------------------------------

    async def fetching(self, report: SweepReport, now: datetime) -> None:
        stale = await sweep_stalled.stale_fetches(self.pool, now)
        if report.dry_run:
            expired = [
                (r["id"], r["lane"], r["kind"], "queued")
                for r in await sweep_stalled.expired_leases(self.pool, now)
            ]
        else:
            expired = await self.queue.reap()
        outcome = {job_id: result for job_id, _lane, _kind, result in expired}
        for job_id, lane, kind, result in expired:
            with report.isolate(self.rows, "reaped_jobs", job_id):
                verb = "requeued" if result == "queued" else "buried"
                finding = Finding(
                    subject=f"job {job_id}",
                    action=report.act(verb),
                    detail=f"{kind} in {lane}: lease expired",
                )
                report.add("reaped_jobs", finding)
        for row in stale:
            with report.isolate(self.rows, "fetching_stale", row["id"]):
                self._fetching_stale(report, row, outcome)

    def _fetching_stale(self, report: SweepReport, row: Any, outcome: dict[int, str]) -> None:
        job = row["expired_job"]
        if job is None:
            detail, action = "FETCHING with no fetch job left", "reported"
            log.error(
                "fetching_without_job", provider_output_id=str(row["id"]), provider=row["provider"]
            )
        else:
            detail = f"fetch job {job}: lease expired"
            verb = "requeued" if outcome.get(job) == "queued" else "buried"
            action = report.act(verb)
            log.warning("fetching_lease_expired", provider_output_id=str(row["id"]), job_id=job)
        report.add(
            "fetching_stale",
            Finding(
                subject=str(row["id"]),
                detail=detail,
                action=action,
                data={"provider": row["provider"]},
            ),
        )

    async def near_expiry(self, report: SweepReport, now: datetime) -> None:
        horizon = now + timedelta(seconds=self.cfg.expiry_warning_seconds)
        for row in await sweep_stalled.outputs_near_expiry(self.pool, horizon):
            with report.isolate(self.rows, "near_expiry", row["id"]):
                left = (row["source_url_expires_at"] - now).total_seconds()
                log.error(
                    "output_near_expiry",
                    provider_output_id=str(row["id"]),
                    provider=row["provider"],
                    provider_task_id=row["provider_task_id"],
                    fetch_status=row["fetch_status"],
                    seconds_left=round(left),
                )
                detail = f"{row['fetch_status']}, URL {'expired' if left < 0 else 'expires'} "
                detail += f"{abs(round(left))} s {'ago' if left < 0 else 'from now'}"
                report.add(
                    "near_expiry",
                    Finding(
                        subject=str(row["id"]),
                        detail=detail,
                        action="escalated",
                        data={"seconds_left": round(left)},
                    ),
                )

    async def tasks_without_output(self, report: SweepReport, now: datetime) -> None:
        settled = now - timedelta(seconds=TASK_SETTLE_SECONDS)
        for row in await sweep_stalled.tasks_without_output(self.pool, settled):
            with report.isolate(self.rows, "tasks_without_output", row["id"]):
                log.error(
                    "task_without_output",
                    generation_task_id=str(row["id"]),
                    provider=row["provider"],
                    provider_task_id=row["provider_task_id"],
                )
                report.add(
                    "tasks_without_output",
                    Finding(
                        subject=str(row["id"]),
                        action="reported",
                        detail=f"{row['provider']}/{row['provider_task_id']}: PROVIDER_SUCCEEDED, "
                        "no provider output recorded",
                    ),
                )

    async def orphaned_watches(self, report: SweepReport, now: datetime) -> None:
        """A WATCHING task whose poll job died would be watched by nobody, forever: the watch
        gives up, as it does when a provider stays unreachable (registering the task again
        starts a new round with a new poll job)."""
        settled = now - timedelta(seconds=TASK_SETTLE_SECONDS)
        for row in await sweep_stalled.orphaned_watches(self.pool, settled):
            with report.isolate(self.rows, "orphaned_watches", row["generation_task_id"]):
                await self._orphaned_watch(report, row)

    async def _orphaned_watch(self, report: SweepReport, row: Any) -> None:
        task = f"{row['provider']}/{row['provider_task_id']}"
        detail = f"{task}: WATCHING, poll job of round {row['round']} gone"
        if not report.dry_run:
            with map_db_errors("giving up a watch"):
                async with self.pool.acquire() as conn, conn.transaction():
                    await poller.end_watch(
                        conn, row["generation_task_id"], "GAVE_UP", error=("poll_job_dead", detail)
                    )
        log.error(
            "watch_without_poll_job",
            generation_task_id=str(row["generation_task_id"]),
            provider=row["provider"],
            provider_task_id=row["provider_task_id"],
            round=row["round"],
        )
        report.add(
            "orphaned_watches",
            Finding(
                subject=str(row["generation_task_id"]), detail=detail, action=report.act("gave_up")
            ),
        )

    async def stale_uploads(self, report: SweepReport, now: datetime) -> None:
        cutoff = now - timedelta(seconds=self.cfg.multipart_stale_seconds)
        stale = [u for u in await self.store.list_multipart_uploads("") if u.initiated < cutoff]
        # Not ours to abort, whatever the store says its age is (some S3 implementations
        # report a fixed or skewed Initiated time): a client's multipart upload into a live
        # upload session (its own expiry ends it, ``expired_uploads``), and an upload whose
        # output or asset (the key's third segment) still has a live job, which may be
        # writing it right now.
        live = await sweep_stalled.live_upload_owners(
            self.pool, [u.upload_id for u in stale], [_owner(u.key) for u in stale]
        )
        for upload in stale:
            if upload.upload_id in live or _owner(upload.key) in live:
                continue
            with report.isolate(self.rows, "stale_uploads", upload.upload_id):
                if not report.dry_run:
                    await self.store.abort_multipart_upload(upload.key, upload.upload_id)
                age = round((now - upload.initiated).total_seconds())
                finding = Finding(
                    subject=upload.key,
                    action=report.act("aborted"),
                    detail=f"upload {upload.upload_id} started {age} s ago",
                )
                report.add("stale_uploads", finding)

    async def expired_uploads(self, report: SweepReport, now: datetime) -> None:
        """Upload sessions past their expiry: EXPIRED, their bytes and parts removed."""
        for reaped in await reap_expired_uploads(
            self.pool,
            self.store,
            now=now,
            dry_run=report.dry_run,
            rows=self.rows,
            on_skip=report.skip,
        ):
            with report.isolate(self.rows, "expired_uploads", reaped.video_id):
                detail = (
                    f"tenant {reaped.tenant_id}, expired {reaped.expires_at.isoformat()}: "
                    f"{len(reaped.deleted_objects)} objects deleted, "
                    f"{len(reaped.aborted_uploads)} uploads aborted"
                )
                finding = Finding(subject=str(reaped.video_id), action=reaped.action, detail=detail)
                report.add("expired_uploads", finding)

    # -- stuck assets ---------------------------------------------------------------------------

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
