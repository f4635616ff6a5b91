"""``aivedio ledger``: the money facts of one provider task or one tenant, with totals.

Read-only, like the ledger's other readers: there is no command that changes an entry,
because the table refuses it (a correction is a new entry written by the code that owns the
fact). A table by default for people on call; ``--json`` prints one object per entry and one
``{"kind": "total", …}`` object per currency, for scripts and reconciliation.

Amounts are micros (millionths of the currency), positive owed by the tenant, negative
credited back; the text form shows them as decimals.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec

from aivedio import untrusted
from aivedio.cli.common import EXIT_OK, print_json, table, usage
from aivedio.config.load import Config
from aivedio.errors import MalformedInputError
from aivedio.store.database import acquired, open_pool
from aivedio.store.ledger import LedgerEntry, Total, entries, summarize
from aivedio.store.tenant_reads import tenant_id_by_name_or_id


def parse_since(value: str) -> datetime:
    """ISO 8601 (a date, or a time); a time without a zone is taken as UTC. ValueError when
    it is none, MalformedInputError when it is outside what the store holds (a filter, so
    any stored time may be asked for: ``untrusted.stored_instant``)."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    zoned = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return untrusted.stored_instant(zoned, "--since")


def format_micros(micros: int) -> str:
    """Exact decimal form: -1250000 → ``-1.250000``."""
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{fraction:06d}"


def _plain(entry: LedgerEntry) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(entry)
    return out


def _total_json(total: Total) -> dict[str, Any]:
    return {
        "kind": "total",
        "currency": total.currency,
        "charges_micros": total.charges_micros,
        "compensation_micros": total.compensation_micros,
        "net_micros": total.net_micros,
        "entries": total.entries,
    }


ENTRY_COLUMNS = ("created_at", "kind", "amount", "policy", "about")


def _row(e: LedgerEntry) -> dict[str, Any]:
    about = f"{e.provider}/{e.provider_task_id}" if e.provider_task_id else "-"
    if e.asset_id is not None:
        about += f" asset {e.asset_id}" + (f" r{e.revision}" if e.revision is not None else "")
    return {
        "created_at": e.created_at,
        "kind": e.kind,
        "amount": f"{format_micros(e.amount_micros)} {e.currency}",
        "policy": e.policy,
        "about": about,
    }


def _text_total(t: Total) -> str:
    return (
        f"total {t.currency}: charges {format_micros(t.charges_micros)}, "
        f"compensation {format_micros(t.compensation_micros)}, "
        f"net {format_micros(t.net_micros)} ({t.entries} entries)"
    )


def _usage(message: str) -> int:
    return usage("aivedio: ledger", message)


def cmd_ledger(config: Config, args: argparse.Namespace) -> int:
    if (args.task is None) == (args.tenant is None):
        return _usage("give exactly one of --task or --tenant")
    if args.provider is not None and args.task is None:
        return _usage("--provider narrows --task; it needs --task")
    since: datetime | None = None
    if args.since is not None:
        try:
            since = parse_since(args.since)
        except ValueError:
            return _usage(f"--since: {args.since!r} is not an ISO 8601 date or time")
        except MalformedInputError as exc:
            return _usage(exc.detail)

    async def main() -> int:
        async with open_pool(config.database, min_size=1, max_size=1) as pool:
            tenant_id: int | None = None
            if args.tenant is not None:
                async with acquired(pool) as conn:
                    tenant_id = await tenant_id_by_name_or_id(conn, args.tenant)
                if tenant_id is None:
                    return _usage(f"no tenant {args.tenant!r} (by name or id)")
            found = await entries(
                pool, task=args.task, provider=args.provider, tenant_id=tenant_id, since=since
            )
        if args.json:
            for entry in found:
                print_json(_plain(entry))
        else:
            print(table([_row(e) for e in found], ENTRY_COLUMNS))
        for total in summarize(found):
            if args.json:
                print_json(_total_json(total))
            else:
                print(_text_total(total))
        return EXIT_OK

    return anyio.run(main, backend="asyncio")


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    ledger = sub.add_parser(
        "ledger",
        parents=[common],
        help="money facts of a provider task or a tenant, with totals per currency",
    )
    which = ledger.add_mutually_exclusive_group()
    which.add_argument("--task", metavar="PROVIDER_TASK_ID", help="one provider task")
    which.add_argument("--tenant", metavar="NAME_OR_ID", help="one tenant, by name or id")
    ledger.add_argument("--provider", help="with --task: only this provider's task")
    ledger.add_argument(
        "--since", metavar="ISO8601", help="entries at or after this time (no zone: UTC)"
    )
    ledger.add_argument(
        "--json", action="store_true", help="one JSON object a line instead of a table"
    )
    ledger.set_defaults(fn=cmd_ledger)
