"""Nodes simulated on one machine: each worker pinned to CPUs of its own with ``taskset``.

Why: on this 2-core host one ffmpeg keeps about 1.9 cores busy, so two workers sharing both
cores cannot show what a second node adds; they split the same two cores. Pinning worker N
(``taskset -c CPUS aivedio worker``) to a disjoint set of CPUs makes it a node of its own on
the CPU axis: the affinity mask survives fork and exec, so every ffmpeg and ffprobe the worker
starts (through ``prlimit`` and ``unshare``, which exec it) runs on the worker's CPUs alone.
It is a cpuset by ``sched_setaffinity``, not a cgroup: the kernel keeps every other process
off nothing, so what is not pinned (PostgreSQL, the provider, the API, the benchmark itself)
runs on every CPU, the pinned ones included. Not simulated either: the shared caches, memory
bandwidth and disk of one machine.

ffmpeg sizes its own threads from the same mask: with ``[media] threads = 0`` (the default)
the worker passes no ``-threads``, and libavcodec (``av_cpu_count``) and x264 count the CPUs
of ``sched_getaffinity``; on one CPU an ffmpeg runs one thread. ``Affinity`` checks both
during a run: it reads ``Cpus_allowed_list`` and ``Threads`` from ``/proc/PID/status`` of each
worker and of every process below it, so a child that escaped its node is reported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METHOD = "taskset (sched_setaffinity), inherited by every child"


def node_cpus(nodes: int, cores_per_node: int = 1) -> list[str]:
    """``nodes`` disjoint CPU lists of ``cores_per_node`` CPUs each, from this process's own
    CPUs in order (``"0"``, ``"1"``; ``"0,1"``, ``"2,3"``)."""
    cpus = sorted(os.sched_getaffinity(0))
    if nodes * cores_per_node > len(cpus):
        raise SystemExit(
            f"--pin: {nodes} node(s) of {cores_per_node} CPU(s) need {nodes * cores_per_node} "
            f"CPUs; this process may use {len(cpus)} ({','.join(map(str, cpus))})"
        )
    if shutil.which("taskset") is None:
        raise SystemExit("--pin needs taskset (util-linux)")
    return [
        ",".join(str(c) for c in cpus[i * cores_per_node : (i + 1) * cores_per_node])
        for i in range(nodes)
    ]


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    """``argv`` run on ``cpus`` (unchanged when None); taskset execs it, so the pid is its."""
    return argv if cpus is None else ["taskset", "-c", cpus, *argv]


def cpu_list(text: str) -> set[int]:
    """``0-2,5`` as {0, 1, 2, 5}."""
    found: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            found.update(range(int(lo), int(hi or lo) + 1))
    return found


def status(pid: int) -> dict[str, str]:
    """Name, Cpus_allowed_list and Threads of ``/proc/PID/status``."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Name", "Cpus_allowed_list", "Threads"):
            found[key] = value.strip()
    return found


def parents() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    found, todo = [], list(tree.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, []))
    return found


@dataclass
class Affinity:
    """What the pinned workers and their children were allowed to run on, seen during a run."""

    expected: dict[str, str]  # worker name -> its CPU list
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    escaped: list[str] = field(default_factory=list)  # the first few, named
    escaped_total: int = 0
    snapshots: int = 0

    def _escaped(self, what: str) -> None:
        self.escaped_total += 1
        if len(self.escaped) < 20:
            self.escaped.append(what)

    def take(self, pids: dict[str, int]) -> None:
        """One look at each worker (by name, its pid) and every process below it."""
        tree = parents()
        self.snapshots += 1
        for name, pid in pids.items():
            want = cpu_list(self.expected[name])
            entry = self.seen.setdefault(
                name, {"cpus": self.expected[name], "worker_cpus": None, "children": {}}
            )
            with contextlib.suppress(OSError):
                entry["worker_cpus"] = status(pid)["Cpus_allowed_list"]
                if cpu_list(entry["worker_cpus"]) != want:
                    self._escaped(f"{name} (pid {pid}) on {entry['worker_cpus']}")
            for child in descendants(pid, tree):
                with contextlib.suppress(OSError, KeyError):
                    s = status(child)
                    kind = entry["children"].setdefault(
                        s["Name"], {"samples": 0, "pids": [], "max_threads": 0, "cpus": []}
                    )
                    kind["samples"] += 1
                    if child not in kind["pids"]:
                        kind["pids"].append(child)
                    kind["max_threads"] = max(kind["max_threads"], int(s["Threads"]))
                    if s["Cpus_allowed_list"] not in kind["cpus"]:
                        kind["cpus"].append(s["Cpus_allowed_list"])
                    if cpu_list(s["Cpus_allowed_list"]) != want:
                        self._escaped(
                            f"{name}: {s['Name']} (pid {child}) on {s['Cpus_allowed_list']}"
                        )

    def summary(self) -> dict[str, Any]:
        return {
            "method": METHOD,
            "snapshots": self.snapshots,
            "workers": {
                name: {
                    "cpus": e["cpus"],
                    "worker_cpus": e["worker_cpus"],
                    "children": {
                        comm: {
                            "processes": len(k["pids"]),
                            "samples": k["samples"],
                            "max_threads": k["max_threads"],
                            "cpus": k["cpus"],
                        }
                        for comm, k in e["children"].items()
                    },
                }
                for name, e in self.seen.items()
            },
            "escaped": self.escaped,
            "escaped_total": self.escaped_total,
        }


def describe(summary: dict[str, Any]) -> list[str]:
    """The report's lines on what ran where."""
    lines = [f"pinned by {summary['method']}; {summary['snapshots']} looks at /proc"]
    for name, w in summary["workers"].items():
        kids = ", ".join(
            f"{comm} x{k['processes']} on {'/'.join(k['cpus'])} (<= {k['max_threads']} threads)"
            for comm, k in sorted(w["children"].items())
        )
        lines.append(f"{name}: CPUs {w['cpus']}, itself on {w['worker_cpus']}; {kids or '-'}")
    if summary["escaped_total"]:
        lines.append(f"ESCAPED its node {summary['escaped_total']} time(s): {summary['escaped']}")
    return lines


def problems(summaries: list[dict[str, Any]], child: str = "ffmpeg") -> list[str]:
    """Pinned runs' affinity not shown: a process off its node in any run, or no ``child``
    seen below any worker of any run (so the look at /proc saw what it checks). Not one per
    worker: a smoke run's ffmpeg can start and end between two looks."""
    found = [f"processes off their node: {s['escaped']}" for s in summaries if s["escaped_total"]]
    seen = any(child in w["children"] for s in summaries for w in s["workers"].values())
    if not seen:
        found.append(f"no {child} seen below any worker: their CPUs were not checked")
    return found
