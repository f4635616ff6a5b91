"""The compensation sweeper (seed 002 §11.9.6, seed 004): the last line, not the main path.

Every stage already cleans up after itself on the paths it can see. The sweeper exists for
the paths nobody sees: a worker killed between writing an object and recording it, a job
that died on its last lease, a URL about to expire with its fetch stuck, an object deleted
from under a published playlist. Each pass runs every scan of §11.9.6 and reports what it
found and what it did; ``dry_run`` reports the same findings and changes nothing.

Garbage collection is the dangerous part, so it works from roots, never from "looks
unused" (seed 004: deleting the temp directory after publishing once deleted final
segments). A key under ``assets/`` survives when any revision of a live asset in status
READY, SUPERSEDED or BUILDING lists it: a variant's ``object_key`` or
``{revision prefix of that key}/{file path}`` for each file in ``extra.files`` (enrichment
revisions list objects under the earlier revision's prefix, which is why the prefix comes
from the key and not from the revision number). SUPERSEDED revisions stay roots: a player
that loaded revision n keeps fetching its segments after n+1 is published, and rolling the
pointer back must find n whole. A BUILDING revision protects its whole prefix (a render
uploads files before it records them), and so does a READY revision whose optional outputs
are still rendering. Everything else is collected only when it is older than
``orphan_grace_seconds``, which covers a writer that finished an object and has not yet
committed its record. A DELETED asset is no root at all: delete closes playback at once and
its objects go after the grace period. Objects of assets the database does not know, and
keys that do not follow the layout, are counted and kept: after a database restore they
are what reconciliation needs. Quarantine sources are roots while their asset lives (a
REJECTED one until ``source_retain_until``) or while their provider output may still be
fetched into them.

The integrity audit samples current READY revisions, HEADs every file of every published
output, and walks HLS playlists down to each init and segment. A failure is logged, sent as
one ``asset.integrity_failed`` outbox event per revision, and, when the source is still
there, rebuilt once into a new revision by the reprocess job, which publishes it atomically.

Scheduling. ``sweep`` is a control-lane job that runs one pass at a time across the fleet
(a session advisory lock on its own connection). The queue has no "run after" for new jobs,
so each job carries ``not_before`` and is keyed by its time bucket
(``sweep:{interval}:{bucket}``); claimed early, it defers itself until then (the attempt is
refunded). A running job first enqueues the next bucket's job, so the chain survives a pass
that fails, and any number of workers seeding the current bucket at start make one job.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import anyio
import msgspec

from aivedio.config import Config, DatabaseConfig
from aivedio.errors import (
    AivedioError,
    DeferredError,
    NotFoundError,
    StaleStateError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.pipeline.media_stage import probe_spec, reprocess_spec
from aivedio.pipeline.moderation import moderate_spec
from aivedio.pipeline.publish import publish_spec
from aivedio.pipeline.registry import JobContext, JobKind, Registry
from aivedio.states import TERMINAL_OUTPUT_STATES, Entity
from aivedio.store import keys, outbox
from aivedio.store.database import Connection, Pool, map_db_errors, open_connection
from aivedio.store.objects import ObjectInfo, ObjectStore, open_object_store
from aivedio.store.queue import Enqueued, Job, JobSpec, Queue
from aivedio.store.records import transition
from aivedio.sweeper_config import SweeperConfig, validate_sweeper

log = get_logger("aivedio.sweeper")

KIND = "sweep"
LANE = "control"
SWEEP_TIMEOUT_SECONDS = 3600.0
SWEEP_MAX_ATTEMPTS = 3
# The alert for a published revision that fails the audit (must be in EVENT_TYPES).
INTEGRITY_EVENT = "asset.integrity_failed"
LOCK_KEY = zlib.crc32(b"aivedio:sweeper") - 2**31
# Intake records a task and its outputs in one transaction; a PROVIDER_SUCCEEDED task this
# long without any output is an anomaly, not a commit in flight.
TASK_SETTLE_SECONDS = 60.0
GC_BATCH = 1000  # listed keys checked against the database per query
REPORT_LIMIT = 500  # findings kept per scan (all are counted)
AUDIT_CONCURRENCY = 8
PLAYLIST_MAX_BYTES = 1024 * 1024
ROOT_REVISIONS = frozenset({"READY", "SUPERSEDED", "BUILDING"})
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_ASSET_KEY = re.compile(rf"assets/[0-9a-f]+/({_UUID})/")
_REVISION_ROOT = re.compile(r"(.*?/rev/[0-9]+)/")
_URI_ATTRIBUTE = re.compile(r'URI="([^"]*)"')
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_PRESENT = {"deleted": "delete", "aborted": "abort", "requeued": "requeue", "buried": "bury"}

# -- queries -------------------------------------------------------------------------------

FETCHING_STALE = f"""
SELECT o.id, o.provider, o.updated_at,
       (SELECT j.id FROM jobs j WHERE j.kind = 'fetch' AND j.status = 'running'
          AND j.lease_until < $1 AND j.payload->>'provider_output_id' = o.id::text
        LIMIT 1) AS expired_job
FROM provider_outputs o
WHERE o.fetch_status = 'FETCHING'
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'fetch'
                  AND j.payload->>'provider_output_id' = o.id::text
                  AND NOT (j.status = 'running' AND j.lease_until < $1))
ORDER BY o.updated_at LIMIT {REPORT_LIMIT}
"""
EXPIRED_LEASES = "SELECT id, kind, lane FROM jobs WHERE status = 'running' AND lease_until < $1"
NEAR_EXPIRY = f"""
SELECT id, provider, provider_task_id, fetch_status, source_url_expires_at
FROM provider_outputs
WHERE fetch_status NOT IN ('STORED', 'OUTPUT_LOST', 'INVALID_RESPONSE')
  AND source_url_expires_at < $1
ORDER BY source_url_expires_at LIMIT {REPORT_LIMIT}
"""
TASKS_WITHOUT_OUTPUT = f"""
SELECT g.id, g.provider, g.provider_task_id, g.updated_at FROM generation_tasks g
WHERE g.provider_status = 'PROVIDER_SUCCEEDED' AND g.updated_at < $1
  AND NOT EXISTS (SELECT 1 FROM provider_outputs o WHERE o.generation_task_id = g.id)
ORDER BY g.updated_at LIMIT {REPORT_LIMIT}
"""
STUCK_ASSETS = f"""
SELECT a.id, a.tenant_id, a.status, a.updated_at FROM assets a
WHERE a.status IN ('QUARANTINED', 'PROBING', 'PROCESSING') AND a.updated_at < $1
  AND a.moderation_status IS DISTINCT FROM 'REVIEW'
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.payload->>'asset_id' = a.id::text)
ORDER BY a.updated_at LIMIT {REPORT_LIMIT}
"""
# Published, and rebuilding (reprocess) into a newer revision whose jobs are all gone.
STUCK_REBUILDS = f"""
SELECT a.id, a.tenant_id, a.status FROM assets a
WHERE a.status IN ('PLAYABLE', 'ENRICHED')
  AND EXISTS (SELECT 1 FROM asset_revisions r WHERE r.asset_id = a.id AND r.status = 'BUILDING'
              AND r.enriches IS NULL AND r.updated_at < $1)
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.payload->>'asset_id' = a.id::text)
LIMIT {REPORT_LIMIT}
"""
# Published, with optional outputs that will never finish (their render jobs are gone).
STUCK_ENRICHMENT = f"""
SELECT a.id, a.tenant_id, r.revision FROM assets a
JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
WHERE a.status = 'PLAYABLE' AND r.status = 'READY' AND r.published_at < $1
  AND EXISTS (SELECT 1 FROM asset_variants v WHERE v.asset_id = r.asset_id
              AND v.revision = r.revision AND v.status = 'PENDING')
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.payload->>'asset_id' = a.id::text)
LIMIT {REPORT_LIMIT}
"""
LATEST_REVISION = """
SELECT revision, status, required_outputs, moderation_verdict FROM asset_revisions
WHERE asset_id = $1 AND enriches IS NULL ORDER BY revision DESC LIMIT 1
"""
VARIANT_STATES = (
    "SELECT variant_type, status FROM asset_variants WHERE asset_id = $1 AND revision = $2"
)
# Variants have no version column; the PENDING guard makes this a CAS (as in media_stage).
FAIL_PENDING_VARIANTS = """
UPDATE asset_variants SET status = 'FAILED', extra = $3
WHERE asset_id = $1 AND revision = $2 AND status = 'PENDING' RETURNING variant_type
"""
JOB_FOR_KEY = """
SELECT k.job_id, coalesce(j.status, h.status) AS status,
       coalesce(j.last_error_class, h.last_error_class) AS error_class
FROM job_keys k LEFT JOIN jobs j ON j.id = k.job_id LEFT JOIN job_history h ON h.id = k.job_id
WHERE k.idempotency_key = $1
"""
AUDIT_SAMPLE = """
(SELECT a.id, a.tenant_id, a.current_revision AS revision, a.source_object_key,
        a.source_size_bytes, r.published_outputs
 FROM assets a JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
 WHERE a.status IN ('PLAYABLE', 'ENRICHED') AND r.status = 'READY' AND a.id >= $1
 ORDER BY a.id LIMIT $2)
UNION ALL
(SELECT a.id, a.tenant_id, a.current_revision, a.source_object_key, a.source_size_bytes,
        r.published_outputs
 FROM assets a JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
 WHERE a.status IN ('PLAYABLE', 'ENRICHED') AND r.status = 'READY' AND a.id < $1
 ORDER BY a.id LIMIT $2)
"""
AUDIT_VARIANTS = """
SELECT v.asset_id, v.variant_type, v.object_key, v.size_bytes, v.checksum, v.extra->'files' AS files
FROM asset_variants v JOIN unnest($1::uuid[], $2::int[]) AS s(asset_id, revision)
  ON v.asset_id = s.asset_id AND v.revision = s.revision
"""
ALERTED = """
SELECT coalesce(payload->>'rebuild_job_id', '') FROM outbox_events
WHERE aggregate_id = $1 AND event_type = $2 AND payload->>'revision' = $3 LIMIT 1
"""
# Every revision and variant of the assets named by a batch of listed keys: the GC roots.
GC_REFERENCES = """
SELECT a.id AS asset_id, a.tenant_id, a.status AS asset_status, r.revision,
       r.status AS revision_status, v.object_key, v.status AS variant_status,
       (SELECT coalesce(array_agg(f->>'path'), '{}') FROM jsonb_array_elements(
          CASE WHEN jsonb_typeof(v.extra->'files') = 'array' THEN v.extra->'files'
          ELSE '[]'::jsonb END) AS f) AS paths
FROM assets a
LEFT JOIN asset_revisions r ON r.asset_id = a.id
LEFT JOIN asset_variants v ON v.asset_id = r.asset_id AND v.revision = r.revision
WHERE a.id = ANY($1::uuid[])
"""
# The quarantine keys of a batch that something still needs: a live asset's source (a
# REJECTED one only until its retention ends), or an output that may still be fetched.
QUARANTINE_REFERENCES = rf"""
WITH c AS (
    SELECT k, CASE WHEN split_part(k, '/', 3) ~ '^{_UUID}$'
                   THEN split_part(k, '/', 3)::uuid END AS output_id
    FROM unnest($1::text[]) AS k
)
SELECT c.k FROM c
WHERE EXISTS (SELECT 1 FROM assets a WHERE a.source_object_key = c.k
              AND (a.source_retain_until > $2
                   OR (a.status <> 'DELETED'
                       AND NOT (a.status = 'REJECTED' AND a.source_retain_until IS NOT NULL))))
   OR EXISTS (SELECT 1 FROM provider_outputs o WHERE o.id = c.output_id
              AND o.fetch_status <> ALL($3::text[]))
   OR EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'fetch'
              AND j.payload->>'provider_output_id' = c.output_id::text)
"""

# -- the report ----------------------------------------------------------------------------


class Finding(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One thing a scan found: what (a key or an id), why, and what the sweep did about it
    (``would_…`` in a dry run; ``reported`` when reporting is all there is to do)."""

    subject: str
    detail: str
    action: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class SweepReport(msgspec.Struct, kw_only=True):
    SCANS: ClassVar[tuple[str, ...]] = (
        "reaped_jobs", "fetching_stale", "near_expiry", "tasks_without_output",
        "stale_uploads", "stuck_assets", "integrity", "orphan_objects", "quarantine_orphans",
    )  # fmt: skip

    outcome: str = "swept"  # or "another_sweeper_running"
    dry_run: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    reaped_jobs: list[Finding] = msgspec.field(default_factory=list)
    fetching_stale: list[Finding] = msgspec.field(default_factory=list)
    near_expiry: list[Finding] = msgspec.field(default_factory=list)
    tasks_without_output: list[Finding] = msgspec.field(default_factory=list)
    stale_uploads: list[Finding] = msgspec.field(default_factory=list)
    stuck_assets: list[Finding] = msgspec.field(default_factory=list)
    integrity: list[Finding] = msgspec.field(default_factory=list)
    orphan_objects: list[Finding] = msgspec.field(default_factory=list)
    quarantine_orphans: list[Finding] = msgspec.field(default_factory=list)
    # Findings per scan, including those past REPORT_LIMIT; plus listing statistics.
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    errors: list[Finding] = msgspec.field(default_factory=list)

    def add(self, scan: str, finding: Finding) -> None:
        self.counts[scan] = self.counts.get(scan, 0) + 1
        found: list[Finding] = getattr(self, scan)
        if len(found) < REPORT_LIMIT:
            found.append(finding)

    def bump(self, stat: str, by: int = 1) -> None:
        self.counts[stat] = self.counts.get(stat, 0) + by

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
        return "\n".join(lines)


# -- pure logic ------------------------------------------------------------------------------


def revision_root(key: str) -> str | None:
    """``assets/t/a/rev/3/hls/x.m4s`` → ``assets/t/a/rev/3``; None off the layout."""
    found = _REVISION_ROOT.match(key)
    return found.group(1) if found else None


def asset_of(key: str) -> str | None:
    found = _ASSET_KEY.match(key)
    return found.group(1) if found else None


@dataclass
class GcRoots:
    """What the database says about the assets of a batch of keys (see the module doc)."""

    keys: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)  # whole revision prefixes, "…/rev/n/"
    known: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    revisions: dict[str, str] = field(default_factory=dict)  # revision prefix → status

    @classmethod
    def from_rows(cls, rows: Iterable[Any]) -> GcRoots:
        roots = cls()
        for row in rows:
            asset = str(row["asset_id"])
            roots.known.add(asset)
            if row["asset_status"] == "DELETED":
                roots.deleted.add(asset)
                continue
            if row["revision"] is None:
                continue
            status = row["revision_status"]
            prefix = keys.revision_prefix(row["tenant_id"], row["asset_id"], row["revision"])
            roots.revisions[prefix] = status
            if status == "BUILDING" or (status == "READY" and row["variant_status"] == "PENDING"):
                roots.prefixes.add(prefix + "/")
            if status in ROOT_REVISIONS and row["object_key"] is not None:
                roots.keys.add(row["object_key"])
                base = revision_root(row["object_key"])
                if base is not None:
                    roots.keys.update(f"{base}/{path}" for path in row["paths"] or () if path)
        return roots

    def verdict(self, key: str) -> str | None:
        """Why ``key`` may be collected, or None when it must be kept."""
        asset = asset_of(key)
        if asset is None or asset not in self.known:
            return None  # off the layout or an asset the database does not know: keep
        if asset in self.deleted:
            return "deleted_asset"
        if key in self.keys or any(key.startswith(p) for p in self.prefixes):
            return None
        root = revision_root(key)
        status = self.revisions.get(root) if root else None
        if status in ("FAILED", "ABANDONED"):
            return f"{status.lower()}_revision"
        return "unreferenced"


def playlist_uris(text: str) -> list[str]:
    """Every URI a playlist references: plain lines and ``URI="…"`` attributes."""
    found: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            found += _URI_ATTRIBUTE.findall(line)
        elif line:
            found.append(line)
    return list(dict.fromkeys(found))


def resolve_uri(playlist_key: str, uri: str) -> str | None:
    """The key a relative URI names, or None when it leaves the playlist's revision."""
    root = revision_root(playlist_key)
    if root is None or _SCHEME.match(uri) or uri.startswith("/"):
        return None
    path = uri.split("#", 1)[0].split("?", 1)[0]
    key = posixpath.normpath(posixpath.join(posixpath.dirname(playlist_key), path))
    return key if key.startswith(root + "/") else None


def sweep_spec(now: datetime, interval_seconds: float, *, following: bool) -> JobSpec:
    """The sweep job of ``now``'s time bucket, or (``following``) of the next one."""
    bucket = math.floor(now.timestamp() / interval_seconds) + (1 if following else 0)
    return JobSpec(
        kind=KIND, lane=LANE, idempotency_key=f"sweep:{interval_seconds:g}:{bucket}",
        payload={"not_before": bucket * interval_seconds},
        timeout_seconds=SWEEP_TIMEOUT_SECONDS, max_attempts=SWEEP_MAX_ATTEMPTS,
    )  # fmt: skip


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _older(info: ObjectInfo, cutoff: datetime) -> bool:
    return info.last_modified is not None and info.last_modified < cutoff


def _files(variant: Any) -> list[tuple[str, int | None, str | None]]:
    """(key, size, sha256) of every file of a variant."""
    base = revision_root(variant["object_key"])
    files = variant["files"] if isinstance(variant["files"], list) else []
    if not files or base is None:
        return [(variant["object_key"], variant["size_bytes"], variant["checksum"] or None)]
    return [(f"{base}/{f['path']}", f.get("size"), f.get("sha256")) for f in files]


# -- the sweeper -----------------------------------------------------------------------------


class Sweeper:
    def __init__(
        self, cfg: SweeperConfig, *, pool: Pool, store: ObjectStore, queue: Queue,
        database: DatabaseConfig, pipeline_version: int,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:  # fmt: skip
        self.cfg = cfg
        self.pool = pool
        self.store = store
        self.queue = queue
        self.database = database
        self.pipeline_version = pipeline_version
        self.clock = clock

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
                    return report
                await self._scans(report)
        report.finished_at = self.clock()
        log.info("sweep_done", dry_run=dry_run, counts=report.counts, errors=len(report.errors))
        return report

    async def _scans(self, report: SweepReport) -> None:
        scans = (
            ("fetching_stale", self._fetching), ("near_expiry", self._near_expiry),
            ("tasks_without_output", self._tasks_without_output),
            ("stale_uploads", self._stale_uploads), ("stuck_assets", self._stuck),
            ("integrity", self._audit), ("orphan_objects", self._collect_assets),
            ("quarantine_orphans", self._collect_quarantine),
        )  # fmt: skip
        for name, scan in scans:
            try:
                with map_db_errors(f"sweeping {name}"):
                    await scan(report, self.clock())
            except AivedioError as exc:
                # One broken scan must not stop the others: this is the last line.
                report.errors.append(Finding(subject=name, detail=exc.detail, action="failed"))
                log.error("sweep_scan_failed", scan=name, error_class=exc.error_class,
                          detail=exc.detail[:300])  # fmt: skip

    def _act(self, report: SweepReport, verb: str) -> str:
        """``verb`` (what was done), or in a dry run what would have been."""
        return f"would_{_PRESENT.get(verb, verb)}" if report.dry_run else verb

    # -- queue and fetch scans ----------------------------------------------------------------

    async def _fetching(self, report: SweepReport, now: datetime) -> None:
        stale = await self.pool.fetch(FETCHING_STALE, now)
        if report.dry_run:
            expired = [(r["id"], r["lane"], r["kind"], "queued") for r in
                       await self.pool.fetch(EXPIRED_LEASES, now)]  # fmt: skip
        else:
            expired = await self.queue.reap()
        outcome = {job_id: result for job_id, _lane, _kind, result in expired}
        for job_id, lane, kind, result in expired:
            verb = "requeued" if result == "queued" else "buried"
            finding = Finding(subject=f"job {job_id}", action=self._act(report, verb),
                              detail=f"{kind} in {lane}: lease expired")  # fmt: skip
            report.add("reaped_jobs", finding)
        for row in stale:
            job = row["expired_job"]
            if job is None:
                detail, action = "FETCHING with no fetch job left", "reported"
                log.error("fetching_without_job", provider_output_id=str(row["id"]),
                          provider=row["provider"])  # fmt: skip
            else:
                detail = f"fetch job {job}: lease expired"
                verb = "requeued" if outcome.get(job) == "queued" else "buried"
                action = self._act(report, verb)
                log.warning("fetching_lease_expired", provider_output_id=str(row["id"]), job_id=job)
            report.add("fetching_stale", Finding(subject=str(row["id"]), detail=detail,
                       action=action, data={"provider": row["provider"]}))  # fmt: skip

    async def _near_expiry(self, report: SweepReport, now: datetime) -> None:
        horizon = now + timedelta(seconds=self.cfg.expiry_warning_seconds)
        for row in await self.pool.fetch(NEAR_EXPIRY, horizon):
            left = (row["source_url_expires_at"] - now).total_seconds()
            log.error("output_near_expiry", provider_output_id=str(row["id"]),
                      provider=row["provider"], provider_task_id=row["provider_task_id"],
                      fetch_status=row["fetch_status"], seconds_left=round(left))  # fmt: skip
            detail = f"{row['fetch_status']}, URL {'expired' if left < 0 else 'expires'} "
            detail += f"{abs(round(left))} s {'ago' if left < 0 else 'from now'}"
            report.add("near_expiry", Finding(subject=str(row["id"]), detail=detail,
                       action="escalated", data={"seconds_left": round(left)}))  # fmt: skip

    async def _tasks_without_output(self, report: SweepReport, now: datetime) -> None:
        settled = now - timedelta(seconds=TASK_SETTLE_SECONDS)
        for row in await self.pool.fetch(TASKS_WITHOUT_OUTPUT, settled):
            log.error("task_without_output", generation_task_id=str(row["id"]),
                      provider=row["provider"],
                      provider_task_id=row["provider_task_id"])  # fmt: skip
            report.add("tasks_without_output", Finding(
                subject=str(row["id"]), action="reported",
                detail=f"{row['provider']}/{row['provider_task_id']}: PROVIDER_SUCCEEDED, "
                       "no provider output recorded",
            ))  # fmt: skip

    async def _stale_uploads(self, report: SweepReport, now: datetime) -> None:
        cutoff = now - timedelta(seconds=self.cfg.multipart_stale_seconds)
        for upload in await self.store.list_multipart_uploads(""):
            if upload.initiated >= cutoff:
                continue
            if not report.dry_run:
                await self.store.abort_multipart_upload(upload.key, upload.upload_id)
            age = round((now - upload.initiated).total_seconds())
            finding = Finding(subject=upload.key, action=self._act(report, "aborted"),
                              detail=f"upload {upload.upload_id} started {age} s ago")  # fmt: skip
            report.add("stale_uploads", finding)

    # -- stuck assets ---------------------------------------------------------------------------

    async def _stuck(self, report: SweepReport, now: datetime) -> None:
        cutoff = now - timedelta(seconds=self.cfg.processing_budget_seconds)
        for row in [*await self.pool.fetch(STUCK_ASSETS, cutoff),
                    *await self.pool.fetch(STUCK_REBUILDS, cutoff)]:  # fmt: skip
            asset_id, tenant_id, status = row["id"], row["tenant_id"], row["status"]
            try:
                if status in ("QUARANTINED", "PROBING"):
                    action, detail = await self._stuck_probe(report, asset_id, tenant_id, status)
                else:
                    action, detail = await self._stuck_building(report, asset_id, tenant_id,
                                                                status)  # fmt: skip
            except StaleStateError:
                action, detail = "skipped", "changed while the sweeper looked"
            log.error("asset_stuck", asset_id=str(asset_id), status=status, action=action,
                      detail=detail)  # fmt: skip
            report.add("stuck_assets", Finding(subject=str(asset_id), action=action,
                       detail=f"{status} with no live job: {detail}"))  # fmt: skip
        for row in await self.pool.fetch(STUCK_ENRICHMENT, cutoff):
            states = await self.pool.fetch(VARIANT_STATES, row["id"], row["revision"])
            pending = [r["variant_type"] for r in states if r["status"] == "PENDING"]
            failed = await self._fail_pending(report, row["id"], row["revision"], pending)
            spec = publish_spec(row["id"], row["revision"], row["tenant_id"], enrich=True)
            await self._enqueue(report, spec)
            report.add("stuck_assets", Finding(
                subject=str(row["id"]), action=self._act(report, "failed_pending_outputs"),
                detail=f"published revision {row['revision']}: outputs {failed} never finished",
            ))  # fmt: skip

    async def _enqueue(self, report: SweepReport, spec: JobSpec) -> tuple[bool, Any]:
        """(created, previous job row). A key that was ever used is a no-op in the queue, so
        a dead job's stage cannot be re-enqueued; the caller decides what that means."""
        async with self.pool.acquire() as conn:
            previous = await conn.fetchrow(JOB_FOR_KEY, spec.idempotency_key)
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
            return self._act(report, "probe_enqueued"), "no probe job had been enqueued"
        detail = f"probe job {previous['job_id']} ended {previous['status']}"
        detail += f" ({previous['error_class']})" if previous["error_class"] else ""
        await self._fail(report, asset_id, status, None, detail)
        return self._act(report, "processing_failed"), detail

    async def _stuck_building(
        self, report: SweepReport, asset_id: uuid.UUID, tenant_id: int, status: str
    ) -> tuple[str, str]:
        """The revision's render jobs are gone: its PENDING outputs become FAILED, then the
        required-set rule of the media stage decides (a FAILED required output fails the
        revision; a complete required set moves on to moderation and publish, and when those
        jobs already ran and ended, the revision fails). For a published asset (a rebuild)
        only the revision fails: the asset keeps serving its current revision."""
        revision = await self.pool.fetchrow(LATEST_REVISION, asset_id)
        if revision is None or revision["status"] != "BUILDING":
            detail = "no building revision" if revision is None else (
                f"revision {revision['revision']} is {revision['status']}")  # fmt: skip
            await self._fail(report, asset_id, status, None, detail)
            return self._act(report, "processing_failed"), detail
        number = revision["revision"]
        states = {r["variant_type"]: r["status"] for r in
                  await self.pool.fetch(VARIANT_STATES, asset_id, number)}  # fmt: skip
        pending = [name for name, state in states.items() if state == "PENDING"]
        failed = await self._fail_pending(report, asset_id, number, pending)
        states.update(dict.fromkeys(failed, "FAILED"))
        lost = [name for name in revision["required_outputs"] if states.get(name) != "SUCCEEDED"]
        if lost:
            detail = f"revision {number}: required {lost} never finished"
            await self._fail(report, asset_id, status, number, detail)
            return self._act(report, "revision_failed"), detail
        verdict = revision["moderation_verdict"]
        if verdict == "review":  # waiting for a person is not stuck
            return "reported", f"revision {number}: awaiting a moderator's review"
        spec = (moderate_spec(asset_id, number, tenant_id) if verdict is None
                else publish_spec(asset_id, number, tenant_id) if verdict == "allow"
                else None)  # fmt: skip
        created, previous = (False, None) if spec is None else await self._enqueue(report, spec)
        if created and spec is not None:
            outputs = f", outputs {failed} failed" if failed else ""
            return self._act(report, f"{spec.kind}_enqueued"), f"revision {number}{outputs}"
        detail = f"revision {number}: verdict {verdict}"
        if previous is not None:
            detail += f", {previous['status']} job {previous['job_id']}"
        await self._fail(report, asset_id, status, number, detail)
        return self._act(report, "revision_failed"), detail

    async def _fail_pending(
        self, report: SweepReport, asset_id: uuid.UUID, revision: int, pending: list[str]
    ) -> list[str]:
        if report.dry_run:
            return pending
        rows = await self.pool.fetch(FAIL_PENDING_VARIANTS, asset_id, revision,
                                     {"error": "stuck: no render job left (sweeper)"})  # fmt: skip
        return sorted(r["variant_type"] for r in rows)

    async def _fail(
        self, report: SweepReport, asset_id: uuid.UUID, status: str, revision: int | None,
        detail: str,
    ) -> None:  # fmt: skip
        """The revision FAILED; an unpublished asset PROCESSING_FAILED ('stuck'); in one
        transaction, each step a CAS."""
        if report.dry_run:
            return
        values = {"last_error_class": "stuck", "last_error_detail": detail[:1000]}
        async with self.pool.acquire() as conn, conn.transaction():
            if revision is not None:
                await transition(conn, Entity.REVISION, (asset_id, revision),
                                 expected="BUILDING", new="FAILED")  # fmt: skip
            if status == "QUARANTINED":
                await transition(conn, Entity.ASSET, (asset_id,), expected=status, new="PROBING")
                status = "PROBING"
            if status in ("PROBING", "PROCESSING"):
                await transition(conn, Entity.ASSET, (asset_id,), expected=status,
                                 new="PROCESSING_FAILED", values=values)  # fmt: skip

    # -- integrity audit ------------------------------------------------------------------------

    async def _audit(self, report: SweepReport, now: datetime) -> None:
        if self.cfg.audit_sample == 0:
            return
        sample = self.cfg.audit_sample
        rows = list(await self.pool.fetch(AUDIT_SAMPLE, uuid.uuid4(), sample))[:sample]
        variants: dict[uuid.UUID, list[Any]] = {}
        for v in await self.pool.fetch(
            AUDIT_VARIANTS, [r["id"] for r in rows], [r["revision"] for r in rows]
        ):
            variants.setdefault(v["asset_id"], []).append(v)
        problems: dict[uuid.UUID, list[dict[str, str]]] = {}
        limiter = anyio.CapacityLimiter(AUDIT_CONCURRENCY)

        async def audit(row: Any) -> None:
            async with limiter:
                found = await self._audit_revision(row, variants.get(row["id"], []))
            if found:
                problems[row["id"]] = found

        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(audit, row)
        report.bump("revisions_audited", len(rows))
        for row in rows:
            if row["id"] in problems:
                await self._integrity_failed(report, row, problems[row["id"]])

    async def _audit_revision(self, row: Any, variants: Sequence[Any]) -> list[dict[str, str]]:
        """Every file of every published output at its recorded size; every HLS playlist
        parsed and every URI in it present. Playlists (read anyway) also match their SHA-256."""
        problems: dict[str, str] = {}
        heads: dict[str, ObjectInfo | None] = {}
        by_type = {v["variant_type"]: v for v in variants}
        for name in sorted(row["published_outputs"] or ()):
            variant = by_type.get(name)
            if variant is None:
                problems[f"{name} (no variant record)"] = "missing"
                continue
            files = _files(variant)
            for key, size, _ in files:
                info = heads[key] = await self.store.head(key)
                if info is None:
                    problems[key] = "missing"
                elif size is not None and info.size != int(size):
                    problems[key] = f"size {info.size}, recorded {size}"
            if variant["object_key"].endswith(".m3u8"):
                digests = {key: sha for key, _, sha in files}
                await self._audit_hls(variant["object_key"], digests, heads, problems)
        return [{"key": key, "problem": problem} for key, problem in problems.items()]

    async def _audit_hls(
        self, master: str, digests: dict[str, str | None], heads: dict[str, ObjectInfo | None],
        problems: dict[str, str],
    ) -> None:  # fmt: skip
        queue, seen = [master], {master}
        while queue:
            playlist = queue.pop(0)
            text = await self._playlist(playlist, digests.get(playlist), problems)
            for uri in playlist_uris(text or ""):
                key = resolve_uri(playlist, uri)
                if key is None:
                    problems[f"{playlist} -> {uri}"] = "uri outside the revision"
                    continue
                if key in seen:
                    continue
                seen.add(key)
                if key.endswith(".m3u8"):
                    queue.append(key)
                    continue
                if key not in heads:
                    heads[key] = await self.store.head(key)
                if heads[key] is None:  # a file list that lost it already said "missing"
                    problems.setdefault(key, f"missing (named by {posixpath.basename(playlist)})")

    async def _playlist(self, key: str, sha256: str | None, problems: dict[str, str]) -> str | None:
        try:
            data = await self.store.get_bytes(key, max_bytes=PLAYLIST_MAX_BYTES)
        except NotFoundError:
            problems[key] = "missing"
            return None
        except AivedioError as exc:
            problems[key] = f"unreadable: {exc.error_class}"
            return None
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            problems[key] = "sha256 differs from the recorded one"
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            problems[key] = "not UTF-8 text"
            return None

    async def _integrity_failed(
        self, report: SweepReport, row: Any, problems: list[dict[str, str]]
    ) -> None:
        """Alert once per revision, and rebuild once with it when the source is there."""
        asset_id, revision = row["id"], row["revision"]
        log.error("integrity_failed", asset_id=str(asset_id), revision=revision,
                  problems=problems[:20], count=len(problems))  # fmt: skip
        data: dict[str, Any] = {"revision": revision, "problems": problems[:50]}
        source = (
            await self.store.head(row["source_object_key"]) if row["source_object_key"] else None
        )
        source_ok = source is not None and source.size == row["source_size_bytes"]
        rebuild = self.cfg.rebuild_on_integrity_failure and source_ok
        async with self.pool.acquire() as conn, conn.transaction():
            current = await conn.fetchval(
                "SELECT current_revision FROM assets WHERE id = $1 FOR UPDATE", asset_id
            )
            if current != revision:
                action = "skipped_superseded"
            elif (previous := await conn.fetchval(ALERTED, asset_id, INTEGRITY_EVENT,
                                                  str(revision))) is not None:  # fmt: skip
                action, data["rebuild_job_id"] = "already_alerted", previous
            elif report.dry_run:
                action = "would_alert" + ("_and_rebuild" if rebuild else "")
            else:
                action = "alerted" + ("_and_rebuild" if rebuild else "")
                job_id = None
                if rebuild:
                    spec = reprocess_spec(asset_id, row["tenant_id"], self.pipeline_version)
                    job_id = (await self.queue.enqueue_one(conn, spec)).job_id
                    data["rebuild_job_id"] = job_id
                await self._alert(conn, row, problems, job_id, source_ok)
        detail = f"revision {revision}: {len(problems)} problem(s)"
        detail += "" if source_ok else "; the source is missing, no rebuild"
        report.add("integrity", Finding(subject=str(asset_id), detail=detail, action=action,
                                        data=data))  # fmt: skip

    async def _alert(
        self, conn: Connection, row: Any, problems: list[dict[str, str]], job_id: int | None,
        source_ok: bool,
    ) -> None:  # fmt: skip
        await outbox.emit(
            conn, INTEGRITY_EVENT, tenant_id=row["tenant_id"], aggregate_id=row["id"],
            payload={"asset_id": str(row["id"]), "revision": row["revision"],
                     "problems": problems[:50], "source_present": source_ok,
                     "rebuild_job_id": str(job_id) if job_id is not None else None},
        )  # fmt: skip

    # -- garbage collection ---------------------------------------------------------------------

    async def _collect_assets(self, report: SweepReport, now: datetime) -> None:
        await self._collect(report, now, "assets/", "orphan_objects", self._asset_verdicts)

    async def _collect_quarantine(self, report: SweepReport, now: datetime) -> None:
        await self._collect(report, now, "quarantine/", "quarantine_orphans",
                            self._quarantine_verdicts)  # fmt: skip

    async def _collect(
        self, report: SweepReport, now: datetime, prefix: str, scan: str,
        verdicts: Callable[[SweepReport, list[str], datetime], Any],
    ) -> None:  # fmt: skip
        """List ``prefix``; objects past the grace period are checked against the database
        in batches (one query each) and deleted when nothing references them."""
        cutoff = now - timedelta(seconds=self.cfg.orphan_grace_seconds)
        batch: list[ObjectInfo] = []

        async def flush() -> None:
            found: dict[str, str | None] = await verdicts(report, [i.key for i in batch], now)
            for info in batch:
                reason = found.get(info.key)
                if reason is None:
                    continue
                if not report.dry_run:
                    await self.store.delete(info.key)
                age = round((now - info.last_modified).total_seconds()) if info.last_modified else 0
                report.add(scan, Finding(subject=info.key, detail=reason,
                           action=self._act(report, "deleted"),
                           data={"age_seconds": age, "size": info.size}))  # fmt: skip
            batch.clear()

        async for info in self.store.list(prefix):
            report.bump(f"{scan}_listed")
            if not _older(info, cutoff):
                report.bump(f"{scan}_in_grace")
                continue
            batch.append(info)
            if len(batch) >= GC_BATCH:
                await flush()
        if batch:
            await flush()

    async def _asset_verdicts(
        self, report: SweepReport, names: list[str], _now: datetime
    ) -> dict[str, str | None]:
        assets = sorted({a for a in map(asset_of, names) if a is not None})
        roots = GcRoots.from_rows(await self.pool.fetch(GC_REFERENCES, assets))
        # Kept, and counted: after a database restore these are what reconciliation needs.
        report.bump("orphan_objects_unattributed", sum(
            1 for name in names if asset_of(name) not in roots.known))  # fmt: skip
        return {name: roots.verdict(name) for name in names}

    async def _quarantine_verdicts(
        self, _report: SweepReport, names: list[str], now: datetime
    ) -> dict[str, str | None]:
        rows = await self.pool.fetch(QUARANTINE_REFERENCES, names, now,
                                     sorted(TERMINAL_OUTPUT_STATES))  # fmt: skip
        kept = {r["k"] for r in rows}
        return {name: None if name in kept else "no_database_record" for name in names}

    # -- exclusivity and the periodic job ---------------------------------------------------------

    @asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[bool]:
        """A session advisory lock on a connection of its own: released on exit, or by the
        server when the connection dies with its worker."""
        async with open_connection(self.database) as conn:
            with map_db_errors("taking the sweeper lock"):
                acquired = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY))
            try:
                yield acquired
            finally:
                if acquired:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)

    async def run_job(self, job: Job) -> dict[str, Any]:
        now = self.clock()
        wait = float(job.payload.get("not_before", 0)) - now.timestamp()
        if wait > 0:
            raise DeferredError("the next sweep is not due yet", retry_after_seconds=wait)
        async with self.pool.acquire() as conn:
            following = sweep_spec(now, self.cfg.interval_seconds, following=True)
            with map_db_errors("enqueueing the next sweep"):
                nxt = await self.queue.enqueue_one(conn, following)
        report = await self.sweep(dry_run=False)
        return {"outcome": report.outcome, "next_job_id": nxt.job_id, "counts": report.counts,
                "errors": [e.subject for e in report.errors]}  # fmt: skip


async def seed_periodic_sweep(pool: Pool, queue: Queue, cfg: SweeperConfig) -> Enqueued:
    """The current bucket's sweep job (a no-op when it exists); call at worker start."""
    async with pool.acquire() as conn:
        with map_db_errors("seeding the periodic sweep"):
            return await queue.enqueue_one(
                conn, sweep_spec(_utcnow(), cfg.interval_seconds, following=False)
            )


def sweeper_config_of(config: Config) -> SweeperConfig:
    return config.sweeper


@asynccontextmanager
async def open_sweeper(
    config: Config, pool: Pool, store: ObjectStore | None = None, *,
    sweeper: SweeperConfig | None = None, clock: Callable[[], datetime] = _utcnow,
) -> AsyncIterator[Sweeper]:  # fmt: skip
    cfg = sweeper or sweeper_config_of(config)
    validate_sweeper(cfg)
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(open_object_store(config.storage))
        queue = Queue(pool, default_start_within_seconds=config.queue.default_start_within_seconds)
        yield Sweeper(cfg, pool=pool, store=store, queue=queue, database=config.database,
                      pipeline_version=config.media.pipeline_version, clock=clock)  # fmt: skip


async def handle(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    sweeper = ctx.services.get("sweeper")
    if not isinstance(sweeper, Sweeper):
        raise TransientError("this worker has no sweeper configured")
    return await sweeper.run_job(job)


def register(registry: Registry) -> None:
    registry.register(JobKind(KIND, LANE, handle, timeout_seconds=SWEEP_TIMEOUT_SECONDS,
                              max_attempts=SWEEP_MAX_ATTEMPTS))  # fmt: skip
