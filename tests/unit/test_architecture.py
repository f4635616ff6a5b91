"""The house rules, read from the source: imports run one way and never in a cycle, SQL lives
in the store, job specs come from the job contract, and no module outgrows its role.

Every ``import`` counts, at the top of a module or inside a function: a lazy import hides a
cycle from the interpreter, not from this test.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "aivedio"

SQL = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")
MAX_LINES = 600

# Floors, lowest first. An import may stay on its floor or go down, never up.
GROUND, CONFIG, EDGE, CORE, STAGES, ENTRY = range(6)
FLOOR_NAMES = (
    "ground",
    "config",
    "store/net/providers",
    "jobs/media/ffmpeg/upkeep",
    "stages",
    "entry",
)
CORE_PACKAGES = (
    "aivedio.pipeline.jobs",
    "aivedio.pipeline.media",
    "aivedio.pipeline.ffmpeg",
    "aivedio.pipeline.upkeep",
)


def floor(module: str) -> int:
    parts = module.split(".")
    if module == "aivedio.__main__":
        return ENTRY
    if len(parts) == 1 or (len(parts) == 2 and not (PACKAGE / parts[1]).is_dir()):
        return GROUND  # aivedio itself and its top-level modules
    top = parts[1]
    if top == "config":
        return CONFIG
    if top in ("store", "net", "providers"):
        return EDGE
    if top == "pipeline":
        if module == "aivedio.pipeline":
            return CORE
        if any(module == p or module.startswith(p + ".") for p in CORE_PACKAGES):
            return CORE
        return STAGES
    return ENTRY  # cli, api, worker, sim, __main__


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: dict[str, int] = field(default_factory=dict)  # module -> first line
    sql: list[int] = field(default_factory=list)
    hand_built_specs: list[int] = field(default_factory=list)


@cache
def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text()
        found[".".join(parts)] = Module(".".join(parts), path, text.count("\n"))
    for module in found.values():
        _read(module, found)
    return found


def _resolve(name: str, known: dict[str, Module]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _read(module: Module, known: dict[str, Module]) -> None:
    tree = ast.parse(module.path.read_text(), str(module.path))
    is_package = module.path.name == "__init__.py"
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.name.split(".")
                if not is_package:
                    here.pop()
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if SQL.search(node.value):
                module.sql.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "JobSpec":
                module.hand_built_specs.append(node.lineno)
        for target in targets:
            resolved = _resolve(target, known) if target.startswith("aivedio") else None
            if resolved and resolved != module.name:
                module.imports.setdefault(resolved, node.lineno)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _where(module: Module, line: int) -> str:
    return f"{module.path.relative_to(SRC.parent)}:{line}"


def test_the_walk_sees_the_package() -> None:
    """A guard for the guards: the rules below read real modules, imports and SQL."""
    found = modules()
    assert len(found) > 100
    assert "aivedio.store.queue" in found["aivedio.pipeline.jobs"].imports
    assert found["aivedio.store.queries"].sql or any(
        m.sql for n, m in found.items() if n.startswith("aivedio.store")
    )
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    graph = {name: set(m.imports) for name, m in modules().items()}
    # A package's __init__ re-exporting its own submodules is not a cycle of roles.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (lazy imports count): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_imports_run_downward() -> None:
    upward = []
    for name, module in modules().items():
        for target, line in module.imports.items():
            if floor(target) > floor(name) and not name.startswith(target + "."):
                upward.append(
                    f"{_where(module, line)}: {name} ({FLOOR_NAMES[floor(name)]}) imports "
                    f"{target} ({FLOOR_NAMES[floor(target)]})"
                )
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_sql_lives_in_the_store() -> None:
    outside = [
        f"{_where(m, line)}: {name}"
        for name, m in modules().items()
        if not name.startswith("aivedio.store")
        for line in m.sql
    ]
    assert not outside, "SQL text outside aivedio.store:\n" + "\n".join(outside)


def test_job_specs_come_from_the_contract() -> None:
    allowed = {"aivedio.pipeline.jobs", "aivedio.store.queue"}
    by_hand = [
        f"{_where(m, line)}: {name}"
        for name, m in modules().items()
        if name not in allowed
        for line in m.hand_built_specs
    ]
    assert not by_hand, "JobSpec built outside pipeline/jobs.py:\n" + "\n".join(by_hand)


def test_no_module_outgrows_its_role() -> None:
    big = [
        f"{m.path.relative_to(SRC.parent)}: {m.lines} lines"
        for m in modules().values()
        if m.lines > MAX_LINES
    ]
    assert not big, f"modules over {MAX_LINES} lines:\n" + "\n".join(big)


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("aivedio.errors", GROUND),
        ("aivedio.config.load", CONFIG),
        ("aivedio.store.queue", EDGE),
        ("aivedio.net.policy", EDGE),
        ("aivedio.pipeline.jobs", CORE),
        ("aivedio.pipeline.media.plan", CORE),
        ("aivedio.pipeline.upkeep.sweeper", CORE),
        ("aivedio.pipeline.publish", STAGES),
        ("aivedio.worker.daemon", ENTRY),
        ("aivedio.__main__", ENTRY),
    ],
)
def test_floors(module: str, expected: int) -> None:
    assert floor(module) == expected


def _graph_of(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    known: dict[str, Module] = {}
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = list(Path(rel).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        known[".".join(parts)] = Module(".".join(parts), path, text.count("\n"))
    for module in known.values():
        _read(module, known)
    return known


def test_the_reader_counts_lazy_and_relative_imports_and_sql(tmp_path: Path) -> None:
    found = _graph_of(
        tmp_path,
        {
            "aivedio/__init__.py": "",
            "aivedio/store/__init__.py": "",
            "aivedio/store/queue.py": "from . import rows\n",
            "aivedio/store/rows.py": "def f():\n    from aivedio.store import queue\n",
            "aivedio/api/x.py": 'Q = "SELECT 1"\nJobSpec(kind="k")\n',
        },
    )
    assert set(found["aivedio.store.queue"].imports) == {"aivedio.store.rows"}
    assert set(found["aivedio.store.rows"].imports) == {"aivedio.store.queue"}  # lazy, counted
    assert found["aivedio.api.x"].sql == [1] and found["aivedio.api.x"].hand_built_specs == [2]
