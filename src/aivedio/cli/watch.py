"""``aivedio watch``: have the worker poll a generation task submitted to a provider elsewhere.

Idempotent per ``(provider, task id)``: a second run prints the same watch with
``created: false``. Prints one JSON object; the worker does the polling.
"""

from __future__ import annotations

import argparse

import anyio
import msgspec

from aivedio.cli.common import EXIT_OK, print_json
from aivedio.config.load import Config
from aivedio.store.database import acquired, open_pool


def cmd_watch(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.poller import register_watch
    from aivedio.store.queue import Queue
    from aivedio.store.tenants import tenant_id_by_name

    async def main() -> int:
        async with (
            open_pool(config.database, min_size=1, max_size=1) as pool,
            acquired(pool) as conn,
        ):
            queue = Queue(
                pool, default_start_within_seconds=config.queue.default_start_within_seconds
            )
            watch = await register_watch(
                conn,
                queue=queue,
                config=config,
                provider=args.provider,
                provider_task_id=args.task_id,
                tenant_id=await tenant_id_by_name(conn, args.tenant),
            )
        print_json(msgspec.to_builtins(watch))
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    watch = sub.add_parser(
        "watch",
        parents=[common],
        help="poll a provider's generation task until it ends, then record its outputs",
    )
    watch.add_argument("--provider", required=True, help="a [providers.NAME] section")
    watch.add_argument("--task-id", required=True, help="the provider's task id")
    watch.add_argument("--tenant", required=True, help="the tenant the task belongs to")
    watch.set_defaults(fn=cmd_watch, needs_key="it encrypts the outputs' URLs before storing them")
