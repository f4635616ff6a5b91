"""``aivedio status (ASSET_ID | --task ID | --provider-output ID) [--json]``.

One answer to "where is it and what happened": the asset's state and current revision, each
variant of that revision (type, object key, size, SHA-256), and the timeline of its stages
(fetch attempts, jobs with their outcome and error class, releases), oldest first. With
``--task``, one such object per output of the generation task.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import anyio

from aivedio.asset_status import asset_status
from aivedio.config import Config
from aivedio.store.database import map_db_errors, open_pool

EXIT_OK, EXIT_USAGE, EXIT_NOT_FOUND = 0, 2, 3


def _text(status: dict[str, Any]) -> str:
    lines = [
        f"asset {status['asset_id']}: {status['state']}, current revision "
        f"{status['current_revision']}, moderation {status['moderation']}"
        + (f", {status['error_class']}: {status['error_detail']}" if status["error_class"] else "")
    ]
    for v in status["variants"]:
        lines.append(f"  {v['variant_type']:<10} {v['size_bytes']:>10}  {v['sha256'][:16]}…  "
                     f"{v['object_key']}")  # fmt: skip
    for entry in status["timeline"]:
        error = f"  [{entry['error_class']}]" if entry.get("error_class") else ""
        lines.append(f"  {entry['at']}  {entry['stage']:<18} {entry['event']}{error}")
    return "\n".join(lines)


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    chosen = [x for x in (args.asset_id, args.task, args.provider_output) if x]
    if len(chosen) != 1:
        print("aivedio status: give exactly one of ASSET_ID, --task ID, --provider-output ID")
        return EXIT_USAGE

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            with map_db_errors("reading the status"):
                if args.task:
                    rows = await pool.fetch(
                        "SELECT a.id FROM assets a JOIN provider_outputs o"
                        " ON o.id = a.source_provider_output_id"
                        " WHERE o.provider_task_id = $1 ORDER BY o.output_index",
                        args.task,
                    )
                    ids = [r["id"] for r in rows]
                else:
                    try:
                        given = uuid.UUID(args.asset_id or args.provider_output)
                    except ValueError:
                        print("aivedio status: ids are UUIDs")
                        return EXIT_USAGE
                    if args.provider_output:
                        found = await pool.fetchval(
                            "SELECT id FROM assets WHERE source_provider_output_id = $1", given
                        )
                        ids = [found] if found else []
                    else:
                        ids = [given]
                statuses = [s for s in [await asset_status(pool, i) for i in ids] if s]
        if not statuses:
            print("aivedio status: nothing found")
            return EXIT_NOT_FOUND
        if args.json:
            print(json.dumps(statuses if args.task else statuses[0]))
        else:
            print("\n".join(_text(s) for s in statuses))
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    status = sub.add_parser("status", parents=[common], help="an asset's state and timeline")
    status.add_argument("asset_id", nargs="?")
    status.add_argument("--task", help="a provider task id: one status per output")
    status.add_argument("--provider-output", help="a provider output id")
    status.add_argument("--json", action="store_true")
    status.set_defaults(fn=cmd_status, needs_secret=False)
