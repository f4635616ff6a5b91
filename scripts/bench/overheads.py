"""The unit costs behind the fleet benchmark's orchestration figure, each in isolation.

The event loop's own CPU (``time.thread_time``) per call, under uvloop as in the worker:

* a thread hop: ``anyio.to_thread.run_sync`` of a no-op, and the same through
  ``loop.run_in_executor`` (what anyio's machinery adds);
* a database round trip: ``pool.fetchval("SELECT 1")`` (acquire, query, release) and the
  same on a held connection (what the pool adds), against the local PostgreSQL;
* a process: ``subprocess.Popen`` + wait of ``ffprobe -version`` through the sandbox's
  ``prlimit``/``unshare`` chain, ``os.posix_spawn`` of the same, and the whole
  ``Sandbox.run`` (pipes read by callbacks, pidfd wait, group kill);
* a scratch directory made and removed (``mkdir``/``rmdir`` on ``[media] scratch_dir``'s
  filesystem, the system temporary directory by default).

Usage: .venv/bin/python scripts/bench/overheads.py [--n 2000] [--database-url URL] [--smoke]

``--smoke``: 50 calls per measure and 5 processes; every figure must be a positive number.

Only loopback addresses are contacted; nothing is written outside a temporary directory.
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import asyncpg

from aivedio.config.media import MediaConfig
from aivedio.pipeline.ffmpeg.sandbox import Sandbox

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from smoke import positive, verdict


async def per_call(n: int, call: Callable[[], Awaitable[object]]) -> float:
    """Microseconds of the loop thread's CPU per ``call``, after a warm-up."""
    for _ in range(max(n // 20, 5)):
        await call()
    started = time.thread_time()
    for _ in range(n):
        await call()
    return (time.thread_time() - started) / n * 1e6


def per_call_sync(n: int, call: Callable[[], object]) -> float:
    started = time.thread_time()
    for _ in range(n):
        call()
    return (time.thread_time() - started) / n * 1e6


def fs_type(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it)."""
    best, kind = "", "?"
    resolved = str(path.resolve())
    with open("/proc/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = fields[1]
            inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


async def main(args: argparse.Namespace) -> int:
    rows: list[tuple[str, float]] = []
    noop: Callable[[], None] = lambda: None  # noqa: E731
    rows.append(
        (
            "thread hop: anyio.to_thread.run_sync",
            await per_call(args.n, lambda: anyio.to_thread.run_sync(noop)),
        )
    )
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as executor:
        rows.append(
            (
                "thread hop: loop.run_in_executor",
                await per_call(args.n, lambda: loop.run_in_executor(executor, noop)),
            )
        )

    async def keep(_conn: object) -> None:
        pass

    pool = await asyncpg.create_pool(args.database_url, min_size=1, max_size=2, reset=keep)
    try:
        rows.append(
            (
                "round trip: pool.fetchval('SELECT 1')",
                await per_call(args.n, lambda: pool.fetchval("SELECT 1")),
            )
        )
        async with pool.acquire() as conn:
            rows.append(
                (
                    "round trip: the same on a held connection",
                    await per_call(args.n, lambda: conn.fetchval("SELECT 1")),
                )
            )
    finally:
        await pool.close()

    sandbox = Sandbox(MediaConfig())
    await sandbox.check()
    argv = [
        *sandbox._limit_prefix(),
        *(await sandbox.isolation_prefix()),
        sandbox._tool_path("ffprobe"),
        "-version",
    ]
    processes = args.processes or max(args.n // 10, 50)
    with tempfile.TemporaryDirectory() as scratch:

        def popen() -> None:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=scratch,
                env={"LC_ALL": "C"},
                start_new_session=True,
            )
            assert child.stdout is not None and child.stderr is not None
            child.stdout.close()
            child.stderr.close()
            child.wait()

        def posix_spawn() -> None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            pid = os.posix_spawn(
                argv[0],
                argv,
                {"LC_ALL": "C"},
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, err_w, 2),
                ],
            )
            for fd in (out_w, err_w, out_r, err_r):
                os.close(fd)
            os.waitpid(pid, 0)

        popen()
        rows.append(("process: Popen + wait, blocking", per_call_sync(processes, popen)))
        posix_spawn()
        rows.append(
            (
                "process: posix_spawn + waitpid, blocking (no cwd)",
                per_call_sync(processes, posix_spawn),
            )
        )
        where = Path(scratch)
        rows.append(
            (
                "process: Sandbox.run('ffprobe', ['-version'])",
                await per_call(
                    processes,
                    lambda: sandbox.run(
                        "ffprobe", ["-version"], cwd=where, deadline_seconds=30, capture_stdout=True
                    ),
                ),
            )
        )
    base = Path(MediaConfig().scratch_dir or tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=base) as scratch:
        names = [os.path.join(scratch, str(i)) for i in range(args.n)]
        started = time.thread_time()
        for name in names:
            os.mkdir(name)
        made = (time.thread_time() - started) / args.n * 1e6
        started = time.thread_time()
        for name in names:
            os.rmdir(name)
        removed = (time.thread_time() - started) / args.n * 1e6
    kind = fs_type(base)
    rows.append((f"directory: mkdir in {base} ({kind})", made))
    rows.append((f"directory: rmdir in {base} ({kind})", removed))

    print(
        f"{platform.node()}: {os.cpu_count()} cpus, Python {platform.python_version()}, "
        f"ffprobe {shutil.which('ffprobe')}"
    )
    print(f"{'loop thread CPU per call':<60} {'µs':>8}")
    for name, micros in rows:
        print(f"{name:<60} {micros:8.0f}")
    if not args.smoke:
        return 0
    return verdict("overheads", [f"{name}: {us} µs" for name, us in rows if not positive(us)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per measure")
    parser.add_argument("--processes", type=int, help="processes per measure (n / 10, >= 50)")
    parser.add_argument("--smoke", action="store_true", help="--n 50 --processes 5; sanity")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "AIVEDIO_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    if args.smoke:
        args.n, args.processes = 50, 5
    raise SystemExit(anyio.run(main, args, backend_options={"use_uvloop": True}))
