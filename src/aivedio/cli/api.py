"""``aivedio api`` (the HTTP API process) and ``aivedio keys create|revoke``.

``aivedio api`` refuses to start without a playback token secret or with pending
migrations, serves on ``[api] host:port``, and on SIGTERM or SIGINT turns /readyz to 503
while still serving for ``[api] drain_delay_seconds`` (a second signal cuts it short), then
closes the listener, ends event streams, lets in-flight requests finish (bounded) and exits 0.
"""

from __future__ import annotations

import argparse
import signal

import anyio
import msgspec

from aivedio.cli.common import EXIT_OK, print_json
from aivedio.config.load import Config
from aivedio.errors import ConfigError
from aivedio.logs import get_logger
from aivedio.store import migrations
from aivedio.store.database import map_db_errors, open_connection, open_pool

log = get_logger("aivedio.api")


def cmd_api(config: Config, args: argparse.Namespace) -> int:
    from aivedio.api.app import run_app
    from aivedio.api.context import ApiContext
    from aivedio.api.tokens import signer_from
    from aivedio.pipeline.services import url_cipher
    from aivedio.store.objects.opening import open_object_store
    from aivedio.store.queue import Queue

    if args.port is not None:
        config = msgspec.structs.replace(
            config, api=msgspec.structs.replace(config.api, port=args.port)
        )
    signer = signer_from(config.api)

    async def main() -> int:
        async with open_pool(config.database, max_size=config.api.pool_max_size) as pool:
            with map_db_errors("checking migrations"):
                async with pool.acquire() as conn:
                    pending = await migrations.pending(conn)
            if pending:
                raise ConfigError(
                    "database schema is not current (pending: "
                    + ", ".join(m.name for m in pending)
                    + "); run `aivedio migrate` first"
                )
            async with open_object_store(config.storage) as store:
                ctx = ApiContext(
                    config=config,
                    pool=pool,
                    store=store,
                    queue=Queue(
                        pool, default_start_within_seconds=config.queue.default_start_within_seconds
                    ),
                    cipher=url_cipher(config),
                    signer=signer,
                )
                # Signals are caught before the port is announced: a SIGTERM as soon as the
                # API listens drains it too.
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async with anyio.create_task_group() as tg:
                        await tg.start(run_app, ctx, config.api.host, config.api.port)
                        async for signum in signals:
                            delay = config.api.drain_delay_seconds
                            log.info(
                                "api_draining",
                                signal=signal.Signals(signum).name,
                                delay_seconds=delay,
                            )
                            ctx.draining = True  # out of the balancer before the listener closes
                            with anyio.move_on_after(delay):
                                await anext(signals)
                            tg.cancel_scope.cancel()
                            break
        log.info("api_stopped")
        return EXIT_OK

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


def cmd_keys_create(config: Config, args: argparse.Namespace) -> int:
    from aivedio.store.api_keys import create_key
    from aivedio.store.tenants import tenant_id_by_name

    async def main() -> int:
        async with open_connection(config.database) as conn:
            tenant_id = await tenant_id_by_name(conn, args.tenant)
            created = await create_key(conn, tenant_id, environment="test" if args.test else "live")
        print_json(
            {
                "id": str(created.id),
                "tenant": args.tenant,
                "prefix": created.prefix,
                "key": created.key,
                "note": "the key is shown only now; it is stored hashed",
            }
        )
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def cmd_keys_revoke(config: Config, args: argparse.Namespace) -> int:
    from aivedio.store.api_keys import revoke_key

    async def main() -> int:
        async with open_connection(config.database) as conn:
            revoked_now = await revoke_key(conn, args.key_id)
        print_json({"key": args.key_id, "revoked": True, "revoked_now": revoked_now})
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    api = sub.add_parser("api", parents=[common], help="run the HTTP API")
    api.add_argument("--port", type=int, help="override [api] port (0: any free port)")
    api.set_defaults(fn=cmd_api, needs_key="it encrypts the URLs that provider callbacks carry")
    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", parents=[common], help="create a key (shown once)")
    create.add_argument("--tenant", required=True, help="the tenant's name")
    create.add_argument("--test", action="store_true", help="an av_test_ key")
    create.set_defaults(fn=cmd_keys_create)
    revoke = keys_sub.add_parser("revoke", parents=[common], help="revoke a key at once")
    revoke.add_argument("key_id", help="the key's id or prefix")
    revoke.set_defaults(fn=cmd_keys_revoke)
