"""The worker in-process: failure classes, Retry-After, deadlines, health and metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest

from aivedio.config.load import Config, LaneConfig
from aivedio.store.database import Pool
from aivedio.store.queue import Queue
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()


@asynccontextmanager
async def running_worker(config: Config, pool: Pool) -> AsyncIterator[Worker]:
    worker = Worker(config, pool, REGISTRY)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        while worker.http_port is None:
            await anyio.sleep(0.01)
        try:
            yield worker
        finally:
            worker.request_drain(force=True)


async def enqueue(
    pool: Pool, kind: str, key: str, payload: dict[str, Any], max_attempts: int | None = None
) -> int:
    async with pool.acquire() as conn:
        result = await Queue(pool).enqueue_one(
            conn, REGISTRY.spec(kind, key, payload=payload, max_attempts=max_attempts)
        )
    return result.job_id


async def wait_for(pool: Pool, sql: str, *args: object, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await pool.fetchrow(sql, *args)
        if row is not None:
            return row
        await anyio.sleep(0.05)
    raise AssertionError(f"nothing for {sql!r} within {timeout}s")


def quick(config: Config, **queue: object) -> Config:
    return msgspec.structs.replace(config, queue=msgspec.structs.replace(config.queue, **queue))


async def test_deterministic_error_goes_dead_on_the_first_attempt(
    config: Config, pool: Pool
) -> None:
    job_id = await enqueue(pool, "diag.fail", "bad", {"error_class": "invalid_media"})
    async with running_worker(config, pool):
        row = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", job_id)
    assert row["status"] == "dead"
    assert row["attempts"] == 1
    assert row["last_error_class"] == "invalid_media"


async def test_transient_errors_retry_until_the_budget_then_go_dead(
    config: Config, pool: Pool
) -> None:
    config = quick(config, backoff_base_seconds=0.05, backoff_max_seconds=0.1)
    job_id = await enqueue(pool, "diag.fail", "flaky", {"error_class": "transient"}, max_attempts=3)
    async with running_worker(config, pool):
        row = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", job_id)
    assert row["status"] == "dead"
    assert row["attempts"] == 3
    assert row["last_error_class"] == "transient"


async def test_a_job_that_recovers_succeeds_after_retries(config: Config, pool: Pool) -> None:
    config = quick(config, backoff_base_seconds=0.05, backoff_max_seconds=0.1)
    job_id = await enqueue(
        pool, "diag.fail", "recovers", {"error_class": "provider_5xx", "fail_attempts": 2}
    )
    async with running_worker(config, pool):
        row = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", job_id)
    assert row["status"] == "succeeded"
    assert row["attempts"] == 3
    assert row["result"] == {"recovered_at_attempt": 3}


async def test_retry_after_overrides_the_backoff_schedule(config: Config, pool: Pool) -> None:
    # Backoff would retry within 50 ms; Retry-After says 1.5 s.
    config = quick(config, backoff_base_seconds=0.05, backoff_max_seconds=0.05)
    job_id = await enqueue(
        pool,
        "diag.fail",
        "throttled",
        {"error_class": "throttled", "retry_after": 1.5, "fail_attempts": 1},
    )
    async with running_worker(config, pool):
        # The database's own clock, not how soon this poll noticed: until the retry is
        # claimed, started_at is the first attempt's claim (before its failure) and run_after
        # the failure's now() plus the delay.
        history = "SELECT * FROM job_history WHERE id = $1"
        waiting = None
        with anyio.fail_after(15):
            while (row := await pool.fetchrow(history, job_id)) is None:
                waiting = waiting or await pool.fetchrow(
                    "SELECT started_at, run_after, last_error_class FROM jobs"
                    " WHERE id = $1 AND status IN ('waiting', 'queued') AND attempts = 1",
                    job_id,
                )
                await anyio.sleep(0.02)
    assert waiting is not None, "the retry was never seen waiting"
    assert waiting["last_error_class"] == "throttled"
    # Retry-After (1.5 s), not the backoff (at most 50 ms), counted from the failure...
    assert (waiting["run_after"] - waiting["started_at"]).total_seconds() >= 1.5
    # ...and the retry waited for it: the second attempt was claimed no sooner.
    assert row["started_at"] >= waiting["run_after"]
    assert row["status"] == "succeeded"
    assert row["attempts"] == 2


async def test_a_job_past_its_deadline_is_cancelled_and_retried(config: Config, pool: Pool) -> None:
    config = quick(config, backoff_base_seconds=0.05, backoff_max_seconds=0.05)
    async with pool.acquire() as conn:
        spec = msgspec.structs.replace(
            REGISTRY.spec("diag.sleep", "slow", payload={"seconds": 30, "retry_seconds": 0}),
            timeout_seconds=0.3,
        )
        job_id = (await Queue(pool).enqueue_one(conn, spec)).job_id
    async with running_worker(config, pool):
        row = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", job_id)
    assert row["status"] == "succeeded"
    assert row["attempts"] == 2
    assert row["last_error_class"] == "deadline_exceeded"


async def test_unknown_kind_is_not_lost(config: Config, pool: Pool) -> None:
    async with pool.acquire() as conn:
        spec = msgspec.structs.replace(REGISTRY.spec("diag.noop", "future"), kind="from.future")
        job_id = (await Queue(pool).enqueue_one(conn, spec)).job_id
    async with running_worker(config, pool):
        row = await wait_for(
            pool, "SELECT * FROM jobs WHERE id = $1 AND status = 'waiting'", job_id
        )
    assert row["last_error_class"] == "unknown_kind"
    assert row["attempts"] == 0  # version skew never spends the retry budget


async def test_health_ready_and_metrics_endpoints(config: Config, pool: Pool) -> None:
    job_id = await enqueue(pool, "diag.noop", "counted", {})
    async with running_worker(config, pool) as worker, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{worker.http_port}"
        await wait_for(pool, "SELECT 1 FROM job_history WHERE id = $1", job_id)
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200
            assert (await resp.json())["status"] == "ready"
        deadline = time.monotonic() + 5
        text = ""
        while (
            time.monotonic() < deadline
            and 'aivedio_jobs_succeeded_total{kind="diag.noop"} 1.0' not in text
        ):
            async with http.get(f"{base}/metrics") as resp:
                text = await resp.text()
            await anyio.sleep(0.05)
        assert 'aivedio_jobs_claimed_total{kind="diag.noop"} 1.0' in text
        assert 'aivedio_jobs_succeeded_total{kind="diag.noop"} 1.0' in text
        assert 'aivedio_lane_slots{lane="control"} 16.0' in text
        assert "aivedio_queue_depth" in text
        assert "aivedio_queue_oldest_age_seconds" in text
        worker.request_drain()
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 503
            assert "draining" in (await resp.json())["reasons"]


async def test_readiness_reports_pending_migrations(config: Config, pool: Pool) -> None:
    await pool.execute("DELETE FROM schema_migrations")
    async with (
        running_worker(config, pool) as worker,
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{worker.http_port}/readyz") as resp,
    ):
        body = await resp.json()
    assert resp.status == 503
    assert any("migrations pending" in reason for reason in body["reasons"])


async def test_a_result_postgres_cannot_store_does_not_block_acknowledgements(
    config: Config, pool: Pool
) -> None:
    from aivedio.pipeline.jobs import Contract, JobContext, Registry
    from aivedio.store.queue import Job

    async def nul_result(_ctx: JobContext, _job: Job) -> dict[str, Any]:
        return {"text": "a\u0000b"}  # jsonb refuses NUL characters

    registry = Registry()
    registry.bind(Contract("t.nul", "control", 300.0, 8), nul_result)
    async with pool.acquire() as conn:
        bad = (await Queue(pool).enqueue_one(conn, registry.spec("t.nul", "bad"))).job_id
    worker = Worker(config, pool, registry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        row = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", bad)
        worker.request_drain(force=True)
    assert row["status"] == "succeeded"
    assert row["result"] is None


def ack_window(config: Config, seconds: float) -> Config:
    worker = msgspec.structs.replace(config.worker, ack_flush_seconds=seconds)
    return msgspec.structs.replace(config, worker=worker)


async def test_an_acknowledgement_rides_on_the_next_claim(config: Config, pool: Pool) -> None:
    config = ack_window(config, 60.0)  # the flusher alone would wait a minute
    first = await enqueue(pool, "diag.noop", "first", {})
    async with running_worker(config, pool):
        # Claimed (its acknowledgement may already have ridden on the lane's next poll,
        # 0.2 s later: a slow look can miss the row in jobs and find it in the history).
        await wait_for(
            pool,
            "SELECT 1 FROM jobs WHERE id = $1 AND attempts = 1"
            " UNION ALL SELECT 1 FROM job_history WHERE id = $1",
            first,
        )
        await anyio.sleep(0.3)  # done by now, its acknowledgement pending or carried
        second = await enqueue(pool, "diag.noop", "second", {})  # wakes a claim
        row = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", first, timeout=5)
        assert row["status"] == "succeeded"
        # The second is claimed too (the first's acknowledgement may have ridden on an
        # earlier poll, so this claim can come a moment after the history row).
        await wait_for(
            pool,
            "SELECT 1 FROM jobs WHERE id = $1 AND lease_token = 1"
            " UNION ALL SELECT 1 FROM job_history WHERE id = $1",
            second,
            timeout=5,
        )


async def test_a_claim_that_carried_an_unstorable_result_hands_it_to_the_flusher(
    config: Config, pool: Pool
) -> None:
    from aivedio.pipeline.jobs import Contract, JobContext, Registry
    from aivedio.store.queue import Job

    async def nul_result(_ctx: JobContext, _job: Job) -> dict[str, Any]:
        return {"text": "a\u0000b"}  # jsonb refuses NUL characters

    async def ok(_ctx: JobContext, _job: Job) -> dict[str, Any]:
        return {"ok": True}

    registry = Registry()
    registry.bind(Contract("t.nul", "control", 300.0, 8), nul_result)
    registry.bind(Contract("t.ok", "control", 300.0, 8), ok)
    queue = Queue(pool)
    async with pool.acquire() as conn:
        bad = (await queue.enqueue_one(conn, registry.spec("t.nul", "bad"))).job_id
    worker = Worker(ack_window(config, 3.0), pool, registry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        await wait_for(pool, "SELECT 1 FROM jobs WHERE id = $1 AND attempts = 1", bad)
        await anyio.sleep(0.3)
        async with pool.acquire() as conn:  # its claim carries the bad result and fails
            good = (await queue.enqueue_one(conn, registry.spec("t.ok", "good"))).job_id
        done = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", good)
        dropped = await wait_for(pool, "SELECT * FROM job_history WHERE id = $1", bad)
        worker.request_drain(force=True)
    # (The flusher drops the results of the batch the bad one is in, the good one's too.)
    assert done["status"] == "succeeded" and dropped["status"] == "succeeded"
    assert dropped["result"] is None
    # The failed claim did not wait for the flusher: the good job ran before the bad
    # acknowledgement was sent (3 s after the bad job finished).
    assert done["started_at"] < dropped["finished_at"]


async def test_a_deferred_job_waits_without_spending_attempts(config: Config, pool: Pool) -> None:
    job_id = await enqueue(
        pool, "diag.fail", "deferred", {"error_class": "deferred", "retry_after": 0.2}
    )
    async with running_worker(config, pool):
        deadline = time.monotonic() + 5
        runs = 0
        while time.monotonic() < deadline and runs < 3:
            runs = (
                await pool.fetchval("SELECT count(*) FROM job_history WHERE id = $1", job_id) or 0
            )
            row = await pool.fetchrow(
                "SELECT attempts, last_error_class, lease_token FROM jobs WHERE id = $1", job_id
            )
            if row is not None and row["lease_token"] >= 3:
                break
            await anyio.sleep(0.05)
    assert row is not None
    assert row["lease_token"] >= 3  # claimed and deferred at least three times
    assert row["attempts"] <= 1
    assert row["last_error_class"] == "deferred"


def slow_poll(config: Config) -> Config:
    """A poll interval far beyond the test: only a notification can wake a lane."""
    worker = msgspec.structs.replace(config.worker, poll_interval_seconds=60.0)
    return msgspec.structs.replace(config, worker=worker)


async def test_a_job_the_worker_enqueues_for_itself_wakes_it_alone(
    config: Config, pool: Pool
) -> None:
    shared: list[str] = []

    def on_notify(_conn: object, _pid: int, _channel: str, lane: object) -> None:
        shared.append(str(lane))

    async with pool.acquire() as listener:
        await listener.add_listener("aivedio_jobs", on_notify)
        async with running_worker(slow_poll(config), pool) as worker:
            with anyio.fail_after(10):
                while not worker._listening:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.3)  # its first claims came back empty: asleep until news
            async with pool.acquire() as conn:
                mine = await worker.queue.enqueue_one(
                    conn, REGISTRY.spec("diag.noop", "for-myself", payload={})
                )
            # Woken by its own channel (the poll is a minute away) and run.
            row = await wait_for(
                pool, "SELECT status FROM job_history WHERE id = $1", mine.job_id, timeout=10
            )
            assert row["status"] == "succeeded"
            # A job enqueued by anybody else is still announced to the fleet, and run.
            other = await enqueue(pool, "diag.noop", "from-elsewhere", {})
            await wait_for(pool, "SELECT 1 FROM job_history WHERE id = $1", other, timeout=10)
        await listener.remove_listener("aivedio_jobs", on_notify)
    assert shared == [f"control:{other}"]  # the second job's; the first woke nobody else


async def test_a_worker_reserves_only_free_slots_and_only_while_it_listens(
    config: Config, pool: Pool
) -> None:
    worker = Worker(config, pool, REGISTRY)
    control = worker._lanes["control"]
    assert worker._reserve({"control": 1}) == []  # not listening: the fleet hears it
    worker._listening = True
    control.busy = control.limit - 3
    assert worker._reserve({"control": 2, "media": 3}) == ["control"]  # media has 2 slots
    assert worker._reserve({"control": 2}) == []  # 1 free slot left once 2 are promised
    assert worker._reserve({"control": 1}) == ["control"]
    assert worker._reserve({"control": 1}) == []  # all 3 free slots promised
    worker._unreserve({"control": 1, "nonexistent": 3})  # an enqueue created one job fewer
    assert worker._reserve({"control": 1}) == ["control"]
    control.pledged = 0  # what a claim does
    worker.draining = True
    assert worker._reserve({"control": 1}) == []


async def test_a_full_lane_hands_jobs_promised_to_itself_to_the_fleet(
    config: Config, pool: Pool
) -> None:
    one_slot = msgspec.structs.replace(
        config.worker,
        lanes={"control": LaneConfig(slots=1)},
        poll_interval_seconds=60.0,
    )
    shared: list[str] = []

    def on_notify(_conn: object, _pid: int, _channel: str, lane: object) -> None:
        shared.append(str(lane))

    async with pool.acquire() as listener:
        await listener.add_listener("aivedio_jobs", on_notify)
        cfg = msgspec.structs.replace(config, worker=one_slot)
        async with running_worker(cfg, pool) as worker:
            with anyio.fail_after(10):
                while not worker._listening:
                    await anyio.sleep(0.01)
            busy = await enqueue(pool, "diag.sleep", "fills-the-slot", {"seconds": 3})
            await wait_for(pool, "SELECT 1 FROM jobs WHERE id = $1 AND status = 'running'", busy)
            shared.clear()
            # As if an enqueue had reserved a slot while the claim that filled the lane ran.
            lane = worker._lanes["control"]
            lane.pledged = 1
            lane.poke()
            with anyio.fail_after(5):
                while not shared:
                    await anyio.sleep(0.02)
            assert lane.pledged == 0
        await listener.remove_listener("aivedio_jobs", on_notify)
    assert shared[0] == "control"  # a bare lane: whoever has a free slot claims


async def test_a_retry_is_promoted_when_due_not_at_the_poll(config: Config, pool: Pool) -> None:
    """The worker that set a wait promotes it when it is due, however long the poll."""
    job_id = await enqueue(
        pool, "diag.fail", "soon", {"error_class": "deferred", "retry_after": 0.3}
    )
    async with running_worker(slow_poll(config), pool):
        await wait_for(pool, "SELECT 1 FROM jobs WHERE id = $1 AND lease_token >= 3", job_id)


async def test_a_running_jobs_progress_reaches_its_row_by_the_heartbeat(
    config: Config, pool: Pool
) -> None:
    """What a job's processes measure (``aivedio.progress``) is stored with its lease."""
    from aivedio import progress
    from aivedio.pipeline.jobs import Contract, Registry

    measured = anyio.Event()
    release = anyio.Event()

    async def render(_ctx: Any, _job: Any) -> dict[str, Any]:
        meter = progress.current.get()
        assert meter is not None
        token = meter.start()
        meter.update(token, 0.42)
        measured.set()
        await release.wait()
        meter.finish(token)
        return {}

    registry = Registry()
    registry.bind(Contract("test.measured", "control", 60.0, 1), render)
    config = msgspec.structs.replace(
        config, worker=msgspec.structs.replace(config.worker, heartbeat_interval_seconds=0.1)
    )
    async with pool.acquire() as conn:
        job_id = (await Queue(pool).enqueue_one(conn, registry.spec("test.measured", "p"))).job_id
    worker = Worker(config, pool, registry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        try:
            with anyio.fail_after(10):
                await measured.wait()
            row = await wait_for(
                pool, "SELECT progress FROM jobs WHERE id = $1 AND progress IS NOT NULL", job_id
            )
            assert row["progress"] == pytest.approx(0.42)
        finally:
            release.set()
            worker.request_drain(force=True)
