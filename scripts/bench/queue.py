"""Queue benchmark: aivedio's job queue against procrastinate and the raw SQL ceiling.

All in one run, on one PostgreSQL server:

1. enqueue rate: N no-op jobs through ``Queue.enqueue`` in transactions of 1,000, and a
   sample enqueued one job per transaction (one callback, one transaction);
2. drain rate through real ``aivedio worker`` processes, 1 and then 2 of them, measured in
   the database from the first claim to the last acknowledgement; every execution is
   journalled and counted per job id (duplicates must be zero);
3. enqueue-to-start latency while the queue is not saturated (NOTIFY wake-up): jobs enqueued
   one per transaction at a steady rate into idle workers; p50/p99 of started_at - created_at;
4. procrastinate draining the same N no-op jobs (``procrastinate_drain.py``, run from its own
   virtualenv so it never becomes a dependency of aivedio);
5. the SQL path's ceiling: a raw asyncpg loop claiming 32 rows with SKIP LOCKED and
   acknowledging them with one CAS statement, and the same loop one row per round trip.

Usage: .venv/bin/python scripts/bench/queue.py [--jobs 20000] [--server-dsn DSN] [--smoke]
Prints a Markdown table (for docs/benchmarks.md) and a JSON line with every figure. With
``--smoke``: a few hundred jobs, procrastinate with one process, and the results checked for
sanity (every job done exactly once, every worker stopped cleanly) instead of the targets.
Every worker's log is kept in the run's directory (``--workdir``, or a temporary one); a worker
that exits by itself fails the run at once with the end of its log.
"""

from __future__ import annotations

import sys

# This file is named queue.py (the issue names it); run as a script, its folder would shadow
# the standard library's queue module for every import below. Drop the folder from the path.
if sys.path and sys.path[0] and __file__.startswith(sys.path[0]):
    sys.path.pop(0)

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from aivedio.config.load import DatabaseConfig
from aivedio.store import migrations
from aivedio.store.database import open_pool
from aivedio.store.queue import Queue
from aivedio.worker.kinds import default_registry

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "lib"))
from children import Child, Children, environ_without_aivedio  # noqa: E402
from smoke import positive, verdict  # noqa: E402

REGISTRY = default_registry()
KEY = base64.b64encode(os.urandom(32)).decode()
# Databases of this run alone: two runs on one server (a smoke run in a test suite beside a
# run by hand) do not drop each other's.
DB, DB_RAW, DB_PQ, DB_TEMPLATE = (
    f"aivedio_bench{kind}_{os.getpid()}" for kind in ("", "_raw", "_pq", "_template")
)


STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[bench {time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def dsn_for(server: str, name: str) -> str:
    return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))


async def migrated_database(server: str) -> str:
    """DB afresh, cloned from a template migrated once per run (migrating takes seconds)."""
    admin = await asyncpg.connect(server)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DB_TEMPLATE):
            await admin.execute(f"CREATE DATABASE {DB_TEMPLATE}")
            conn = await asyncpg.connect(dsn_for(server, DB_TEMPLATE))
            try:
                await migrations.migrate(conn)
            finally:
                await conn.close()
        await admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {DB} TEMPLATE {DB_TEMPLATE}")
    finally:
        await admin.close()
    return dsn_for(server, DB)


async def recreate_database(server: str, name: str) -> str:
    conn = await asyncpg.connect(server)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return dsn_for(server, name)


# -- aivedio ----------------------------------------------------------------------------------


async def enqueue_batched(dsn: str, count: int, prefix: str) -> float:
    async with open_pool(DatabaseConfig(url=dsn), min_size=1, max_size=2) as pool:
        queue = Queue(pool)
        specs = [REGISTRY.spec("diag.noop", f"{prefix}-{i}") for i in range(count)]
        started = time.perf_counter()
        for start in range(0, count, 1000):
            async with pool.acquire() as conn, conn.transaction():
                await queue.enqueue(conn, specs[start : start + 1000])
        return time.perf_counter() - started


async def enqueue_singly(dsn: str, count: int, prefix: str, rate: float | None = None) -> float:
    async with open_pool(DatabaseConfig(url=dsn), min_size=1, max_size=2) as pool:
        queue = Queue(pool)
        started = time.perf_counter()
        async with pool.acquire() as conn:
            for i in range(count):
                if rate:
                    await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
                await queue.enqueue_one(conn, REGISTRY.spec("diag.noop", f"{prefix}-{i}"))
        return time.perf_counter() - started


def write_worker_config(path: Path, dsn: str, journal: Path, slots: int) -> None:
    path.write_text(
        f"""
[database]
url = "{dsn}"
pool_max_size = 8
[worker]
http_port = 0
claim_batch_max = {slots}
[worker.lanes.control]
slots = {slots}
[worker.lanes.fetch]
slots = 0
[worker.lanes.media]
slots = 0
[log]
# info: the start-up events (http_listening) the script waits for; no job is logged at info.
level = "info"
format = "json"
[diagnostics]
execution_journal_dir = "{journal}"
# A worker publishes assets, so it refuses to start without a moderation backend; these
# workers run only no-op jobs, so the local one that allows everything will do.
[moderation]
backend = "local"
[moderation.local]
allow_all = true
# Only the benchmark's jobs in the queue: no periodic sweep job seeded at start.
[sweeper]
periodic = false
"""
    )


def start_workers(children: Children, config: Path, count: int, label: str) -> list[Child]:
    env = environ_without_aivedio(AIVEDIO_CONFIG=str(config), AIVEDIO_URL_ENCRYPTION_KEY=KEY)
    argv = [sys.executable, "-m", "aivedio", "worker"]
    return [children.start(f"worker {label}.{n}", argv, env=env) for n in range(1, count + 1)]


def stop_workers(children: Children, workers: list[Child]) -> list[int | None]:
    children.stop(workers, timeout=60)
    return [w.returncode for w in workers]


async def wait_for_history(dsn: str, count: int, limit_seconds: float = 600) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + limit_seconds
        while time.monotonic() < deadline:
            if await conn.fetchval(HISTORY_COUNT) >= count:
                return
            await asyncio.sleep(0.05)
        done = await conn.fetchval(HISTORY_COUNT)
        raise SystemExit(f"{done} of {count} jobs drained within {limit_seconds:g} s")
    finally:
        await conn.close()


HISTORY_COUNT = "SELECT count(*) FROM job_history WHERE kind = 'diag.noop'"


def journal_duplicates(journal: Path) -> tuple[int, int]:
    counts: Counter[str] = Counter()
    for file in journal.glob("executions-*.log"):
        counts.update(line.split()[0] for line in file.read_text().splitlines())
    return len(counts), sum(1 for c in counts.values() if c > 1)


async def aivedio_drain(
    children: Children, server: str, jobs: int, processes: int, slots: int, workdir: Path
) -> dict[str, Any]:
    dsn = await migrated_database(server)
    enqueue_seconds = await enqueue_batched(dsn, jobs, f"p{processes}")
    journal = workdir / f"journal-{processes}"
    shutil.rmtree(journal, ignore_errors=True)  # a kept --workdir: job ids start at 1 again
    config = workdir / f"worker-{processes}.toml"
    write_worker_config(config, dsn, journal, slots)
    workers = start_workers(children, config, processes, f"drain-{processes}")
    try:
        for worker in workers:  # all running (the drain is timed in the database), and a
            # SIGTERM below never meets one that is still starting
            await asyncio.to_thread(worker.wait_for_event, "http_listening")
        await wait_for_history(dsn, jobs)
    finally:
        codes = stop_workers(children, workers)
    conn = await asyncpg.connect(dsn)
    row = await conn.fetchrow(
        "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'succeeded') AS ok,"
        " extract(epoch FROM max(finished_at) - min(started_at)) AS seconds"
        " FROM job_history WHERE kind = 'diag.noop'"
    )
    await conn.close()
    executed, duplicates = journal_duplicates(journal)
    seconds = float(row["seconds"])
    return {
        "processes": processes,
        "slots": slots,
        "jobs": jobs,
        "succeeded": row["ok"],
        "enqueue_seconds": enqueue_seconds,
        "enqueue_jobs_per_second": jobs / enqueue_seconds,
        "drain_seconds": seconds,
        "drain_jobs_per_second": jobs / seconds,
        "executed": executed,
        "duplicate_executions": duplicates,
        "exit_codes": codes,
    }


async def aivedio_latency(
    children: Children, server: str, jobs: int, rate: float, workdir: Path
) -> dict[str, Any]:
    dsn = await migrated_database(server)
    config = workdir / "worker-latency.toml"
    write_worker_config(config, dsn, workdir / "journal-latency", 16)
    workers = start_workers(children, config, 2, "latency")
    try:
        for worker in workers:  # both idle and listening
            await asyncio.to_thread(worker.wait_for_event, "http_listening")
        await asyncio.sleep(0.5)
        single_seconds = await enqueue_singly(dsn, jobs, "lat", rate=rate)
        await wait_for_history(dsn, jobs)
    finally:
        codes = stop_workers(children, workers)
    conn = await asyncpg.connect(dsn)
    rows = await conn.fetch(
        "SELECT extract(epoch FROM started_at - created_at) * 1000 AS ms FROM job_history"
        " WHERE kind = 'diag.noop'"
    )
    await conn.close()
    latencies = sorted(float(r["ms"]) for r in rows)
    q = statistics.quantiles(latencies, n=100, method="inclusive")  # never above the max
    return {
        "jobs": jobs,
        "rate_per_second": rate,
        "p50_ms": q[49],
        "p99_ms": q[98],
        "max_ms": latencies[-1],
        "single_enqueue_seconds": single_seconds,
        "exit_codes": codes,
    }


async def single_enqueue_rate(server: str, jobs: int) -> float:
    dsn = await migrated_database(server)
    return jobs / await enqueue_singly(dsn, jobs, "one")


# -- the raw SQL ceiling -------------------------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE raw_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    owner text,
    token bigint NOT NULL DEFAULT 0
);
CREATE INDEX raw_jobs_queued ON raw_jobs (id) WHERE status = 'queued';
"""
RAW_CLAIM = """
UPDATE raw_jobs j SET status = 'running', owner = $2, token = j.token + 1
FROM (SELECT id FROM raw_jobs WHERE status = 'queued' ORDER BY id LIMIT $1
      FOR UPDATE SKIP LOCKED) c
WHERE j.id = c.id
RETURNING j.id, j.token
"""
RAW_ACK = """
UPDATE raw_jobs j SET status = 'succeeded'
FROM unnest($1::bigint[], $2::bigint[]) AS a(id, token)
WHERE j.id = a.id AND j.token = a.token AND j.owner = $3 AND j.status = 'running'
"""


async def raw_loop(server: str, jobs: int, batch: int) -> float:
    dsn = await recreate_database(server, DB_RAW)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(RAW_SCHEMA)
        await conn.execute(
            "INSERT INTO raw_jobs (status) SELECT 'queued' FROM generate_series(1, $1)", jobs
        )
        await conn.execute("VACUUM ANALYZE raw_jobs")
        done = 0
        started = time.perf_counter()
        while True:
            rows = await conn.fetch(RAW_CLAIM, batch, "raw")
            if not rows:
                break
            await conn.execute(RAW_ACK, [r["id"] for r in rows], [r["token"] for r in rows], "raw")
            done += len(rows)
        seconds = time.perf_counter() - started
        assert done == jobs, (done, jobs)
        return jobs / seconds
    finally:
        await conn.close()


# -- procrastinate ----------------------------------------------------------------------------


async def procrastinate_drain(
    children: Children, server: str, jobs: int, concurrency: int, processes: int
) -> dict[str, Any]:
    # procrastinate and psycopg are development dependencies (pyproject's dev extras), so
    # they are in .venv on a fresh clone; aivedio itself never imports them.
    dsn = await recreate_database(server, DB_PQ)
    figures: dict[str, Any] = await asyncio.to_thread(
        children.run_json,
        f"procrastinate x {processes}",
        [
            sys.executable,
            str(ROOT / "scripts" / "bench" / "procrastinate_drain.py"),
            "--dsn",
            dsn,
            "--jobs",
            str(jobs),
            "--concurrency",
            str(concurrency),
            "--processes",
            str(processes),
        ],
    )
    return figures


# -- report -----------------------------------------------------------------------------------


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, Python {platform.python_version()}"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=32, help="control-lane slots per worker")
    parser.add_argument(
        "--server-dsn",
        default=os.environ.get("AIVEDIO_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--latency-jobs", type=int, default=1000)
    parser.add_argument("--latency-rate", type=float, default=200.0)
    parser.add_argument("--skip-procrastinate", action="store_true")
    parser.add_argument("--workdir", help="where the worker logs and configs go (default: temp)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes (300 jobs, 60 for latency, procrastinate 100 with 1 process); check "
        "that the results are sane instead of the targets",
    )
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.latency_jobs, args.latency_rate = 300, 60, 100.0
    server = args.server_dsn
    conn = await asyncpg.connect(server)
    pg_version = await conn.fetchval("SHOW server_version")
    await conn.close()

    results: dict[str, Any] = {"machine": machine(), "postgresql": pg_version, "jobs": args.jobs}
    with contextlib.ExitStack() as stack:
        if args.workdir:
            work = Path(args.workdir)  # made with its logs/ folder by Children
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="aivedio-bench-")))
        try:
            with Children(work / "logs") as children:
                await run_all(children, args, server, work, results)
        finally:
            for name in (DB, DB_RAW, DB_PQ, DB_TEMPLATE):
                conn = await asyncpg.connect(server)
                await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                await conn.close()

    print(report(results))
    print(json.dumps(results, default=str))
    if args.smoke:
        return verdict("queue", sanity(results))
    return 0 if targets(results)[1] else 1


async def run_all(
    children: Children, args: argparse.Namespace, server: str, work: Path, results: dict[str, Any]
) -> None:
    log("raw SQL ceiling: batched (32) and one per round trip")
    results["raw_batched_jobs_per_second"] = await raw_loop(server, args.jobs, 32)
    results["raw_single_jobs_per_second"] = await raw_loop(server, args.jobs, 1)
    for processes in (1, 2):
        log(f"aivedio: enqueue {args.jobs}, drain with {processes} worker process(es)")
        results[f"aivedio_{processes}"] = await aivedio_drain(
            children, server, args.jobs, processes, args.slots, work
        )
    log("aivedio: one job per enqueue transaction")
    results["aivedio_single_enqueue_jobs_per_second"] = await single_enqueue_rate(
        server, min(args.jobs, 5000)
    )
    log(f"aivedio: enqueue-to-start latency at {args.latency_rate:g} jobs/s")
    results["aivedio_latency"] = await aivedio_latency(
        children, server, args.latency_jobs, args.latency_rate, work
    )
    if not args.skip_procrastinate:
        jobs = 100 if args.smoke else args.jobs  # it drains a few hundred a second
        for processes in (1,) if args.smoke else (1, 2):
            log(f"procrastinate: {jobs} jobs, {processes} process(es), concurrency 16")
            results[f"procrastinate_{processes}"] = await procrastinate_drain(
                children, server, jobs, 16, processes
            )


def sanity(r: dict[str, Any]) -> list[str]:
    """What a smoke run must show: every job done exactly once, every worker stopped with 0,
    every rate a positive number."""
    problems = []
    for p in (1, 2):
        a = r[f"aivedio_{p}"]
        if not (a["succeeded"] == a["executed"] == a["jobs"]):
            problems.append(
                f"aivedio x {p}: {a['succeeded']} succeeded and {a['executed']} executed "
                f"of {a['jobs']}"
            )
        if a["duplicate_executions"]:
            problems.append(f"aivedio x {p}: {a['duplicate_executions']} duplicate executions")
        if a["exit_codes"] != [0] * p:
            problems.append(f"aivedio x {p}: workers exited {a['exit_codes']} when stopped")
        for key in ("enqueue_jobs_per_second", "drain_jobs_per_second"):
            if not positive(a[key]):
                problems.append(f"aivedio x {p}: {key} = {a[key]}")
    lat = r["aivedio_latency"]
    if lat["exit_codes"] != [0, 0] or not all(positive(lat[k]) for k in ("p50_ms", "max_ms")):
        problems.append(f"latency run: {lat}")
    rates = (
        "raw_batched_jobs_per_second",
        "raw_single_jobs_per_second",
        "aivedio_single_enqueue_jobs_per_second",
    )
    problems += [f"{key} = {r[key]}" for key in rates if not positive(r[key])]
    for key in ("procrastinate_1", "procrastinate_2"):
        pq = r.get(key)
        if pq and (pq["succeeded"] != pq["jobs"] or not positive(pq["drain_jobs_per_second"])):
            problems.append(f"{key}: {pq}")
    return problems


def targets(r: dict[str, Any]) -> tuple[list[str], bool]:
    best = max(r["aivedio_1"]["drain_jobs_per_second"], r["aivedio_2"]["drain_jobs_per_second"])
    lines = []
    ok = True

    def check(name: str, passed: bool, detail: str) -> None:
        nonlocal ok
        ok = ok and passed
        lines.append(f"| {name} | {detail} | {'met' if passed else 'NOT MET'} |")

    if "procrastinate_1" in r:
        pq = max(
            r[key]["drain_jobs_per_second"]
            for key in ("procrastinate_1", "procrastinate_2")
            if key in r
        )
        check("≥ 15x procrastinate's drain", best >= 15 * pq, f"{best / pq:.1f}x")
    check("≥ 5,000 jobs/s", best >= 5000, f"{best:,.0f} jobs/s")
    ceiling = r["raw_batched_jobs_per_second"]
    check("≥ 25% of the raw batched ceiling", best >= 0.25 * ceiling, f"{best / ceiling:.0%}")
    dups = r["aivedio_1"]["duplicate_executions"] + r["aivedio_2"]["duplicate_executions"]
    check("zero duplicate executions", dups == 0, f"{dups} duplicates")
    p99 = r["aivedio_latency"]["p99_ms"]
    check("p99 enqueue-to-start < 50 ms (not saturated)", p99 < 50, f"{p99:.1f} ms")
    return lines, ok


def report(r: dict[str, Any]) -> str:
    rows = [
        "| what | enqueue (jobs/s) | drain (jobs/s) | notes |",
        "|---|---:|---:|---|",
    ]
    for p in (1, 2):
        a = r[f"aivedio_{p}"]
        rows.append(
            f"| aivedio worker x {p} ({a['slots']} slots each) | "
            f"{a['enqueue_jobs_per_second']:,.0f} (batches of 1,000) | "
            f"{a['drain_jobs_per_second']:,.0f} | {a['succeeded']} succeeded, "
            f"{a['executed']} executed, {a['duplicate_executions']} duplicates |"
        )
    rows.append(
        f"| aivedio, one job per enqueue transaction | "
        f"{r['aivedio_single_enqueue_jobs_per_second']:,.0f} | | |"
    )
    for p in (1, 2):
        if f"procrastinate_{p}" in r:
            q = r[f"procrastinate_{p}"]
            rows.append(
                f"| procrastinate {q.get('version', '')} x {p} (concurrency "
                f"{q.get('concurrency')}) | {q['enqueue_jobs_per_second']:,.0f} | "
                f"{q['drain_jobs_per_second']:,.0f} | {q.get('succeeded')} succeeded |"
            )
    rows.append(
        f"| raw asyncpg loop, claim 32 + one CAS ack | | "
        f"{r['raw_batched_jobs_per_second']:,.0f} | the SQL path's ceiling |"
    )
    rows.append(
        f"| raw asyncpg loop, one job per round trip | | {r['raw_single_jobs_per_second']:,.0f} | |"
    )
    lat = r["aivedio_latency"]
    rows += [
        "",
        f"Enqueue-to-start latency, {lat['jobs']} jobs enqueued one per transaction at "
        f"{lat['rate_per_second']:g}/s into 2 idle workers: p50 {lat['p50_ms']:.1f} ms, "
        f"p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms.",
        "",
        "| target | measured | |",
        "|---|---|---|",
        *targets(r)[0],
        "",
        f"Machine: {r['machine']}; PostgreSQL {r['postgresql']}.",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
