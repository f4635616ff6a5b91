"""Baseline benchmark: how fast procrastinate (3.x, psycopg 3) drains N no-op jobs.

The database named by ``--dsn`` must exist and be empty; procrastinate's schema is
applied to it. The script then

1. enqueues N jobs of a no-op async task with ``Task.batch_defer_async`` in chunks
   (``--batch-size``, default 1000) and times that (``enqueue_seconds``);
2. starts P worker processes (this same script in ``--worker`` mode), each running
   ``App.run_worker_async(concurrency=C, wait=False, listen_notify=False)``. Every
   worker imports procrastinate and opens its connection pool first, reports
   ``ready``, and waits for ``go`` on stdin, so interpreter start-up is not timed;
3. times ``drain_seconds`` from sending ``go`` until a poll of ``procrastinate_jobs``
   (every ``--poll-interval`` s) sees no job left in ``todo`` or ``doing``, i.e. all N
   in a finished status;
4. checks every job succeeded exactly once: N rows ``succeeded`` and none in any
   other status, one ``started`` event per job, and (when every worker reported)
   the sum of the task's in-process execution counters equals N.

With ``wait=False`` each worker stops by itself once it finds no job left; a worker
still running after the drain is sent SIGTERM, then SIGKILL. The whole run is
bounded by ``--timeout`` (default 600 s); past it the script exits 1.

Prints one JSON line on stdout; logs go to stderr (``-v`` for more). Run it with
an interpreter that has ``procrastinate`` and ``psycopg[binary]`` installed, e.g.::

    var/bench-venv/bin/python scripts/bench/procrastinate_drain.py \\
        --dsn postgresql://postgres@127.0.0.1:5432/pq_bench_try --jobs 2000 --concurrency 16
"""

from __future__ import annotations

import os
import sys

# Run as ``python scripts/bench/procrastinate_drain.py``, Python puts scripts/bench/ first on
# sys.path, where the repo's queue.py benchmark would shadow the stdlib ``queue`` module that
# procrastinate imports (through asgiref and concurrent.futures). Nothing is imported from
# that directory, so take it off the path before any other import.
if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.dirname(
    os.path.realpath(__file__)
):
    sys.path.pop(0)

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import time
from dataclasses import dataclass
from importlib.metadata import version as package_version
from typing import Any

import procrastinate
import psycopg

LOG = logging.getLogger("procrastinate_drain")

TASK_NAME = "bench_noop"
READY_LINE = "ready"
GO_LINE = "go\n"
WORKER_EXIT_GRACE_SECONDS = 30.0
WORKER_KILL_GRACE_SECONDS = 10.0
SCRIPT_PATH = os.path.abspath(__file__)


class BenchError(Exception):
    """A failure that ends the benchmark with exit status 1 and a message."""


class _Executions:
    count = 0


async def _noop() -> None:
    _Executions.count += 1


def _not_app_in_main(record: logging.LogRecord) -> bool:
    # procrastinate warns when the App lives in __main__, because a worker started with
    # ``procrastinate --app=...`` would import a second copy of the module. Here the workers
    # run this same script and find the task by its explicit name, so the warning is noise.
    return getattr(record, "action", None) != "app_defined_in___main__"


def _build_app(dsn: str, *, pool_min: int, pool_max: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=pool_min, max_size=pool_max)
    app = procrastinate.App(connector=connector)
    app.task(name=TASK_NAME)(_noop)
    return app


# --------------------------------------------------------------------------- worker


async def _worker_main(args: argparse.Namespace) -> int:
    # One connection for fetching, up to C for finishing jobs, one spare.
    app = _build_app(args.dsn, pool_min=2, pool_max=args.concurrency + 2)
    async with app.open_async():
        print(READY_LINE, flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line != GO_LINE:
            LOG.error("worker %d: no go signal (got %r), exiting", args.worker_index, line)
            return 2
        await app.run_worker_async(
            name=f"bench-{args.worker_index}",
            concurrency=args.concurrency,
            wait=False,
            listen_notify=False,
            install_signal_handlers=True,
        )
    print(json.dumps({"executed": _Executions.count}), flush=True)
    return 0


# --------------------------------------------------------------------------- parent


@dataclass
class _Worker:
    index: int
    proc: asyncio.subprocess.Process
    executed: int | None = None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BenchError("overall timeout reached")
    return left


async def _prepare_and_enqueue(args: argparse.Namespace, deadline: float) -> float:
    async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
        cur = await conn.execute("select to_regclass('procrastinate_jobs') is not null")
        row = await cur.fetchone()
        if row is None or row[0]:
            raise BenchError("database already has procrastinate_jobs; pass an EMPTY database")

    app = _build_app(args.dsn, pool_min=1, pool_max=2)
    async with app.open_async():
        await asyncio.wait_for(app.schema_manager.apply_schema_async(), _remaining(deadline))
        LOG.info("schema applied")
        task = app.tasks[TASK_NAME]
        started = time.perf_counter()
        left = args.jobs
        while left > 0:
            chunk = min(args.batch_size, left)
            await asyncio.wait_for(
                task.batch_defer_async(*({} for _ in range(chunk))), _remaining(deadline)
            )
            left -= chunk
        enqueue_seconds = time.perf_counter() - started
    LOG.info("enqueued %d jobs in %.3f s", args.jobs, enqueue_seconds)
    return enqueue_seconds


async def _spawn_worker(args: argparse.Namespace, index: int) -> _Worker:
    cmd = [
        sys.executable,
        SCRIPT_PATH,
        "--worker",
        "--worker-index",
        str(index),
        "--dsn",
        args.dsn,
        "--jobs",
        str(args.jobs),
        "--concurrency",
        str(args.concurrency),
    ]
    cmd += ["-v"] * args.verbose
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    return _Worker(index=index, proc=proc)


async def _read_line(worker: _Worker, wait_seconds: float) -> str:
    assert worker.proc.stdout is not None
    raw = await asyncio.wait_for(worker.proc.stdout.readline(), wait_seconds)
    return raw.decode().strip()


async def _status_counts(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    cur = await conn.execute("select status::text, count(*) from procrastinate_jobs group by 1")
    return {status: count for status, count in await cur.fetchall()}


async def _unfinished(conn: psycopg.AsyncConnection[Any]) -> int:
    # Served by procrastinate's partial index on status in ('todo', 'doing'), so the poll
    # stays cheap (a full group-by scan every 20 ms would take a visible share of the
    # server's CPU at 20,000 jobs). Every other status is a finished one.
    cur = await conn.execute(
        "select count(*) from procrastinate_jobs where status in ('todo', 'doing')"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _drain(args: argparse.Namespace, workers: list[_Worker], deadline: float) -> float:
    for worker in workers:
        line = await _read_line(worker, min(60.0, _remaining(deadline)))
        if line != READY_LINE:
            raise BenchError(f"worker {worker.index} did not start (said {line!r})")
    LOG.info("%d worker(s) ready", len(workers))

    async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
        started = time.perf_counter()
        for worker in workers:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(GO_LINE.encode())
            await worker.proc.stdin.drain()
        while True:
            if await _unfinished(conn) == 0:
                drain_seconds = time.perf_counter() - started
                break
            for worker in workers:
                rc = worker.proc.returncode
                if rc not in (None, 0):
                    raise BenchError(f"worker {worker.index} exited with status {rc}")
            if all(w.proc.returncode is not None for w in workers):
                # The last worker may have finished between the poll and this check.
                if await _unfinished(conn) == 0:
                    drain_seconds = time.perf_counter() - started
                    break
                counts = await _status_counts(conn)
                raise BenchError(f"all workers exited before the drain finished: {counts}")
            if time.monotonic() >= deadline:
                counts = await _status_counts(conn)
                raise BenchError(f"overall timeout reached while draining: {counts}")
            await asyncio.sleep(args.poll_interval)
    LOG.info("drained %d jobs in %.3f s", args.jobs, drain_seconds)
    return drain_seconds


async def _collect_workers(workers: list[_Worker]) -> None:
    """Let workers exit by themselves (wait=False), read their counters, stop stragglers."""
    for worker in workers:
        with contextlib.suppress(TimeoutError, ValueError, KeyError):
            line = await _read_line(worker, WORKER_EXIT_GRACE_SECONDS)
            worker.executed = int(json.loads(line)["executed"])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(worker.proc.wait(), WORKER_EXIT_GRACE_SECONDS)
    await _stop_workers(workers)
    for worker in workers:
        if worker.proc.returncode != 0:
            raise BenchError(f"worker {worker.index} exited with status {worker.proc.returncode}")


async def _stop_workers(workers: list[_Worker]) -> None:
    """SIGTERM the workers still running (procrastinate stops gracefully), then SIGKILL."""
    alive = [w for w in workers if w.proc.returncode is None]
    for worker in alive:
        LOG.warning("sending SIGTERM to worker %d", worker.index)
        worker.proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(w.proc.wait() for w in alive)), WORKER_EXIT_GRACE_SECONDS
        )
    for worker in alive:
        if worker.proc.returncode is None:
            LOG.warning("killing worker %d", worker.index)
            worker.proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.proc.wait(), WORKER_KILL_GRACE_SECONDS)


async def _verify(args: argparse.Namespace, workers: list[_Worker]) -> int:
    async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
        counts = await _status_counts(conn)
        cur = await conn.execute(
            "select count(*), count(distinct job_id) from procrastinate_events"
            " where type = 'started'"
        )
        row = await cur.fetchone()
    assert row is not None
    started_events, started_jobs = row
    succeeded = counts.get("succeeded", 0)
    if succeeded != args.jobs or sum(counts.values()) != args.jobs:
        raise BenchError(f"expected {args.jobs} succeeded jobs, got status counts {counts}")
    if started_events != args.jobs or started_jobs != args.jobs:
        raise BenchError(
            f"expected one start per job: {started_events} started events"
            f" for {started_jobs} jobs, {args.jobs} jobs enqueued"
        )
    reported = [w.executed for w in workers]
    if reported and all(n is not None for n in reported):
        executed = sum(n for n in reported if n is not None)
        if executed != args.jobs:
            raise BenchError(f"workers executed the task {executed} times for {args.jobs} jobs")
        LOG.info("per-worker executions: %s", reported)
    else:
        LOG.warning("not every worker reported its execution count: %s", reported)
    return succeeded


def _cancel_on_signals(task: asyncio.Task[Any]) -> None:
    """Turn SIGTERM (and SIGINT, unless ignored as in a background job) into cancellation,
    so that the parent's cleanup still stops its workers."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            loop.add_signal_handler(sig, task.cancel)


async def _parent_main(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    workers: list[_Worker] = []
    current = asyncio.current_task()
    assert current is not None
    _cancel_on_signals(current)
    try:
        enqueue_seconds = await _prepare_and_enqueue(args, deadline)
        for index in range(args.processes):
            workers.append(await _spawn_worker(args, index))
        drain_seconds = await _drain(args, workers, deadline)
        await _collect_workers(workers)
        succeeded = await _verify(args, workers)
    except (BenchError, TimeoutError) as exc:
        print(f"procrastinate_drain: {str(exc) or 'timeout'}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("procrastinate_drain: interrupted, stopping workers", file=sys.stderr)
        return 1
    finally:
        await _stop_workers(workers)

    result = {
        "library": "procrastinate",
        "version": package_version("procrastinate"),
        "jobs": args.jobs,
        "processes": args.processes,
        "concurrency": args.concurrency,
        "enqueue_seconds": round(enqueue_seconds, 6),
        "enqueue_jobs_per_second": round(args.jobs / enqueue_seconds, 1),
        "drain_seconds": round(drain_seconds, 6),
        "drain_jobs_per_second": round(args.jobs / drain_seconds, 1),
        "succeeded": succeeded,
    }
    print(json.dumps(result), flush=True)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True, help="libpq DSN of an existing, empty database")
    parser.add_argument("--jobs", type=_positive_int, required=True, help="number of jobs N")
    parser.add_argument(
        "--concurrency", type=_positive_int, required=True, help="jobs in flight per worker C"
    )
    parser.add_argument(
        "--processes", type=_positive_int, default=1, help="worker processes P (default 1)"
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=1000, help="jobs per batch_defer_async call"
    )
    parser.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="overall limit, seconds"
    )
    parser.add_argument(
        "--poll-interval", type=_positive_float, default=0.02, help="drain poll period, seconds"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more on stderr")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(process)d %(name)s: %(message)s"
    )
    logging.getLogger("procrastinate.blueprints").addFilter(_not_app_in_main)
    if args.worker:
        return asyncio.run(_worker_main(args))
    return asyncio.run(_parent_main(args))


if __name__ == "__main__":
    sys.exit(main())
