"""What every ``aivedio`` command shares: its exit statuses, how it prints, its argument helpers.

Exit statuses are defined here and nowhere else, and one number means one thing for every
command: scripts branch on them, so ``EXIT_STATUSES`` below is also the table that
``aivedio --help``, every command's ``--help`` and the README show. A command returns the
ones that apply to it; a number never changes its meaning.

Listings print a table for people by default (``table``, the one renderer) and JSON lines
with ``--json`` for scripts (``emit``).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_INVALID_MEDIA = 5
EXIT_INTERRUPTED = 130

# (status, meaning): the one table, in --help and in the README.
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done"),
    (EXIT_FAILED, "failed (the database, a fetch, a required output, a sweep scan)"),
    (EXIT_USAGE, "bad usage or configuration (the message names the flag or key)"),
    (EXIT_NOT_FOUND, "not found: no such asset, job, task or output"),
    (EXIT_REFUSED, "refused: the fetch policy blocked a URL, or the state forbids it"),
    (EXIT_INVALID_MEDIA, "the source is invalid media (probe, process)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)


def exit_status_help() -> str:
    """The exit-status table as --help shows it."""
    return "exit status:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_STATUSES)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def print_json(value: Any, *, flush: bool = False) -> None:
    """One JSON document on one line of stdout (times and dates in ISO 8601)."""
    print(json.dumps(value, default=_json_default), flush=flush)


def plain(row: Any) -> dict[str, Any]:
    """A database row as JSON-ready values: UUIDs as text, times in ISO 8601."""
    out: dict[str, Any] = {}
    for key, value in dict(row.items()).items():
        if isinstance(value, uuid.UUID):
            value = str(value)
        elif isinstance(value, datetime):
            value = value.isoformat()
        out[key] = value
    return out


def parse_uuids(values: Iterable[str]) -> list[uuid.UUID] | None:
    """The values as UUIDs, or None when any of them is not one."""
    try:
        return [uuid.UUID(v) for v in values]
    except ValueError:
        return None


def usage(command: str, message: str) -> int:
    """Say what is wrong with the command line (on stderr, after ``command``); EXIT_USAGE."""
    print(f"{command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table under a header of the column names: numbers right,
    text left, None as ``-``, times to the second. ``(none)`` under the header when empty."""
    rows = list(rows)
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    # A column is numeric when every value it has is a number (and it has one).
    numeric = [
        {type(row.get(c)) for row in rows} - {type(None)} <= {int, float}
        and any(row.get(c) is not None for row in rows)
        for c in columns
    ]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str], header: bool = False) -> str:
        parts = [
            v.rjust(w) if numeric[i] and not header else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [line(columns, header=True), *(line(r) for r in cells)]
    if not cells:
        lines.append("(none)")
    return "\n".join(lines)


def emit(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, as_json: bool) -> None:
    """A listing: one JSON object a line (every field) with ``--json``, else ``table``."""
    if as_json:
        for row in rows:
            print_json(dict(row))
    else:
        print(table(rows, columns))
