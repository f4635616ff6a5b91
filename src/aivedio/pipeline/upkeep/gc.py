"""Orphan garbage collection: which stored objects nothing needs any more, and their deletion.

Garbage collection is the dangerous part of the sweep, so it works from roots, never from
"looks unused" (deleting the temp directory after publishing once deleted final
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
fetched into them. A root that cannot be read (a row whose values raise) protects its whole
asset: what cannot be proven garbage is kept. Each object is judged and deleted alone, so
one that raises is skipped (``scan_row_failed``) and the scan goes on.

The roots of a batch are plain data (``GcRoots``) with the verdict rule as a pure method;
``OrphanCollector`` only lists, queries and deletes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aivedio.config.sweeper import SweeperConfig
from aivedio.pipeline.upkeep.sweep_report import Finding, SweepReport
from aivedio.states import TERMINAL_OUTPUT_STATES
from aivedio.store.database import Pool
from aivedio.store.gc_roots import UUID_PATTERN, asset_references, quarantine_references
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectInfo, ObjectStore
from aivedio.supervision import RowGuard

GC_BATCH = 1000  # listed keys checked against the database per query
ROOT_REVISIONS = frozenset({"READY", "SUPERSEDED", "BUILDING"})
_ASSET_KEY = re.compile(rf"assets/[0-9a-f]+/({UUID_PATTERN})/")

# -- roots (pure) ---------------------------------------------------------------------------


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
    # Assets with a row that could not be read (why): every key of theirs is kept.
    unreadable: dict[str, Exception] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Any]) -> GcRoots:
        roots = cls()
        for row in rows:
            asset = str(row["asset_id"])
            roots.known.add(asset)
            try:
                roots._add(asset, row)
            except Exception as exc:  # a root we cannot read still protects its asset
                roots.unreadable.setdefault(asset, exc)
        return roots

    def _add(self, asset: str, row: Any) -> None:
        if row["asset_status"] == "DELETED":
            self.deleted.add(asset)
            return
        if row["revision"] is None:
            return
        status = row["revision_status"]
        prefix = keys.revision_prefix(row["tenant_id"], row["asset_id"], row["revision"])
        self.revisions[prefix] = status
        if status == "BUILDING" or (status == "READY" and row["variant_status"] == "PENDING"):
            self.prefixes.add(prefix + "/")
        if status in ROOT_REVISIONS and row["object_key"] is not None:
            self.keys.add(row["object_key"])
            base = keys.revision_root(row["object_key"])
            if base is not None:
                self.keys.update(f"{base}/{path}" for path in row["paths"] or () if path)

    def verdict(self, key: str) -> str | None:
        """Why ``key`` may be collected, or None when it must be kept."""
        asset = asset_of(key)
        if asset is None or asset not in self.known or asset in self.unreadable:
            return None  # off the layout, an asset the database does not know or unread: keep
        if asset in self.deleted:
            return "deleted_asset"
        if key in self.keys or any(key.startswith(p) for p in self.prefixes):
            return None
        root = keys.revision_root(key)
        status = self.revisions.get(root) if root else None
        if status in ("FAILED", "ABANDONED"):
            return f"{status.lower()}_revision"
        return "unreferenced"


def _older(info: ObjectInfo, cutoff: datetime) -> bool:
    return info.last_modified is not None and info.last_modified < cutoff


# -- the collector ---------------------------------------------------------------------------


class OrphanCollector:
    """The two GC scans: ``assets/`` against revision roots, ``quarantine/`` against live
    sources and outputs that may still be fetched."""

    def __init__(
        self, cfg: SweeperConfig, *, pool: Pool, store: ObjectStore, rows: RowGuard | None = None
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.store = store
        self.rows = rows or RowGuard()

    async def collect_assets(self, report: SweepReport, now: datetime) -> None:
        await self._collect(report, now, "assets/", "orphan_objects", self._asset_verdicts)

    async def collect_quarantine(self, report: SweepReport, now: datetime) -> None:
        await self._collect(
            report, now, "quarantine/", "quarantine_orphans", self._quarantine_verdicts
        )

    async def _collect(
        self,
        report: SweepReport,
        now: datetime,
        prefix: str,
        scan: str,
        verdicts: Callable[[SweepReport, list[str], datetime], Awaitable[dict[str, str | None]]],
    ) -> None:
        """List ``prefix``; objects past the grace period are checked against the database
        in batches (one query each) and deleted when nothing references them."""
        cutoff = now - timedelta(seconds=self.cfg.orphan_grace_seconds)
        batch: list[ObjectInfo] = []

        async def flush() -> None:
            found: dict[str, str | None] = await verdicts(report, [i.key for i in batch], now)
            for info in batch:
                reason = found.get(info.key)  # none: kept (referenced, or its verdict failed)
                if reason is None:
                    continue
                with report.isolate(self.rows, scan, info.key):
                    await self._delete(report, scan, info, reason, now)
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

    async def _delete(
        self, report: SweepReport, scan: str, info: ObjectInfo, reason: str, now: datetime
    ) -> None:
        if not report.dry_run:
            await self.store.delete(info.key)
        age = round((now - info.last_modified).total_seconds()) if info.last_modified else 0
        finding = Finding(
            subject=info.key,
            detail=reason,
            action=report.act("deleted"),
            data={"age_seconds": age, "size": info.size},
        )
        report.add(scan, finding)

    async def _asset_verdicts(
        self, report: SweepReport, names: list[str], _now: datetime
    ) -> dict[str, str | None]:
        assets = sorted({a for a in map(asset_of, names) if a is not None})
        roots = GcRoots.from_rows(await asset_references(self.pool, assets))
        for asset, exc in roots.unreadable.items():  # its keys are kept
            self.rows.skip("orphan_objects", asset, exc, on_skip=report.skip)
        # Kept, and counted: after a database restore these are what reconciliation needs.
        report.bump(
            "orphan_objects_unattributed",
            sum(1 for name in names if asset_of(name) not in roots.known),
        )
        found: dict[str, str | None] = {}
        for name in names:
            with report.isolate(self.rows, "orphan_objects", name):
                found[name] = roots.verdict(name)
        return found

    async def _quarantine_verdicts(
        self, _report: SweepReport, names: list[str], now: datetime
    ) -> dict[str, str | None]:
        kept = await quarantine_references(self.pool, names, now, sorted(TERMINAL_OUTPUT_STATES))
        return {name: None if name in kept else "no_database_record" for name in names}
