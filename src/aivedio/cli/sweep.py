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

from aivedio.cli.common import EXIT_OK, EXIT_SWEEP_INCOMPLETE
from aivedio.config.load import Config
from aivedio.store.database import open_pool


def cmd_sweep(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.upkeep.sweeper import open_sweeper

    async def main() -> int:
        async with (
            open_pool(config.database, min_size=1, max_size=4) as pool,
            open_sweeper(config, pool) as sweeper,
        ):
            report = await sweeper.sweep(dry_run=args.dry_run)
        print(report.to_json() if args.json else report.text())
        return EXIT_OK if report.outcome == "swept" and not report.errors else EXIT_SWEEP_INCOMPLETE

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    sweep = sub.add_parser(
        "sweep", parents=[common], help="one compensation pass: stale work, orphans, integrity"
    )
    sweep.add_argument("--dry-run", action="store_true", help="report only; change nothing")
    sweep.add_argument("--json", action="store_true", help="one JSON object instead of text")
    sweep.set_defaults(fn=cmd_sweep, needs_secret=False)
