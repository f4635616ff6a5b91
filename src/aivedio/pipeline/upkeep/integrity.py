"""The integrity audit of published revisions, and their rebuild when one is no longer whole.

An object can vanish from under a published playlist (a lost write, an operator, a bucket
policy, a GC bug) and nothing in the pipeline would notice: the player finds out first. So
each pass samples current READY revisions, HEADs every file of every published output, and
walks HLS playlists down to each init and segment. A failure is logged, sent as one
``asset.integrity_failed`` outbox event per revision, and, when the source is still there,
rebuilt once into a new revision by the reprocess job, which publishes it atomically.
A store that cannot answer (a transient or throttled request) says nothing about a revision:
its audit is counted inconclusive and left to the next pass, never alerted or rebuilt. A
revision whose audit raises anything else is skipped alone (``scan_row_failed``): the
others are audited.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import anyio

from aivedio.config.sweeper import SweeperConfig
from aivedio.errors import AivedioError, NotFoundError, Retry
from aivedio.logs import get_logger
from aivedio.pipeline.jobs import reprocess_spec
from aivedio.pipeline.upkeep.sweep_report import Finding, SweepReport
from aivedio.store import outbox
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.integrity_audit import (
    alerted_rebuild,
    audit_sample,
    audit_variants,
    lock_current_revision,
)
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.keys import recorded_files
from aivedio.store.queue import Queue
from aivedio.supervision import RowGuard

log = get_logger("aivedio.sweeper")

# The alert for a published revision that fails the audit (must be in EVENT_TYPES).
INTEGRITY_EVENT = "asset.integrity_failed"
AUDIT_CONCURRENCY = 8
PLAYLIST_MAX_BYTES = 1024 * 1024
_URI_ATTRIBUTE = re.compile(r'URI="([^"]*)"')
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

# -- playlists (pure) -----------------------------------------------------------------------


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
    root = keys.revision_root(playlist_key)
    if root is None or _SCHEME.match(uri) or uri.startswith("/"):
        return None
    path = uri.split("#", 1)[0].split("?", 1)[0]
    key = posixpath.normpath(posixpath.join(posixpath.dirname(playlist_key), path))
    return key if key.startswith(root + "/") else None


# -- the audit -------------------------------------------------------------------------------


def _no_verdict(exc: AivedioError) -> bool:
    """A store or database that could not answer (an outage, throttling: the retryable
    class): it says nothing about the objects asked for."""
    return exc.retry is Retry.BACKOFF


def _inconclusive(report: SweepReport, row: Any, exc: AivedioError) -> bool:
    """Whether ``exc`` cut a revision's audit short without a verdict (``_no_verdict``).
    Such a revision is counted and logged, and the next pass audits it again; any other
    error is the caller's to raise."""
    if not _no_verdict(exc):
        return False
    log.warning(
        "integrity_audit_inconclusive",
        asset_id=str(row["id"]),
        revision=row["revision"],
        error_class=exc.error_class,
        detail=exc.detail,
    )
    report.bump("revisions_inconclusive")
    return True


class IntegrityAudit:
    """Audits a sample of published revisions; alerts and rebuilds the ones found broken."""

    def __init__(
        self,
        cfg: SweeperConfig,
        *,
        pool: Pool,
        store: ObjectStore,
        queue: Queue,
        pipeline_version: int,
        rows: RowGuard | None = None,
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.store = store
        self.queue = queue
        self.pipeline_version = pipeline_version
        self.rows = rows or RowGuard()

    async def audit(self, report: SweepReport, now: datetime) -> None:
        if self.cfg.audit_sample == 0:
            return
        sample = self.cfg.audit_sample
        rows = (await audit_sample(self.pool, uuid.uuid4(), sample))[:sample]
        variants: dict[uuid.UUID, list[Any]] = {}
        for v in await audit_variants(
            self.pool, [r["id"] for r in rows], [r["revision"] for r in rows]
        ):
            variants.setdefault(v["asset_id"], []).append(v)
        problems: dict[uuid.UUID, list[dict[str, str]]] = {}
        limiter = anyio.CapacityLimiter(AUDIT_CONCURRENCY)

        async def audit(row: Any) -> None:
            async with limiter:
                with report.isolate(self.rows, "integrity", row["id"]):
                    try:
                        found = await self._audit_revision(row, variants.get(row["id"], []))
                    except AivedioError as exc:
                        if not _inconclusive(report, row, exc):
                            raise
                        return
                    if found:
                        problems[row["id"]] = found

        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(audit, row)
        report.bump("revisions_audited", len(rows))
        for row in rows:
            if row["id"] not in problems:
                continue
            with report.isolate(self.rows, "integrity", row["id"]):
                try:
                    await self._integrity_failed(report, row, problems[row["id"]])
                except AivedioError as exc:  # the next pass decides again (finds a committed alert)
                    if not _inconclusive(report, row, exc):
                        raise

    async def _audit_revision(self, row: Any, variants: Sequence[Any]) -> list[dict[str, str]]:
        """Every file of every published output at its recorded size; every HLS playlist
        parsed and every URI in it present. Playlists (read anyway) also match their SHA-256."""
        problems: dict[str, str] = {}
        by_type = {v["variant_type"]: v for v in variants}
        outputs: list[tuple[Any, list[tuple[str, Any, str | None]]]] = []
        for name in sorted(row["published_outputs"] or ()):
            variant = by_type.get(name)
            if variant is None:
                problems[f"{name} (no variant record)"] = "missing"
                continue
            record = (variant["object_key"], variant["size_bytes"], variant["checksum"])
            outputs.append((variant, recorded_files(*record, variant["files"])))
        # Every recorded file of the revision in one store call (one request a file on S3,
        # one thread call for all of them on the local store).
        found = await self.store.sizes([key for _, files in outputs for key, _, _ in files])
        for variant, files in outputs:
            for key, size, _ in files:
                stored = found[key]
                if stored is None:
                    problems[key] = "missing"
                elif size is not None and stored != int(size):
                    problems[key] = f"size {stored}, recorded {size}"
            if variant["object_key"].endswith(".m3u8"):
                digests = {key: sha for key, _, sha in files}
                await self._audit_hls(variant["object_key"], digests, found, problems)
        return [{"key": key, "problem": problem} for key, problem in problems.items()]

    async def _audit_hls(
        self,
        master: str,
        digests: dict[str, str | None],
        found: dict[str, int | None],
        problems: dict[str, str],
    ) -> None:
        """Every playlist reachable from ``master`` read, every URI in it present (the
        files the records did not list looked up a playlist at a time)."""
        queue, seen = [master], {master}
        while queue:
            playlist = queue.pop(0)
            text = await self._playlist(playlist, digests.get(playlist), problems)
            named: list[str] = []
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
                named.append(key)
            unknown = [key for key in named if key not in found]
            if unknown:
                found.update(await self.store.sizes(unknown))
            for key in named:
                if found[key] is None:  # a file list that lost it already said "missing"
                    problems.setdefault(key, f"missing (named by {posixpath.basename(playlist)})")

    async def _playlist(self, key: str, sha256: str | None, problems: dict[str, str]) -> str | None:
        try:
            data = await self.store.get_bytes(key, max_bytes=PLAYLIST_MAX_BYTES)
        except NotFoundError:
            problems[key] = "missing"
            return None
        except AivedioError as exc:
            if _no_verdict(exc):
                raise  # the revision's audit is inconclusive, not this object broken
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
        data: dict[str, Any] = {"revision": revision, "problems": problems[:50]}
        source = (
            await self.store.head(row["source_object_key"]) if row["source_object_key"] else None
        )
        log.error(
            "integrity_failed",
            asset_id=str(asset_id),
            revision=revision,
            problems=problems[:20],
            count=len(problems),
        )
        source_ok = source is not None and source.size == row["source_size_bytes"]
        rebuild = self.cfg.rebuild_on_integrity_failure and source_ok
        with map_db_errors("recording an integrity failure"):
            async with self.pool.acquire() as conn, conn.transaction():
                current = await lock_current_revision(conn, asset_id)
                if current != revision:
                    action = "skipped_superseded"
                elif (
                    previous := await alerted_rebuild(conn, asset_id, INTEGRITY_EVENT, revision)
                ) is not None:
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
        report.add(
            "integrity", Finding(subject=str(asset_id), detail=detail, action=action, data=data)
        )

    async def _alert(
        self,
        conn: Connection,
        row: Any,
        problems: list[dict[str, str]],
        job_id: int | None,
        source_ok: bool,
    ) -> None:
        await outbox.emit(
            conn,
            INTEGRITY_EVENT,
            tenant_id=row["tenant_id"],
            aggregate_id=row["id"],
            payload={
                "asset_id": str(row["id"]),
                "revision": row["revision"],
                "problems": problems[:50],
                "source_present": source_ok,
                "rebuild_job_id": str(job_id) if job_id is not None else None,
            },
        )
