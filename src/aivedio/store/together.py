"""Independent writes of one transaction sent as one statement.

Each write is a ``Part``: a statement with its own ``$1…`` parameters and a ``RETURNING``
clause. ``write_together`` renumbers the parameters and sends the parts as the data-modifying
CTEs of one statement, one round trip instead of one per part, and answers how many rows each
part returned. PostgreSQL runs every part to completion against the statement's snapshot, so
the parts must not read what another part writes (their constraint checks still see each
other's rows: they run at the end of the statement). Part names come from code, never input.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from aivedio.store.database import Connection, map_db_errors

_PARAMETER = re.compile(r"\$(\d+)")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


class Part(NamedTuple):
    sql: str
    args: Sequence[Any]


def _shifted(sql: str, offset: int) -> str:
    return _PARAMETER.sub(lambda m: f"${int(m.group(1)) + offset}", sql)


def together_sql(parts: Mapping[str, Part]) -> tuple[str, list[Any]]:
    if not parts:
        raise ValueError("no statements to write together")
    ctes: list[str] = []
    counts: list[str] = []
    args: list[Any] = []
    for name, part in parts.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"part name {name!r} is not a plain identifier")
        if "returning" not in part.sql.lower():
            raise ValueError(f"part {name!r} needs a RETURNING clause to be counted")
        ctes.append(f"{name} AS ({_shifted(part.sql.strip(), len(args))})")
        counts.append(f"(SELECT count(*) FROM {name}) AS {name}")
        args.extend(part.args)
    return f"WITH {', '.join(ctes)} SELECT {', '.join(counts)}", args


async def write_together(conn: Connection, parts: Mapping[str, Part], doing: str) -> dict[str, int]:
    """Run the parts as one statement; the number of rows each returned, by name."""
    sql, args = together_sql(parts)
    with map_db_errors(doing):
        row = await conn.fetchrow(sql, *args)
    assert row is not None
    return {name: int(row[name]) for name in parts}
