"""``aivedio webhooks deliveries list`` and ``retry``: what the relay gave up on, and a replay.

``list`` prints a table of deliveries, newest event first (``--json``: one JSON object per
line), filtered by ``--state`` (pending, delivered, dead) and ``--endpoint``. ``retry EVENT_ID…``
makes those events' dead deliveries due now with a fresh budget (attempts and the 24 h window
start again), and pending ones due now; ``--endpoint`` narrows to one webhook, and
``--all-dead`` replays every dead delivery (of that endpoint, if given). A running worker's
relay sends them within its poll interval. Exit status 0 when something was replayed, 3
(``EXIT_NOT_FOUND``) when nothing named could be (unknown, delivered, or being sent now).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import anyio
import msgspec

from aivedio.cli.common import EXIT_NOT_FOUND, EXIT_OK, parse_uuids, print_json, usage
from aivedio.config.load import Config
from aivedio.store import webhook_deliveries
from aivedio.store.database import open_pool

COLUMNS = ("event_id", "endpoint", "event_type", "state", "attempts", "last_status", "at")
LAST_ERROR_CHARS = 60


def _when(d: webhook_deliveries.Delivery) -> datetime:
    return d.delivered_at or d.dead_at or d.next_attempt_at or d.created_at


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain text table: a header, then one left-aligned line per row."""
    cells = [[str(c).upper() for c in columns]]
    cells += [["" if r.get(c) is None else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def cmd_deliveries_list(config: Config, args: argparse.Namespace) -> int:
    if args.limit < 1 or args.limit > 1000:
        return usage("aivedio webhooks deliveries list", "--limit is 1 to 1000")

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            found = await webhook_deliveries.list_deliveries(
                pool, state=args.state, endpoint=args.endpoint, limit=args.limit
            )
        if args.json:
            for d in found:
                print_json(msgspec.to_builtins(d))
            return EXIT_OK
        rows = []
        for d in found:
            row: dict[str, Any] = msgspec.structs.asdict(d)
            row["at"] = _when(d).isoformat(timespec="seconds")
            error = (d.last_error or "")[:LAST_ERROR_CHARS]
            row["last_error"] = error
            rows.append(row)
        print(table(rows, (*COLUMNS, "last_error")))
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def cmd_deliveries_retry(config: Config, args: argparse.Namespace) -> int:
    command = "aivedio webhooks deliveries retry"
    if bool(args.event_ids) == args.all_dead:
        return usage(command, "name event ids, or --all-dead (not both)")
    ids = None
    if args.event_ids:
        ids = parse_uuids(args.event_ids)
        if ids is None:
            return usage(command, "an event id is a UUID (the webhook-id receivers saw)")

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            replayed = await webhook_deliveries.replay(pool, ids, endpoint=args.endpoint)
        if args.json:
            print_json({"replayed": [{"event_id": str(e), "endpoint": n} for e, n in replayed]})
        else:
            for event_id, endpoint in replayed:
                print(f"replayed {event_id} to {endpoint}")
        if ids is not None:
            missing = sorted({str(i) for i in ids} - {str(e) for e, _ in replayed})
            for name in missing:
                print(f"aivedio: no dead or pending delivery of {name} to replay", file=sys.stderr)
        return EXIT_OK if replayed else EXIT_NOT_FOUND

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    webhooks = sub.add_parser("webhooks", help="outgoing webhooks: deliveries and replays")
    webhooks_sub = webhooks.add_subparsers(dest="webhooks_command", required=True)
    deliveries = webhooks_sub.add_parser("deliveries", help="deliveries of events to webhooks")
    deliveries_sub = deliveries.add_subparsers(dest="deliveries_command", required=True)

    listing = deliveries_sub.add_parser("list", parents=[common], help="newest event first")
    listing.add_argument(
        "--state", choices=webhook_deliveries.STATES, help="only deliveries in this state"
    )
    listing.add_argument("--endpoint", help="one webhook's name")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (50)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(fn=cmd_deliveries_list, needs_secret=False)

    retry = deliveries_sub.add_parser(
        "retry", parents=[common], help="send dead (or pending) deliveries again, now"
    )
    retry.add_argument(
        "event_ids", nargs="*", metavar="EVENT_ID", help="the events whose deliveries to replay"
    )
    retry.add_argument("--endpoint", help="only to this webhook")
    retry.add_argument("--all-dead", action="store_true", help="every dead delivery")
    retry.add_argument("--json", action="store_true", help="one JSON object")
    retry.set_defaults(fn=cmd_deliveries_retry, needs_secret=False)
