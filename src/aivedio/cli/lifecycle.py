"""``aivedio delete``, ``cancel``, ``reprocess`` and ``moderate``: decisions, by hand.

``delete ASSET_ID`` closes playback at once (objects go to the sweeper after the grace
period); ``cancel --provider P --task-id T`` publishes nothing of that generation but keeps
bytes already paid for; ``reprocess ASSET_ID…`` builds a new revision from the retained
source under the current ``pipeline_version`` and publishes it atomically (the old revision
serves until the switch; nothing is re-fetched or re-generated); ``moderate ASSET_ID
--allow|--reject`` decides a revision waiting in review, with the moderator's own effects.
"""

from __future__ import annotations

import argparse

import anyio

from aivedio.cli.common import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, parse_uuids, print_json
from aivedio.config.load import Config
from aivedio.errors import NotFoundError
from aivedio.store import asset_reads
from aivedio.store.database import acquired, map_db_errors, open_pool
from aivedio.store.queue import Queue


def cmd_delete(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.upkeep.lifecycle import delete_asset

    ids = parse_uuids([args.asset_id])
    if not ids:
        print(f"aivedio: {args.asset_id!r} is not an asset id")
        return EXIT_USAGE

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            with map_db_errors("deleting the asset"):
                try:
                    changed = await delete_asset(pool, ids[0], reason=args.reason)
                except NotFoundError as exc:
                    print(f"aivedio: {exc.detail}")
                    return EXIT_NOT_FOUND
        print_json({"asset_id": str(ids[0]), "deleted": True, "changed": changed})
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def cmd_cancel(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.upkeep.lifecycle import cancel_task

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            with map_db_errors("cancelling the task"):
                try:
                    result = await cancel_task(
                        pool,
                        args.provider,
                        args.task_id,
                        retain_days=config.moderation.reject_retention_days,
                    )
                except NotFoundError as exc:
                    print(f"aivedio: {exc.detail}")
                    return EXIT_NOT_FOUND
        print_json({"cancelled": True, **result})
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def cmd_reprocess(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.jobs import reprocess_spec

    ids = parse_uuids(args.asset_ids)
    if not ids:
        print("aivedio: reprocess takes asset ids (UUIDs)")
        return EXIT_USAGE

    async def main() -> int:
        code = EXIT_OK
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            queue = Queue(pool)
            for asset_id in ids:
                with map_db_errors("enqueuing the reprocess"):
                    row = await asset_reads.asset_tenant_and_status(pool, asset_id)
                    if row is None:
                        print_json({"asset_id": str(asset_id), "error": "no such asset"})
                        code = EXIT_NOT_FOUND
                        continue
                    if row["status"] not in ("PLAYABLE", "ENRICHED"):
                        print_json(
                            {
                                "asset_id": str(asset_id),
                                "error": f"asset is {row['status']}, not published",
                            }
                        )
                        code = EXIT_USAGE
                        continue
                    spec = reprocess_spec(asset_id, row["tenant_id"], config.media.pipeline_version)
                    async with acquired(pool) as conn:
                        enqueued = await queue.enqueue_one(conn, spec)
                print_json(
                    {
                        "asset_id": str(asset_id),
                        "job_id": enqueued.job_id,
                        "pipeline_version": config.media.pipeline_version,
                    }
                )
        return code

    return anyio.run(main, backend="asyncio")


def cmd_moderate(config: Config, args: argparse.Namespace) -> int:
    """An operator's verdict on an asset whose revision waits in review."""
    from aivedio.pipeline.moderation import Decision, VerdictRecorder

    ids = parse_uuids([args.asset_id])
    if not ids:
        print(f"aivedio: {args.asset_id!r} is not an asset id")
        return EXIT_USAGE
    decision = "allow" if args.allow else "reject"

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            with map_db_errors("recording the verdict"):
                row = await asset_reads.revision_in_review(pool, ids[0])
                if row is None:
                    print(f"aivedio: asset {ids[0]} has no revision waiting in review")
                    return EXIT_NOT_FOUND
                verdict = Decision(
                    decision=decision,
                    reasons=[f"operator:{args.reason}"],
                    version=f"operator:{config.moderation.version}",
                )
                recorder = VerdictRecorder(config.moderation, pool, Queue(pool))
                await recorder.record(ids[0], row["revision"], row["tenant_id"], verdict)
        print_json({"asset_id": str(ids[0]), "revision": row["revision"], "decision": decision})
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    delete = sub.add_parser("delete", parents=[common], help="delete an asset (closes playback)")
    delete.add_argument("asset_id", help="the asset's id (a UUID)")
    delete.add_argument(
        "--reason", default="deleted", help="recorded with the deletion (default: deleted)"
    )
    delete.set_defaults(fn=cmd_delete)
    cancel = sub.add_parser(
        "cancel", parents=[common], help="cancel a generation: nothing of it is published"
    )
    cancel.add_argument("--provider", required=True, help="a [providers.NAME] section")
    cancel.add_argument("--task-id", required=True, help="the provider's task id")
    cancel.set_defaults(fn=cmd_cancel)
    reprocess = sub.add_parser(
        "reprocess", parents=[common], help="a new revision from the retained source"
    )
    reprocess.add_argument(
        "asset_ids", nargs="+", metavar="ASSET_ID", help="published assets' ids (UUIDs)"
    )
    reprocess.set_defaults(fn=cmd_reprocess)
    moderate = sub.add_parser(
        "moderate", parents=[common], help="decide an asset whose moderation is in review"
    )
    moderate.add_argument("asset_id", help="the asset's id (a UUID)")
    choice = moderate.add_mutually_exclusive_group(required=True)
    choice.add_argument("--allow", action="store_true", help="publish it")
    choice.add_argument("--reject", action="store_true", help="reject it (nothing is published)")
    moderate.add_argument(
        "--reason", default="reviewed", help="recorded as operator:REASON (default: reviewed)"
    )
    moderate.set_defaults(fn=cmd_moderate)
