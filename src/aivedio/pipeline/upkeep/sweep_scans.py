"""The scans for fetch-side work a dead worker left behind.

Every stage cleans up after itself on the paths it can see; these scans find the ones it
cannot: a job that died holding its lease, a fetch left FETCHING with no job to finish it, a
provider URL about to expire before its output is stored, a task the provider finished with
no output recorded, a watch whose poll job is gone, a multipart upload nobody will complete
and an upload session past its expiry. Each repairs through the normal path where one is
safe (reap the lease, give up the watch, abort the upload) and otherwise reports and logs
for a person. Assets with no live job are ``sweep_stuck_assets``'s.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from aivedio.config.sweeper import SweeperConfig
from aivedio.logs import get_logger
from aivedio.pipeline.upkeep.sweep_report import Finding, SweepReport
from aivedio.store import idempotency_keys, sweep_stalled
from aivedio.store.database import Pool, map_db_errors
from aivedio.store.generation_tasks import end_watch
from aivedio.store.objects.base import ObjectStore
from aivedio.store.queue import Queue
from aivedio.store.uploads import reap_expired_uploads
from aivedio.supervision import RowGuard

log = get_logger("aivedio.sweeper")

# Intake records a task and its outputs in one transaction; a PROVIDER_SUCCEEDED task this
# long without any output is an anomaly, not a commit in flight.
TASK_SETTLE_SECONDS = 60.0


def _owner(key: str) -> str:
    """The id a key belongs to: quarantine/{tenant}/{output or video}/…,
    assets/{tenant}/{asset}/…"""
    parts = key.split("/")
    return parts[2] if len(parts) > 2 else ""


# -- the scans -------------------------------------------------------------------------------


class StalledWork:
    """The scans of jobs, fetches, watches and uploads that stopped moving."""

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
                    await end_watch(
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

    async def expired_idempotency_keys(self, report: SweepReport, now: datetime) -> None:
        """Idempotency keys past their lifetime (``api/idempotency.py``): deleted, a batch a
        pass (one statement: no row of it can fail alone)."""
        if report.dry_run:
            count = await idempotency_keys.count_expired(self.pool, now=now)
        else:
            count = await idempotency_keys.delete_expired(self.pool, now=now)
        if count:
            finding = Finding(
                subject="idempotency_keys",
                action=report.act("deleted"),
                detail=f"{count} keys past their lifetime",
                data={"keys": count},
            )
            report.add("expired_idempotency_keys", finding)
