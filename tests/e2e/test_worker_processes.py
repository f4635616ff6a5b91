"""Worker daemons as processes: exactly-once under load, SIGKILL recovery, SIGTERM drain."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aivedio.store.database import Pool
from aivedio.store.queue import Queue
from aivedio.worker.kinds import default_registry
from tests.support.processes import WorkerProcess, journal_counts, write_config

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


async def enqueue(
    pool: Pool, kind: str, count: int, prefix: str, payload: dict[str, object] | None = None
) -> list[int]:
    queue = Queue(pool)
    ids: list[int] = []
    specs = [REGISTRY.spec(kind, f"{prefix}-{i}", payload=payload) for i in range(count)]
    for start in range(0, count, 1000):
        async with pool.acquire() as conn, conn.transaction():
            ids += [r.job_id for r in await queue.enqueue(conn, specs[start : start + 1000])]
    return ids


async def poll(pool: Pool, sql: str, want: object, timeout: float, *args: object) -> None:
    deadline = time.monotonic() + timeout
    value: object = None
    while time.monotonic() < deadline:
        value = await pool.fetchval(sql, *args)
        if value == want:
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"{sql!r} is {value!r}, wanted {want!r} within {timeout}s")


async def test_two_workers_complete_5000_jobs_exactly_once(
    pool: Pool, database: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    journal = tmp_path / "journal"
    config = write_config(tmp_path / "w.toml", database, control_slots=16, journal_dir=journal)
    for n in range(2):
        workers.append(WorkerProcess(config, tmp_path / f"w{n}.log"))
    # Both up first: on a fast host the first could run all 5000 before the second starts.
    ids = await enqueue(pool, "diag.noop", 5000, "bulk")
    await poll(pool, "SELECT count(*) FROM job_history WHERE status = 'succeeded'", 5000, 120)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [w.wait(30) for w in workers] == [0, 0]
    counts = journal_counts(journal)
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1, "a job ran twice"
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    # Both processes took part.
    owners = await pool.fetch("SELECT DISTINCT lease_owner FROM job_history")
    assert len(owners) == 2


async def test_sigkilled_workers_jobs_are_reclaimed_and_its_token_is_refused(
    pool: Pool, database: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    ids = await enqueue(pool, "diag.sleep", 4, "hang", payload={"seconds": 600, "retry_seconds": 2})
    config = write_config(
        tmp_path / "w.toml",
        database,
        lease_seconds=3,
        heartbeat_seconds=1,
        journal_dir=tmp_path / "journal",
    )
    doomed = WorkerProcess(config, tmp_path / "doomed.log")
    workers.append(doomed)
    await poll(pool, "SELECT count(*) FROM jobs WHERE status = 'running'", 4, 20)
    held = {
        r["id"]: (r["lease_owner"], r["lease_token"])
        for r in await pool.fetch("SELECT id, lease_owner, lease_token FROM jobs")
    }
    doomed.kill()

    survivor = WorkerProcess(config, tmp_path / "survivor.log")
    workers.append(survivor)
    # The survivor's reaper returns the leases once they expire, and it claims them.
    await poll(
        pool,
        "SELECT count(*) FROM jobs WHERE status = 'running' AND lease_owner <> $1",
        4,
        20,
        doomed.owner,
    )
    queue = Queue(pool)
    stale = [(job_id, token, None) for job_id, (_owner, token) in held.items()]
    assert await queue.complete(doomed.owner, stale) == set()
    await poll(pool, "SELECT count(*) FROM job_history WHERE status = 'succeeded'", 4, 30)
    rows = await pool.fetch("SELECT id, lease_owner, lease_token, attempts FROM job_history")
    assert {r["id"] for r in rows} == set(ids)
    for row in rows:
        assert row["lease_owner"] != doomed.owner
        assert row["lease_token"] == held[row["id"]][1] + 1
        assert row["attempts"] == 2
    assert any(e.get("event") == "lease_expired" for e in survivor.events())
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(20) == 0


async def test_sigterm_drains_finishes_running_work_and_releases_the_rest(
    pool: Pool, database: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    config = write_config(tmp_path / "w.toml", database, drain_timeout_seconds=3)
    worker = WorkerProcess(config, tmp_path / "w.log")
    workers.append(worker)
    (short,) = await enqueue(pool, "diag.sleep", 1, "short", payload={"seconds": 1.5})
    (long,) = await enqueue(pool, "diag.sleep", 1, "long", payload={"seconds": 600})
    await poll(pool, "SELECT count(*) FROM jobs WHERE status = 'running'", 2, 10)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    with anyio.fail_after(10):  # it has stopped claiming
        while "worker_draining" not in [e.get("event") for e in worker.events()]:
            await anyio.sleep(0.05)
    later = await enqueue(pool, "diag.noop", 5, "after-sigterm")
    assert worker.wait(10) == 0
    elapsed = time.monotonic() - started
    assert elapsed < 3 + 2.5, f"drain took {elapsed:.1f}s with a 3s drain timeout"

    finished = await pool.fetchrow("SELECT status FROM job_history WHERE id = $1", short)
    assert finished is not None and finished["status"] == "succeeded"
    released = await pool.fetchrow(
        "SELECT status, attempts, lease_owner FROM jobs WHERE id = $1", long
    )
    assert dict(released) == {"status": "queued", "attempts": 0, "lease_owner": None}
    untouched = await pool.fetch(
        "SELECT status, attempts FROM jobs WHERE id = ANY($1::bigint[])", later
    )
    assert [tuple(r) for r in untouched] == [("queued", 0)] * 5
    names = [e.get("event") for e in worker.events()]
    assert "worker_drain_timeout" in names and "leases_released" in names
