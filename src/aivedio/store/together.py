"""Independent writes of one transaction sent as one statement.

Each write is a ``Part``: a statement with its own ``$1…`` parameters that returns rows (a
``RETURNING`` clause, or a SELECT such as a lock or the lease check). ``write_together``
renumbers the parameters and sends the parts as the CTEs of one statement, one round trip
instead of one per part, and answers, by part, how many rows it returned, or the ``value``
column of its first row (None when it returned none). PostgreSQL runs every part to completion
against the statement's snapshot and the statement is atomic on its own, so the parts must not
read what another part writes (their constraint checks still see each other's rows: they run
at the end of the statement), and an error in any part undoes all of them. A part may read an
earlier part's answer by its name (``… SELECT … FROM move``: written only when ``move``
returned a row). Part names and columns come from code, never input; a part's text has no
``$n`` but its parameters (no dollar quoting, no ``$1`` in a literal or a comment), since
renumbering rewrites every one.

A statement has no transaction to roll back, so a write that must not happen unless another
part won (or a row read under lock still holds what the caller decided on) either reads that
part (``WHERE EXISTS (SELECT 1 FROM move)``) or leaves it to a ``require`` part: a condition
that raises its own SQLSTATE when false (migration 0015), which undoes every part;
``unmet(exc)`` names the requirement a DatabaseError came from.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from aivedio.errors import DatabaseError
from aivedio.store.database import Connection, map_db_errors

_PARAMETER = re.compile(r"\$(\d+)")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")
# Ours: AV and three more; AVL.. is the lease check's (store/queue.py), never a requirement.
_CODE = re.compile(r"AV[A-KM-Z][0-9A-Z]{2}")


class Part(NamedTuple):
    sql: str
    args: Sequence[Any]
    value: str | None = None  # a column to answer instead of the row count


def _shifted(sql: str, offset: int) -> str:
    return _PARAMETER.sub(lambda m: f"${int(m.group(1)) + offset}", sql)


def together_sql(parts: Mapping[str, Part]) -> tuple[str, list[Any]]:
    if not parts:
        raise ValueError("no statements to write together")
    shape = tuple((name, part.sql, part.value, len(part.args)) for name, part in parts.items())
    return _composed(shape), [arg for part in parts.values() for arg in part.args]


@functools.lru_cache(maxsize=1024)
def _composed(shape: tuple[tuple[str, str, str | None, int], ...]) -> str:
    """The statement's text for parts of these names, texts, answers and argument counts:
    the same few shapes come back for every job, so each is checked and renumbered once."""
    ctes: list[str] = []
    counts: list[str] = []
    offset = 0
    for name, text, value, arity in shape:
        if not _NAME.fullmatch(name):
            raise ValueError(f"part name {name!r} is not a plain identifier")
        sql = text.strip()
        if "returning" not in sql.lower() and not sql.lower().startswith(("select", "with")):
            raise ValueError(f"part {name!r} returns no rows: add a RETURNING clause")
        if value is not None and not _NAME.fullmatch(value):
            raise ValueError(f"part {name!r}: value {value!r} is not a plain column name")
        ctes.append(f"{name} AS ({_shifted(sql, offset)})")
        if value is None:
            counts.append(f"(SELECT count(*) FROM {name}) AS {name}")
        else:
            counts.append(f"(SELECT {value} FROM {name} LIMIT 1) AS {name}")
        offset += arity
    return f"WITH {', '.join(ctes)} SELECT {', '.join(counts)}"


async def write_together(conn: Connection, parts: Mapping[str, Part], doing: str) -> dict[str, Any]:
    """Run the parts as one statement; by name, each part's row count or value."""
    sql, args = together_sql(parts)
    with map_db_errors(doing):
        row = await conn.fetchrow(sql, *args)
    assert row is not None
    return {name: row[name] for name in parts}


def require(condition: str, code: str, message: str, args: Sequence[Any] = ()) -> Part:
    """A part that raises SQLSTATE ``code`` (``AV`` + three, not ``AVL``) unless
    ``condition``, an SQL expression over earlier parts and ``args``, is true; answers
    true."""
    if not _CODE.fullmatch(code):
        raise ValueError(f"requirement code {code!r} is not of the form AVXnn")
    n = len(args) + 1
    return Part(f"SELECT aivedio_require({condition}, '{code}', ${n}) AS ok", (*args, message))


def unmet(exc: DatabaseError) -> str | None:
    """The code of the ``require`` part whose condition failed, or None."""
    code = getattr(exc.__cause__, "sqlstate", None)
    return code if isinstance(code, str) and _CODE.fullmatch(code) else None
