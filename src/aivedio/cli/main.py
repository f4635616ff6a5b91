"""The ``aivedio`` command. Each subcommand decodes its configuration before doing anything.

Exit statuses are one table for every command (``cli/common.py``), shown by ``--help``. A
command that needs the URL encryption key says so (``needs_key=`` on its parser, with why);
every other command runs without it, so an operator can list, migrate and check a
configuration on a machine that holds no secret.
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
from aivedio.cli import help as cli_help
from aivedio.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    emit,
    exit_status_help,
    plain,
    print_json,
)
from aivedio.config.load import Config, load_config, masked
from aivedio.errors import (
    AivedioError,
    ConfigError,
    DatabaseError,
    MalformedInputError,
    PolicyBlockedError,
)
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


# What the listings' tables show (--json prints every field).
JOB_COLUMNS = ("id", "kind", "status", "attempts", "last_error_class", "created_at", "finished_at")
OUTPUT_COLUMNS = (
    "id",
    "provider",
    "provider_task_id",
    "output_index",
    "fetch_status",
    "last_error_class",
    "asset_id",
    "asset_status",
)


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
            from aivedio.provenance.signing import signing_from_config
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
                    open_media_stage(
                        config, pool, queue, store, signing_from_config(config.provenance)
                    ) as media_stage,
                    open_moderation_stage(config, pool, queue, store) as moderation,
                    open_sweeper(config, pool, store, metrics=metrics) as sweeper,
                ):
                    # Decided by the sandbox's check at the media stage's start (logged too).
                    isolated = media_stage.services.sandbox.network_isolated
                    metrics.network_isolated.labels(config.media.network_isolation).set(
                        1 if isolated else 0
                    )
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
        emit(rows, JOB_COLUMNS, as_json=args.json)
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
            return EXIT_NOT_FOUND
        print(
            f"aivedio: job {args.job_id} is {job['status']}; only dead, cancelled or "
            "waiting jobs can be retried",
            file=sys.stderr,
        )
        return EXIT_REFUSED

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
    if provider_config is not None:
        from aivedio.providers import check_open

        try:
            check_open(args.provider, provider_config)
        except PolicyBlockedError as exc:
            raise ConfigError(f"--provider: {exc.detail}") from None

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
        emit([plain(row) for row in rows], OUTPUT_COLUMNS, as_json=args.json)
        return EXIT_OK

    return _run(main)


# -- parsing --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aivedio",
        description=cli_help.DESCRIPTION,
        epilog=exit_status_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"aivedio {cli_help.package_version()}",
        help="print the version",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML file (default: $AIVEDIO_CONFIG, else built-ins)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser(
        "migrate", parents=[common], help="apply pending schema migrations"
    ).set_defaults(fn=cmd_migrate)

    worker = sub.add_parser("worker", parents=[common], help="run the worker daemon")
    worker.add_argument("--http-port", type=int, help="health/metrics port (0: any free port)")
    worker.set_defaults(
        fn=cmd_worker, needs_key="it decrypts the provider URLs it fetches and refreshes"
    )

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    config_sub.add_parser(
        "check", parents=[common], help="print the effective configuration, secrets masked"
    ).set_defaults(fn=cmd_config_check)

    jobs = sub.add_parser("jobs", help="inspect and replay jobs")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")
    jobs_list = jobs_sub.add_parser("list", parents=[common], help="list jobs, newest first")
    jobs_list.add_argument(
        "--status",
        choices=["queued", "waiting", "running", "succeeded", "dead", "cancelled"],
        help="only jobs in this status",
    )
    jobs_list.add_argument("--kind", help="only jobs of this kind (e.g. fetch, probe, render)")
    jobs_list.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    jobs_list.add_argument("--json", action="store_true", help="one JSON object a line")
    jobs_list.set_defaults(fn=cmd_jobs_list)
    jobs_retry = jobs_sub.add_parser(
        "retry", parents=[common], help="requeue a dead job with a fresh budget"
    )
    jobs_retry.add_argument("job_id", type=int, help="the job's id (from jobs list)")
    jobs_retry.set_defaults(fn=cmd_jobs_retry)
    enqueue = jobs_sub.add_parser(
        "enqueue",
        parents=[common],
        help="enqueue diagnostic jobs (diag.noop, diag.sleep, diag.fail)",
    )
    enqueue.add_argument("kind", help="a diagnostic kind: diag.noop, diag.sleep or diag.fail")
    enqueue.add_argument("--count", type=int, default=1, help="how many jobs (default 1)")
    enqueue.add_argument("--payload", help="the jobs' payload, a JSON object")
    enqueue.add_argument(
        "--tenant-id", type=int, default=0, help="the tenant the jobs count against (default 0)"
    )
    enqueue.add_argument("--key-prefix", help="idempotency key prefix (default: kind and time)")
    enqueue.set_defaults(fn=cmd_jobs_enqueue)

    ingest = sub.add_parser(
        "ingest",
        parents=[common],
        help="record a provider output as a verified callback would, and enqueue its fetch",
    )
    ingest.add_argument("--provider", required=True, help="the provider's name")
    ingest.add_argument("--task-id", required=True, help="the provider's task id")
    ingest.add_argument(
        "--output-index", type=int, default=0, help="which output of the task (default 0)"
    )
    ingest.add_argument("--url", required=True, help="the provider's (signed) output URL")
    ingest.add_argument("--expires-at", help="ISO 8601 time the URL expires")
    ingest.add_argument("--sha256", help="the provider's SHA-256 of the output")
    ingest.add_argument("--size", type=int, help="the provider's size of the output in bytes")
    ingest.add_argument("--tenant", required=True, help="tenant name")
    ingest.set_defaults(fn=cmd_ingest, needs_key="it encrypts the output's URL before storing it")

    fetch = sub.add_parser(
        "fetch",
        parents=[common],
        help="the guarded fetch as a standalone command: one JSON object a URL on stdout",
    )
    fetch.add_argument("urls", nargs="*", metavar="URL", help="URLs to fetch (or to check)")
    fetch.add_argument("--urls-from", help="file with one URL a line (with --dry-run)")
    fetch.add_argument("--out", help="write the body here (default: discard)")
    fetch.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and resolve through the policy without connecting",
    )
    fetch.add_argument(
        "--allow-host-suffix", action="append", default=None, help="allow hosts ending so"
    )
    fetch.add_argument(
        "--allow-scheme", action="append", default=None, help="allow this scheme (e.g. http)"
    )
    fetch.add_argument("--allow-port", action="append", type=int, default=None, help="allow port")
    fetch.add_argument(
        "--allow-cidr", action="append", default=None, help="allow addresses in this CIDR"
    )
    fetch.add_argument(
        "--nameserver",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="resolve through this DNS server",
    )
    fetch.add_argument("--ca-file", help="trust this CA bundle (PEM) for HTTPS")
    fetch.add_argument(
        "--header", action="append", default=[], metavar="'NAME: VALUE'", help="send this header"
    )
    fetch.add_argument("--max-bytes", type=int, help="refuse a body larger than this")
    fetch.add_argument("--expect-sha256", help="fail unless the body has this SHA-256")
    fetch.add_argument("--expect-size", type=int, help="fail unless the body has this size")
    fetch.set_defaults(fn=cmd_fetch)

    outputs = sub.add_parser("outputs", help="provider outputs and their fetch state")
    outputs_sub = outputs.add_subparsers(dest="outputs_command", required=True, metavar="COMMAND")
    outputs_list = outputs_sub.add_parser(
        "list", parents=[common], help="provider outputs, newest first (never a URL)"
    )
    outputs_list.add_argument("--status", help="e.g. STORED, RETRY_WAIT, OUTPUT_LOST")
    outputs_list.add_argument("--task-id", help="only this provider task's outputs")
    outputs_list.add_argument(
        "--limit", type=int, default=50, help="at most this many (default 50)"
    )
    outputs_list.add_argument("--json", action="store_true", help="one JSON object a line")
    outputs_list.set_defaults(fn=cmd_outputs_list)

    tenants = sub.add_parser("tenants", help="tenants")
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="COMMAND")
    create = tenants_sub.add_parser("create", parents=[common], help="create a tenant")
    create.add_argument("name", help="the tenant's name (idempotent)")
    create.set_defaults(fn=cmd_tenants_create)

    from aivedio.cli import api, assets, ledger, lifecycle, media, status, sweep, watch, webhooks

    for module in (api, media, assets, lifecycle, status, ledger, sweep, watch, webhooks):
        module.add_parsers(sub, common)
    cli_help.finish(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("worker", "fetch"):
        from aivedio.memory import tune_allocator

        tune_allocator()
    try:
        # The key is checked when it is set; only the commands that use it require it.
        config = load_config(args.config, require_secrets=False)
    except ConfigError as exc:
        print(f"aivedio: {exc.detail}", file=sys.stderr)
        return EXIT_USAGE
    why = getattr(args, "needs_key", None)
    if why and not config.security.url_encryption_key:
        print(
            f"aivedio {args.command}: needs the URL encryption key "
            f"(security.url_encryption_key or AIVEDIO_URL_ENCRYPTION_KEY): {why}; set it to "
            "base64 of 32 random bytes (for example: openssl rand -base64 32)",
            file=sys.stderr,
        )
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
        return EXIT_INTERRUPTED
    return code
