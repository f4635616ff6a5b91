"""``aivedio sweep [--dry-run] [--json]``: one compensation pass, by hand.

The worker runs the same pass periodically (the ``sweep`` job); an operator runs it to see
what is stale or orphaned now, or with ``--dry-run`` to see what a pass would do without
changing anything. Exit status 0: the pass ran every scan (rows a scan could not handle
are skipped, logged and listed as ``skipped``: they do not fail the pass). 1: a scan failed
(the others still ran; the report names it), or another pass held the fleet-wide sweeper
lock and this one did nothing.
"""

from __future__ import annotations

import argparse

import anyio

from aivedio.cli.common import EXIT_FAILED, EXIT_OK, table
from aivedio.config.load import Config
from aivedio.pipeline.upkeep.sweep_report import SweepReport
from aivedio.store.database import open_pool


def text(report: SweepReport) -> str:
    """For people: the outcome, a table of each scan's count, then a table of what was
    found (each finding's action; errors and skipped rows among them)."""
    head = "sweep (dry run)" if report.dry_run else "sweep"
    counts = [{"scan": s, "found": report.counts.get(s, 0)} for s in report.SCANS]
    stats = {k: v for k, v in report.counts.items() if k not in report.SCANS}
    counts += [{"scan": k, "found": v} for k, v in sorted(stats.items())]
    findings = [
        {"scan": scan, "action": f.action, "subject": f.subject, "detail": f.detail}
        for scan in report.SCANS
        for f in getattr(report, scan)
    ]
    findings += [
        {"scan": "-", "action": "error", "subject": e.subject, "detail": e.detail}
        for e in report.errors
    ]
    findings += [
        {"scan": "-", "action": "skipped", "subject": f.subject, "detail": f.detail}
        for f in report.skipped
    ]
    lines = [f"{head}: {report.outcome}", "", table(counts, ("scan", "found"))]
    if findings:
        lines += ["", table(findings, ("scan", "action", "subject", "detail"))]
    return "\n".join(lines)


def cmd_sweep(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.upkeep.sweeper import open_sweeper

    async def main() -> int:
        async with (
            open_pool(config.database, min_size=1, max_size=4) as pool,
            open_sweeper(config, pool) as sweeper,
        ):
            report = await sweeper.sweep(dry_run=args.dry_run)
        print(report.to_json() if args.json else text(report))
        return EXIT_OK if report.outcome == "swept" and not report.errors else EXIT_FAILED

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    sweep = sub.add_parser(
        "sweep", parents=[common], help="one compensation pass: stale work, orphans, integrity"
    )
    sweep.add_argument("--dry-run", action="store_true", help="report only; change nothing")
    sweep.add_argument("--json", action="store_true", help="one JSON object instead of text")
    sweep.set_defaults(fn=cmd_sweep)
