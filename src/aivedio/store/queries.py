"""Named SQL statements, read once from ``sql/queries.sql`` (``-- name: x`` blocks).

A block may include another one as ``{{name}}`` (a fragment two statements share, such as
the acknowledgement CTEs of ``complete`` and ``claim``)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


@cache
def _load() -> dict[str, str]:
    text = resources.files("aivedio.store").joinpath("sql", "queries.sql").read_text("utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name:
                queries[name] = "\n".join(lines).strip().rstrip(";")
            name, lines = line.removeprefix("-- name:").strip(), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    if name:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return {n: _INCLUDE.sub(lambda m: queries[m.group(1)], q) for n, q in queries.items()}


def query(name: str) -> str:
    """The statement called ``name``; KeyError names an unknown one at import-time tests."""
    return _load()[name]


def names() -> frozenset[str]:
    return frozenset(_load())
