"""The sweep report: what each scan of a pass found and did, the rows it skipped, and the
scans that failed.

It lives apart from the scans and the orchestrator (``sweeper``) so that every scan module
(``sweep_scans``, ``sweep_stuck_assets``, ``gc``, ``integrity``) can write to it without
importing the orchestrator, which imports them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ClassVar

import msgspec

from aivedio.store.sweep_stalled import REPORT_LIMIT
from aivedio.supervision import Row, RowGuard, error_class

__all__ = ["REPORT_LIMIT", "Finding", "SweepReport"]

_PRESENT = {
    "deleted": "delete",
    "aborted": "abort",
    "requeued": "requeue",
    "buried": "bury",
    "gave_up": "give_up",
}


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
        "expired_idempotency_keys",
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
    expired_idempotency_keys: list[Finding] = msgspec.field(default_factory=list)
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
