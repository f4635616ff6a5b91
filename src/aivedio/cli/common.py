"""What every ``aivedio`` command shares: its exit statuses, how it prints, its argument helpers.

Exit statuses are defined here and nowhere else; one name is one number. A command returns
the ones that apply to it (scripts and the docs rely on the numbers, so a number never
changes; two names may share a number when they mean different things to different
commands):

====================== ===== ============================================================
name                   value when
====================== ===== ============================================================
EXIT_OK                0     done (``aivedio fetch``: every URL allowed or stored)
EXIT_FAILED            1     a runtime failure: the database unreachable, an error of the
                             service (``main`` reports it), a job that cannot be retried,
                             a Ctrl-C (``aivedio status`` has its own)
EXIT_SWEEP_INCOMPLETE  1     ``aivedio sweep``: a scan failed, or another pass held the lock
EXIT_USAGE             2     bad usage or bad configuration (the message names the flag or
                             the key)
EXIT_NOT_FOUND         3     what was named does not exist (``assets show``, ``delete``,
                             ``cancel``, ``reprocess``, ``moderate``, ``status``,
                             ``webhooks deliveries retry``: nothing to replay)
EXIT_FETCH_BLOCKED     3     ``aivedio fetch``: the policy blocked a URL
EXIT_FETCH_FAILED      4     ``aivedio fetch``: a URL's fetch failed
EXIT_OUTPUT_FAILED     4     ``aivedio process``: a required output failed
EXIT_INVALID_MEDIA     5     ``aivedio probe`` and ``process``: the source is invalid media
EXIT_INTERRUPTED       130   ``aivedio status`` (``--follow`` or not) ended by Ctrl-C
====================== ===== ============================================================

``aivedio fetch`` exits with the worst status of its URLs (failed over blocked over ok).
``aivedio probe`` and ``process`` given a malformed ``--expect-resolution`` stop with the
message on stderr and status 1 (a ``SystemExit`` with a message).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_SWEEP_INCOMPLETE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_FETCH_BLOCKED = 3
EXIT_FETCH_FAILED = 4
EXIT_OUTPUT_FAILED = 4
EXIT_INVALID_MEDIA = 5
EXIT_INTERRUPTED = 130


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
