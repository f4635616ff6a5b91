"""A dependency failure never kills a daemon (issue 22, item 12).

In one chaos run a worker exited while PostgreSQL restarted: the LISTEN loop's keepalive
``SELECT 1`` raised asyncpg's ``InternalClientError``, which that loop's ``except`` did not
name, and the error took the task group down. Here each supervised loop of a real worker
(the claimer, the heartbeat, the maintenance, the acknowledgement flusher, the backlog
reader, LISTEN), of the API (its event listener), of the outbox relay (its pass and its
LISTEN) and of ``status --follow`` (its LISTEN) meets every exception class that can
plausibly surface (``tests/fault_rig.FAILURES``) in turn: the daemon keeps running,
``/readyz`` says 503 naming the loop while it fails, one event per failure names the loop
and the error class (a traceback once per streak for an unknown class, never for a known
one), and the loop recovers and works once the fault is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from structlog.testing import capture_logs

from aivedio.api import events
from aivedio.cli.status import Target, follow
from aivedio.config.load import Config
from aivedio.pipeline.upkeep.outbox_relay import open_outbox_relay
from aivedio.store import database
from aivedio.store.database import Pool
from aivedio.store.queue import Queue
from aivedio.supervision import Conditions, Loop
from aivedio.worker import daemon as worker_module
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry
from tests.conftest import make_config
from tests.integration.api.test_events import stream
from tests.integration.pipeline.upkeep.test_outbox_relay import (
    emit_one,
    open_receiver,
    outbox_config,
)
from tests.support.fault_rig import (
    FAILURES,
    STALE_PROTOCOL,
    Fault,
    failures_of,
    readyz,
    until,
    until_failed,
    until_ready,
)

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()
WORKER_LOOPS = ("claim:control", "heartbeat", "maintenance", "ack_flush", "backlog", "listen")


# The backoff after each failure, scaled down: each test here meets nine failure classes in
# turn, waiting out a backoff (0.25 s to 1 s, a streak's second failure longer) for each
# before the loop works again. What is checked is that the loop fails, says so, backs off and
# recovers, not the backoff's schedule (tests/unit/test_supervision.py holds that); every
# event still carries the delay its Loop computed.
BACKOFF_SCALE = 0.1


@pytest.fixture(autouse=True)
def _brisk_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = Loop.failed

    def scaled(self: Loop, exc: BaseException) -> float:
        return failed(self, exc) * BACKOFF_SCALE

    monkeypatch.setattr(Loop, "failed", scaled)


def quick(config: Config) -> Config:
    """Every loop on a short cadence, so each failure class is met within a second."""
    # (The maintenance promotes due waits every claim_poll_seconds, 1 s by default here.)
    cfg = make_config(config.database.url, heartbeat_interval_seconds=0.1, claim_poll_seconds=0.2)
    backlog = msgspec.structs.replace(cfg.backlog, check_interval_seconds=0.1)
    return msgspec.structs.replace(cfg, backlog=backlog)


class Listeners:
    """``database.connect`` (every LISTEN connection is opened through it) with a fault,
    and the server pids of the connections it opened, to drop them."""

    def __init__(self, fault: Fault, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pids: list[int] = []
        real = database.connect

        async def connect(config: Any, *, codecs: bool = True) -> Any:
            fault.check()
            conn = await real(config, codecs=codecs)
            self.pids.append(conn.get_server_pid())
            return conn

        monkeypatch.setattr(database, "connect", connect)

    async def drop(self, pool: Pool) -> None:
        """End every connection opened so far, as a server restart would."""
        pids, self.pids = self.pids, []
        await pool.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", pids)


async def enqueue(pool: Pool, key: str) -> int:
    async with pool.acquire() as conn:
        done = await Queue(pool).enqueue_one(conn, REGISTRY.spec("diag.noop", key, payload={}))
    return done.job_id


async def stage_event(pool: Pool, tenant_id: int, asset_id: uuid.UUID, state: str) -> None:
    """An asset's state change as the triggers record it: the log row and its NOTIFY."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO stage_events (tenant_id, entity, state, asset_id)"
            " VALUES ($1, 'asset', $2, $3)",
            tenant_id,
            state,
            asset_id,
        )
        await conn.execute("SELECT pg_notify('aivedio_stage_events', $1)", str(asset_id))


async def finished(pool: Pool, job_id: int) -> None:
    with anyio.fail_after(15):
        while not await pool.fetchval(
            "SELECT 1 FROM job_history WHERE id = $1 AND status = 'succeeded'", job_id
        ):
            await anyio.sleep(0.05)


def install(loop: str, worker: Worker, fault: Fault, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Put ``fault`` under the callee ``loop`` depends on; what ``provoke`` needs."""
    queue = worker.queue
    callee = {
        "claim:control": (queue, "claim_and_complete"),
        "heartbeat": (queue, "heartbeat"),
        "maintenance": (queue, "promote"),
        "ack_flush": (queue, "complete"),
        "backlog": (worker.backlog, "refresh"),
    }.get(loop)
    if callee is None:
        return Listeners(fault, monkeypatch)
    owner, name = callee
    monkeypatch.setattr(owner, name, fault.wrap(getattr(owner, name)))
    return None


async def provoke(loop: str, worker: Worker, pool: Pool, listeners: Any, n: int) -> int | None:
    """Make ``loop`` meet the armed fault now; a job whose run proves it works again."""
    if loop == "claim:control":
        return await enqueue(pool, f"claim-{n}")  # news: the lane claims at once
    if loop == "ack_flush":
        worker.acks.ride = False  # the flusher, not the next claim, acknowledges it
        return await enqueue(pool, f"ack-{n}")
    if loop == "listen":
        await listeners.drop(pool)
    return None


def check_tracebacks(logs: list[dict[str, Any]], loop: str) -> None:
    """A traceback once per streak for the class nobody named, never for a known one."""
    for name in FAILURES:
        events = failures_of(logs, loop, name)
        assert events, f"no failure event of {loop} for {name}"
        with_traceback = [e for e in events if e.get("exc_info")]
        if name == "Exception":
            assert len(events) >= 2 and with_traceback == events[:1], events
        else:
            assert with_traceback == [], (name, with_traceback)


@pytest.mark.parametrize("loop", WORKER_LOOPS)
async def test_a_worker_loop_outlives_every_dependency_failure_and_says_so_in_readyz(
    loop: str, config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    worker = Worker(quick(config), pool, REGISTRY)
    listeners = install(loop, worker, fault, monkeypatch)
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as http, anyio.create_task_group() as tg:
            tg.start_soon(lambda: worker.run(install_signal_handlers=False))
            await until(lambda: worker.http_port is not None and worker._listening, "listening")
            url = f"http://127.0.0.1:{worker.http_port}/readyz"
            await until_ready(http, url, loop, down=False)
            for n, name in enumerate(FAILURES):
                fault.arm(name)
                job = await provoke(loop, worker, pool, listeners, n)
                # The daemon runs on (a loop that died would have ended this task group),
                # and says which loop cannot work.
                await until_ready(http, url, loop, down=True)
                await until_failed(logs, loop, name)
                fault.disarm()
                await until_ready(http, url, loop, down=False)
                if job is not None:
                    await finished(pool, job)
            worker.request_drain(force=True)
    check_tracebacks(logs, loop)
    assert any(e["event"] == "loop_recovered" and e["loop"] == loop for e in logs)


async def test_a_stale_protocol_in_the_listen_keepalive_only_reconnects(
    config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos finding itself: the keepalive ``SELECT 1`` of the worker's LISTEN
    connection raises InternalClientError; the worker listens again and wakes on enqueues."""
    monkeypatch.setattr(worker_module, "LISTEN_KEEPALIVE_SECONDS", 0.1, raising=False)
    real = database.connect
    broken: list[int] = []

    class StaleKeepalive:
        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

        async def execute(self, query: str, *args: Any) -> Any:
            if query == "SELECT 1" and not broken:
                broken.append(1)
                raise FAILURES["InternalClientError"]()
            return await self._conn.execute(query, *args)

    async def connect(cfg: Any, *, codecs: bool = True) -> Any:
        return StaleKeepalive(await real(cfg, codecs=codecs))

    monkeypatch.setattr(database, "connect", connect)
    # A poll a minute away: only a notification can wake a lane.
    slow = msgspec.structs.replace(config.worker, poll_interval_seconds=60.0)
    worker = Worker(msgspec.structs.replace(config, worker=slow), pool, REGISTRY)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: worker.run(install_signal_handlers=False))
            await until(lambda: bool(broken), "the keepalive to fail", timeout=20)
            await until(lambda: worker._listening, "listening again")
            await anyio.sleep(0.3)  # asleep until news
            await finished(pool, await enqueue(pool, "after-the-restart"))
            worker.request_drain(force=True)
    (lost,) = [e for e in logs if e["event"] == "listen_connection_lost"]
    assert lost["loop"] == "listen" and lost["error_class"] == "database:InternalClientError"
    assert STALE_PROTOCOL in lost["error"] and "exc_info" not in lost


async def test_the_api_event_listener_outlives_every_failure_and_says_so_in_readyz(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.api_rig import open_api

    monkeypatch.setattr(events, "REQUERY_SECONDS", 60.0)  # only a notification is in time
    fault = Fault()
    listeners = Listeners(fault, monkeypatch)
    loop = "stage_events_listen"
    with capture_logs() as logs:
        async with open_api(config, pool, tmp_path) as api:
            url = api.base + "/readyz"
            asset = await api.rig.quarantine(b"a" * 64)
            async with stream(api, asset) as sse:
                await sse.take(1)
                for name in FAILURES:
                    fault.arm(name)
                    await listeners.drop(pool)
                    await until_ready(api.http, url, loop, down=True)
                    await until_failed(logs, loop, name)
                    fault.disarm()
                    await until_ready(api.http, url, loop, down=False)
                    # Listening again: a change arrives by its notification.
                    await stage_event(pool, api.rig.tenant_id, asset, f"AFTER_{name.upper()}")
                    (event,) = await sse.take(1, timeout=3)
                    assert event.data["state"] == f"AFTER_{name.upper()}"
    check_tracebacks(logs, loop)


@asynccontextmanager
async def relay_with(
    config: Config, pool: Pool, conditions: Conditions
) -> AsyncIterator[tuple[Any, Any]]:
    async with open_receiver() as receiver:
        relay_config = outbox_config(receiver)
        async with open_outbox_relay(
            relay_config, pool, database=config.database, conditions=conditions
        ) as relay:
            yield relay, receiver


async def delivered(receiver: Any, event_id: str) -> None:
    await until(lambda: event_id in receiver.ids(), f"{event_id} delivered")


@pytest.mark.parametrize("loop", ["outbox_relay", "outbox_listen"])
async def test_the_outbox_relay_loops_outlive_every_failure_and_say_so(
    loop: str, config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    conditions = Conditions()
    listeners = Listeners(fault if loop == "outbox_listen" else Fault(), monkeypatch)
    with capture_logs() as logs:
        async with relay_with(config, pool, conditions) as (relay, receiver):
            if loop == "outbox_relay":
                monkeypatch.setattr(relay.store, "claim", fault.wrap(relay.store.claim))
            await until(lambda: conditions.get(loop) is None and bool(listeners.pids), "started")
            for name in FAILURES:
                fault.arm(name)
                if loop == "outbox_listen":
                    await listeners.drop(pool)
                else:
                    relay._wake.set()
                await until(lambda: conditions.get(loop) is not None, f"{loop} down")
                assert any(r.startswith(f"{loop} cannot work") for r in conditions.reasons())
                await until_failed(logs, loop, name)
                fault.disarm()
                await until(lambda: conditions.get(loop) is None, f"{loop} up again")
                await delivered(receiver, await emit_one(pool))
    check_tracebacks(logs, loop)


async def test_status_follow_outlives_every_listen_failure(
    config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integration.cli.test_status_follow import Lines, fetch_and_store, make_task

    fault = Fault()
    listeners = Listeners(fault, monkeypatch)
    task = await make_task(pool)
    (output,) = task.outputs
    asset = await fetch_and_store(pool, task, output)
    lines, result = Lines(), list[int]()
    loop = "status_listen"

    async def run() -> None:
        target = Target("asset", str(asset))
        result.append(
            await follow(pool, target, lines.write, listen=config.database, interval_seconds=0.3)
        )

    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await lines.wait_for(f"asset {asset}: QUARANTINED")
            await until(lambda: bool(listeners.pids), "listening")
            for name in FAILURES:
                fault.arm(name)
                await listeners.drop(pool)
                await until_failed(logs, loop, name)
                # Not listening: the timer re-reads and the change is shown all the same.
                state = f"WHILE_{name.upper()}"
                await stage_event(pool, task.tenant_id, asset, state)
                await lines.wait_for(f"→ {state}")
                fault.disarm()
                await until(lambda: bool(listeners.pids), "listening again")
            assert not result, "follow ended"
            tg.cancel_scope.cancel()
    check_tracebacks(logs, loop)


async def test_a_worker_reports_every_failing_loop_and_only_while_it_fails(
    config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loops failing at once are two reasons, each with the time it started failing."""
    fault = Fault()
    worker = Worker(quick(config), pool, REGISTRY)
    queue = worker.queue
    monkeypatch.setattr(queue, "heartbeat", fault.wrap(queue.heartbeat))
    monkeypatch.setattr(worker.backlog, "refresh", fault.wrap(worker.backlog.refresh))
    async with aiohttp.ClientSession() as http, anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        await until(lambda: worker.http_port is not None, "serving")
        url = f"http://127.0.0.1:{worker.http_port}/readyz"
        fault.arm("InternalClientError")
        await until_ready(http, url, "heartbeat", down=True)
        reasons = await until_ready(http, url, "backlog", down=True)

        def named(loop: str) -> list[str]:
            return [r for r in reasons if r.startswith(f"{loop} cannot work since ")]

        assert len(named("heartbeat")) == len(named("backlog")) == 1
        assert named("heartbeat")[0].endswith(": InternalClientError")
        first = named("heartbeat")[0]
        await anyio.sleep(0.5)  # more failures of the same streak: the same "since"
        status, later = await readyz(http, url)
        assert status == 503 and first in later
        fault.disarm()
        await until_ready(http, url, "heartbeat", down=False)
        await until_ready(http, url, "backlog", down=False)
        worker.request_drain(force=True)
