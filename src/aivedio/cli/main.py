"""The ``aivedio`` command. Each subcommand decodes its configuration before doing anything.

Exit status: 0 done, 1 a runtime failure (database unreachable…), 2 bad usage or bad
configuration (the message names the key); ``cli/common.py`` lists every command's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec

from aivedio import logs, untrusted
from aivedio.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, plain, print_json
from aivedio.config.load import Config, load_config, masked
from aivedio.errors import AivedioError, ConfigError, DatabaseError, MalformedInputError
from aivedio.store import migrations, task_reads
from aivedio.store.database import (
    acquired,
    map_db_errors,
    open_connection,
    open_pool,
    transaction,
    until_database_answers,
)
from aivedio.store.queue import Queue


def _registry() -> Any:
    from aivedio.worker.kinds import default_registry

    return default_registry()


def _run(fn: Callable[[], Awaitable[int]]) -> int:
    return anyio.run(fn, backend="asyncio", backend_options={"use_uvloop": True})


# -- commands -------------------------------------------------------------------------------


def cmd_config_check(config: Config, _args: argparse.Namespace) -> int:
    print(msgspec.json.format(msgspec.json.encode(masked(config))).decode())
    return EXIT_OK


def cmd_migrate(config: Config, _args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_connection(config.database) as conn:
            with map_db_errors("migrating"):
                applied = await migrations.migrate(conn)
        log = logs.get_logger("aivedio.migrate")
        log.info(
            "migrations_applied",
            applied=[m.name for m in applied],
            current=migrations.available()[-1].name,
        )
        return EXIT_OK

    return _run(main)


def cmd_worker(config: Config, args: argparse.Namespace) -> int:
    from aivedio.worker.daemon import Worker

    if args.http_port is not None:
        config = msgspec.structs.replace(
            config, worker=msgspec.structs.replace(config.worker, http_port=args.http_port)
        )

    async def main() -> int:
        total_slots = sum(lane.slots for lane in config.worker.lanes.values())
        async with open_pool(
            config.database, max_size=max(6, min(total_slots // 4 + 6, 32)), wait_seconds=30
        ) as pool:

            async def check_migrations() -> list[Any]:
                with map_db_errors("checking migrations"):
                    async with pool.acquire() as conn:
                        return list(await migrations.pending(conn))

            # A worker (re)started while PostgreSQL restarts waits for it a little.
            pending = await until_database_answers(check_migrations, "checking migrations")
            if pending:
                raise ConfigError(
                    "database schema is not current (pending: "
                    + ", ".join(m.name for m in pending)
                    + "); run `aivedio migrate` first"
                )
            registry = _registry()
            from aivedio.metrics import WorkerMetrics
            from aivedio.pipeline.media_stage import open_media_stage
            from aivedio.pipeline.moderation import open_moderation_stage
            from aivedio.pipeline.publish import PublishStage
            from aivedio.pipeline.services import (
                open_fetch_stage,
                open_fetch_store,
                tenant_delivery,
            )
            from aivedio.pipeline.upkeep.diagnostics import Journal
            from aivedio.pipeline.upkeep.outbox_relay import open_outbox_relay
            from aivedio.pipeline.upkeep.sweeper import open_sweeper, seed_periodic_sweep
            from aivedio.store.objects.metered import MeteredObjectStore

            journal = Journal(config.diagnostics.execution_journal_dir)
            queue = Queue(
                pool, default_start_within_seconds=config.queue.default_start_within_seconds
            )
            # Every stage's object store calls are counted on this worker's /metrics.
            metrics = WorkerMetrics()
            try:
                async with (
                    open_fetch_store(config) as opened,
                    open_fetch_stage(
                        config, pool, queue, store := MeteredObjectStore(opened, metrics.store)
                    ) as fetch_stage,
                    open_media_stage(config, pool, queue, store) as media_stage,
                    open_moderation_stage(config, pool, queue, store) as moderation,
                    open_sweeper(config, pool, store, metrics=metrics) as sweeper,
                ):
                    services = {
                        "journal": journal,
                        "fetch": fetch_stage,
                        "media": media_stage,
                        "moderation": moderation,
                        "publish": PublishStage(config, pool, queue, store),
                        "sweeper": sweeper,
                    }
                    if config.sweeper.periodic:
                        await until_database_answers(
                            lambda: seed_periodic_sweep(pool, queue, config.sweeper),
                            "seeding the periodic sweep",
                        )
                    worker = Worker(
                        config, pool, registry, services=services, metrics=metrics, queue=queue
                    )
                    async with AsyncExitStack() as stack:
                        tenants = tenant_delivery(config)
                        if config.outbox.webhooks or tenants is not None:
                            # Its loops are the worker's too: down in its /readyz while they fail.
                            await stack.enter_async_context(
                                open_outbox_relay(
                                    config.outbox,
                                    pool,
                                    database=config.database,
                                    conditions=worker.conditions,
                                    metrics=metrics.supervision,
                                    tenants=tenants,
                                )
                            )
                        await worker.run()
            finally:
                journal.close()
        return EXIT_OK

    return _run(main)


def cmd_jobs_list(config: Config, args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            rows = await Queue(pool).list(status=args.status, kind=args.kind, limit=args.limit)
        for row in rows:
            print_json(row)
        return EXIT_OK

    return _run(main)


def cmd_jobs_retry(config: Config, args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            queue = Queue(pool)
            if await queue.replay(args.job_id):
                print_json({"job_id": args.job_id, "outcome": "requeued"})
                return EXIT_OK
            job = await queue.get(args.job_id)
        if job is None:
            print(f"aivedio: job {args.job_id} does not exist", file=sys.stderr)
        else:
            print(
                f"aivedio: job {args.job_id} is {job['status']}; only dead, cancelled or "
                "waiting jobs can be retried",
                file=sys.stderr,
            )
        return EXIT_FAILED

    return _run(main)


def cmd_jobs_enqueue(config: Config, args: argparse.Namespace) -> int:
    registry = _registry()
    if registry.get(args.kind) is None or not args.kind.startswith("diag."):
        raise ConfigError(
            f"jobs enqueue takes a diagnostic kind: "
            f"{sorted(k.name for k in registry if k.name.startswith('diag.'))}"
        )
    payload = json.loads(args.payload) if args.payload else {}

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            queue = Queue(
                pool, default_start_within_seconds=config.queue.default_start_within_seconds
            )
            prefix = args.key_prefix or f"{args.kind}:{datetime.now().isoformat()}"
            specs = [
                registry.spec(args.kind, f"{prefix}:{i}", tenant_id=args.tenant_id, payload=payload)
                for i in range(args.count)
            ]
            created = 0
            for start in range(0, len(specs), 1000):
                async with acquired(pool) as conn, transaction(conn):
                    results = await queue.enqueue(conn, specs[start : start + 1000])
                created += sum(r.created for r in results)
        print_json({"kind": args.kind, "requested": args.count, "created": created})
        return EXIT_OK

    return _run(main)


def cmd_tenants_create(config: Config, args: argparse.Namespace) -> int:
    from aivedio.store.tenants import create_tenant

    async def main() -> int:
        async with open_connection(config.database) as conn:
            tenant_id, created = await create_tenant(conn, args.name)
        print_json({"tenant": args.name, "id": tenant_id, "created": created})
        return EXIT_OK

    return _run(main)


def cmd_ingest(config: Config, args: argparse.Namespace) -> int:
    from aivedio.pipeline.intake import OutputDescriptor, check_descriptor, record_provider_output
    from aivedio.pipeline.services import url_cipher
    from aivedio.store.tenants import tenant_id_by_name

    descriptor = OutputDescriptor(
        provider=args.provider,
        provider_task_id=args.task_id,
        output_index=args.output_index,
        url=args.url,
        expires_at=_parse_time(args.expires_at),
        sha256=args.sha256.lower() if args.sha256 else None,
        size=args.size,
    )

    try:
        check_descriptor(descriptor, datetime.now(UTC))
    except MalformedInputError as exc:
        raise ConfigError(f"{_flag_of(exc.field)}: {exc.detail}") from None
    provider_config = config.providers.get(args.provider)
    ttl = provider_config.default_url_ttl_seconds if provider_config else 3600.0

    async def main() -> int:
        async with (
            open_pool(config.database, min_size=1, max_size=2) as pool,
            acquired(pool) as conn,
        ):
            queue = Queue(
                pool, default_start_within_seconds=config.queue.default_start_within_seconds
            )
            recorded = await record_provider_output(
                conn,
                queue=queue,
                cipher=url_cipher(config),
                tenant_id=await tenant_id_by_name(conn, args.tenant),
                descriptor=descriptor,
                pipeline_version=config.fetch.pipeline_version,
                default_ttl_seconds=ttl,
                ledger=config.ledger,
            )
        print_json(msgspec.to_builtins(recorded))
        return EXIT_OK

    return _run(main)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--expires-at: {value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise ConfigError("--expires-at: give a time zone (e.g. 2026-12-01T10:00:00Z)")
    try:
        return untrusted.instant(parsed, "--expires-at")
    except MalformedInputError as exc:
        raise ConfigError(exc.detail) from None


# The flag each field of an ingested output comes from (errors name what the user typed).
_INGEST_FLAGS = {
    "task_id": "--task-id",
    "index": "--output-index",
    "url": "--url",
    "expires_at": "--expires-at",
    "sha256": "--sha256",
    "size": "--size",
}


def _flag_of(field: str) -> str:
    return _INGEST_FLAGS.get(field.rpartition(".")[2], field)


def cmd_fetch(config: Config, args: argparse.Namespace) -> int:
    from aivedio.cli.fetch import prepare, run_fetch_command

    prepared = prepare(config, args)
    if isinstance(prepared, int):
        return prepared
    urls, headers, net = prepared
    return _run(lambda: run_fetch_command(urls, headers, net, args))


def cmd_outputs_list(config: Config, args: argparse.Namespace) -> int:
    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            rows = await task_reads.list_outputs(pool, args.status, args.task_id, args.limit)
        for row in rows:
            print_json(plain(row))
        return EXIT_OK

    return _run(main)


# -- parsing --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aivedio", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML file (default: $AIVEDIO_CONFIG, else built-ins)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser(
        "migrate", parents=[common], help="apply pending schema migrations"
    ).set_defaults(fn=cmd_migrate)

    worker = sub.add_parser("worker", parents=[common], help="run the worker daemon")
    worker.add_argument("--http-port", type=int, help="health/metrics port (0: any free port)")
    worker.set_defaults(fn=cmd_worker)

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    config_sub.add_parser(
        "check", parents=[common], help="print the effective configuration, secrets masked"
    ).set_defaults(fn=cmd_config_check)

    jobs = sub.add_parser("jobs", help="inspect and replay jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)
    jobs_list = jobs_sub.add_parser("list", parents=[common], help="list jobs, newest first")
    jobs_list.add_argument(
        "--status", choices=["queued", "waiting", "running", "succeeded", "dead", "cancelled"]
    )
    jobs_list.add_argument("--kind")
    jobs_list.add_argument("--limit", type=int, default=100)
    jobs_list.set_defaults(fn=cmd_jobs_list)
    jobs_retry = jobs_sub.add_parser(
        "retry", parents=[common], help="requeue a dead job with a fresh budget"
    )
    jobs_retry.add_argument("job_id", type=int)
    jobs_retry.set_defaults(fn=cmd_jobs_retry)
    enqueue = jobs_sub.add_parser(
        "enqueue",
        parents=[common],
        help="enqueue diagnostic jobs (diag.noop, diag.sleep, diag.fail)",
    )
    enqueue.add_argument("kind")
    enqueue.add_argument("--count", type=int, default=1)
    enqueue.add_argument("--payload", help="JSON object")
    enqueue.add_argument("--tenant-id", type=int, default=0)
    enqueue.add_argument("--key-prefix", help="idempotency key prefix (default: kind and time)")
    enqueue.set_defaults(fn=cmd_jobs_enqueue)

    ingest = sub.add_parser(
        "ingest",
        parents=[common],
        help="record a provider output as a verified callback would, and enqueue its fetch",
    )
    ingest.add_argument("--provider", required=True)
    ingest.add_argument("--task-id", required=True)
    ingest.add_argument("--output-index", type=int, default=0)
    ingest.add_argument("--url", required=True, help="the provider's (signed) output URL")
    ingest.add_argument("--expires-at", help="ISO 8601 time the URL expires")
    ingest.add_argument("--sha256", help="the provider's SHA-256 of the output")
    ingest.add_argument("--size", type=int, help="the provider's size of the output in bytes")
    ingest.add_argument("--tenant", required=True, help="tenant name")
    ingest.set_defaults(fn=cmd_ingest)

    fetch = sub.add_parser(
        "fetch",
        parents=[common],
        help="the guarded fetch as a standalone command: one JSON object a URL on stdout",
    )
    fetch.add_argument("urls", nargs="*", metavar="URL")
    fetch.add_argument("--urls-from", help="file with one URL a line (with --dry-run)")
    fetch.add_argument("--out", help="write the body here (default: discard)")
    fetch.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and resolve through the policy without connecting",
    )
    fetch.add_argument("--allow-host-suffix", action="append", default=None)
    fetch.add_argument("--allow-scheme", action="append", default=None)
    fetch.add_argument("--allow-port", action="append", type=int, default=None)
    fetch.add_argument("--allow-cidr", action="append", default=None)
    fetch.add_argument("--nameserver", action="append", default=None, metavar="HOST:PORT")
    fetch.add_argument("--ca-file")
    fetch.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'")
    fetch.add_argument("--max-bytes", type=int)
    fetch.add_argument("--expect-sha256")
    fetch.add_argument("--expect-size", type=int)
    fetch.set_defaults(fn=cmd_fetch, needs_secret=False)

    outputs = sub.add_parser("outputs", help="provider outputs and their fetch state")
    outputs_sub = outputs.add_subparsers(dest="outputs_command", required=True)
    outputs_list = outputs_sub.add_parser(
        "list", parents=[common], help="provider outputs, newest first (never a URL)"
    )
    outputs_list.add_argument("--status", help="e.g. STORED, RETRY_WAIT, OUTPUT_LOST")
    outputs_list.add_argument("--task-id")
    outputs_list.add_argument("--limit", type=int, default=50)
    outputs_list.set_defaults(fn=cmd_outputs_list)

    tenants = sub.add_parser("tenants", help="tenants")
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True)
    create = tenants_sub.add_parser("create", parents=[common], help="create a tenant")
    create.add_argument("name")
    create.set_defaults(fn=cmd_tenants_create)

    from aivedio.cli import api, assets, ledger, lifecycle, media, status, sweep, watch, webhooks

    for module in (api, media, assets, lifecycle, status, ledger, sweep, watch, webhooks):
        module.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("worker", "fetch"):
        from aivedio.memory import tune_allocator

        tune_allocator()
    try:
        config = load_config(args.config, require_secrets=getattr(args, "needs_secret", True))
    except ConfigError as exc:
        print(f"aivedio: {exc.detail}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(config.log.level, config.log.format)
    try:
        code: int = args.fn(config, args)
    except ConfigError as exc:
        print(f"aivedio: {exc.detail}", file=sys.stderr)
        return EXIT_USAGE
    except DatabaseError as exc:
        print(f"aivedio: database error: {logs.redact_text(exc.detail)}", file=sys.stderr)
        return EXIT_FAILED
    except AivedioError as exc:
        print(f"aivedio: {exc.error_class}: {logs.redact_text(exc.detail)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED
    return code
