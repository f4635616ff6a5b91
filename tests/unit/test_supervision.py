"""Supervised loops and isolated rows (``aivedio.supervision``), without any I/O."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from aivedio.errors import DatabaseError
from aivedio.metrics import SupervisionMetrics
from aivedio.store.database import map_db_errors
from aivedio.supervision import (
    Conditions,
    Loop,
    RowGuard,
    dependency_down,
    error_class,
    known_failure,
    supervise,
)
from tests.support.fault_rig import FAILURES

pytestmark = pytest.mark.anyio


def metrics() -> SupervisionMetrics:
    return SupervisionMetrics(CollectorRegistry())


def sample(m: SupervisionMetrics, name: str, **labels: str) -> float | None:
    family = {
        "aivedio_loop_failing": m.loop_failing,
        "aivedio_loop_failures_total": m.loop_failures,
        "aivedio_scan_row_errors_total": m.scan_row_errors,
    }[name]
    for metric in family.collect():
        for s in metric.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def mapped(exc: BaseException) -> DatabaseError:
    error = DatabaseError(f"claiming jobs: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def test_error_class_names_the_taxonomy_and_the_foreign_class_under_it() -> None:
    assert error_class(mapped(FAILURES["InternalClientError"]())) == "database:InternalClientError"
    assert error_class(DatabaseError("no cause")) == "database"
    assert error_class(TypeError("x")) == "TypeError"


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_every_dependency_class_is_known_and_a_bare_exception_is_not(name: str) -> None:
    assert known_failure(FAILURES[name]()) is (name != "Exception")


def test_dependency_down_is_the_connection_not_the_row() -> None:
    down = [
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        FAILURES["ConnectionDoesNotExistError"](),  # SQLSTATE 08003
        FAILURES["PostgresConnectionError"](),  # 08000
        mapped(ConnectionResetError(104, "reset")),
    ]
    row = [
        TypeError("can't compare offset-naive and offset-aware datetimes"),
        FAILURES["DeadlockDetectedError"](),
        mapped(FAILURES["DeadlockDetectedError"]()),
        KeyError("path"),
        RecursionError(),
    ]
    assert all(dependency_down(exc) for exc in down)
    assert not any(dependency_down(exc) for exc in row)


def test_a_failure_streak_backs_off_exponentially_with_equal_jitter() -> None:
    loop = Loop("x", base_seconds=0.5, max_seconds=4.0, rand=lambda: 0.0)
    low = [loop.failed(OSError()) for _ in range(6)]
    assert low == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]  # half the ceiling: never 0, never a spin
    loop.ok()
    high = Loop("x", base_seconds=0.5, max_seconds=4.0, rand=lambda: 1.0)
    assert [high.failed(OSError()) for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert loop.failed(OSError()) == 0.25  # ok() ended the streak


def test_a_loop_is_down_in_readiness_from_its_first_failure_until_it_works() -> None:
    m = metrics()
    conditions = Conditions(m)
    loop = Loop("claim:fetch", conditions=conditions, rand=lambda: 0.0)
    assert conditions.reasons() == []
    loop.failed(mapped(FAILURES["InternalClientError"]()))
    first = conditions.reasons()
    (reason,) = first
    assert reason.startswith("claim:fetch cannot work since ")
    assert reason.endswith(": database:InternalClientError")
    loop.failed(FAILURES["TooManyConnectionsError"]())
    (again,) = conditions.reasons()
    assert again.split(": ")[0] == reason.split(": ")[0]  # the same "since": the streak's start
    assert again.endswith(": TooManyConnectionsError")  # and what it fails with now
    assert sample(m, "aivedio_loop_failing", loop="claim:fetch") == 1
    assert sample(m, "aivedio_loop_failures_total", loop="claim:fetch") == 2
    loop.ok()
    assert conditions.reasons() == []
    assert sample(m, "aivedio_loop_failing", loop="claim:fetch") == 0


def test_one_event_per_failure_and_one_traceback_per_streak_for_an_unknown_class() -> None:
    loop = Loop("heartbeat", event="heartbeat_failed", rand=lambda: 0.0, owner="w1")
    with capture_logs() as logs:
        loop.failed(RuntimeError("bug"))
        loop.failed(RuntimeError("bug"))
        loop.failed(FAILURES["InterfaceError"]())
        loop.ok()
        loop.failed(RuntimeError("bug"))  # a new streak: its traceback once more
    failed = [e for e in logs if e["event"] == "heartbeat_failed"]
    classes = ["RuntimeError", "RuntimeError", "InterfaceError", "RuntimeError"]
    assert [e["error_class"] for e in failed] == classes
    assert [("exc_info" in e) for e in failed] == [True, False, False, True]
    assert all(e["loop"] == "heartbeat" and e["owner"] == "w1" for e in failed)
    assert [e["failures"] for e in failed] == [1, 2, 3, 1]
    (recovered,) = [e for e in logs if e["event"] == "loop_recovered"]
    assert recovered["failures"] == 3


async def test_supervise_runs_the_body_again_after_any_exception() -> None:
    calls: list[int] = []

    async def body() -> None:
        calls.append(1)
        if len(calls) < 4:
            raise [FAILURES["InternalClientError"](), ValueError(), OSError()][len(calls) - 1]

    loop = Loop("x", base_seconds=0.001, max_seconds=0.001)
    with anyio.fail_after(5):
        await supervise(loop, body)
    assert len(calls) == 4  # returned normally the fourth time: supervise returns too


async def test_supervise_never_swallows_cancellation() -> None:
    started = anyio.Event()

    async def body() -> None:
        started.set()
        await anyio.sleep_forever()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervise, Loop("x"), body)
            await started.wait()
            tg.cancel_scope.cancel()  # ends the task group: supervise did not catch it


async def test_a_deadline_ends_a_loop_that_keeps_failing() -> None:
    loop = Loop("x", base_seconds=0.001, max_seconds=0.001)
    failures: list[int] = []

    async def body() -> None:
        failures.append(1)
        raise ValueError("always")

    # The first failure of an unknown class logs its traceback, which a loaded host takes
    # a while to render; the retries after it are quick.
    with anyio.move_on_after(2.0) as scope:
        await supervise(loop, body)  # retried until the deadline cancels it
    assert scope.cancelled_caught and len(failures) > 1


async def test_an_exception_group_carrying_a_base_exception_is_not_swallowed() -> None:
    async def body() -> None:
        raise BaseExceptionGroup("children", [ValueError(), KeyboardInterrupt()])

    with pytest.raises(BaseExceptionGroup):
        await supervise(Loop("x", base_seconds=0.001), body)


def test_a_row_that_raises_is_skipped_logged_and_counted() -> None:
    m = metrics()
    guard = RowGuard(m)
    done: list[int] = []
    skipped: list[tuple[str, str, str]] = []

    def on_skip(scan: str, row_id: str, exc: Exception) -> None:
        skipped.append((scan, row_id, type(exc).__name__))

    with capture_logs() as logs:
        for row_id in (1, 2, 3):
            with guard.row("near_expiry", row_id, on_skip=on_skip) as row:
                if row_id == 2:
                    raise TypeError("can't compare offset-naive and offset-aware datetimes")
                done.append(row_id)
            assert row.failed is (row_id == 2)
    assert done == [1, 3]
    assert skipped == [("near_expiry", "2", "TypeError")]
    (event,) = [e for e in logs if e["event"] == "scan_row_failed"]
    assert event["scan"] == "near_expiry" and event["row_id"] == "2"
    assert event["error_class"] == "TypeError"
    assert event["where"].startswith("test_supervision.py:")
    assert "exc_info" not in event  # a bad row is often hostile input: no traceback
    assert sample(m, "aivedio_scan_row_errors_total", scan="near_expiry") == 1


@pytest.mark.parametrize(
    "error",
    [ConnectionRefusedError(111, "refused"), TimeoutError(), mapped(ConnectionResetError())],
)
def test_a_dependency_that_is_down_stops_the_scan_instead_of_every_row(error: Any) -> None:
    guard = RowGuard(metrics())
    with pytest.raises(type(error)), guard.row("gc", "k"):
        raise error


def test_cancellation_is_never_a_bad_row() -> None:
    guard = RowGuard()
    with pytest.raises(KeyboardInterrupt), guard.row("gc", "k"):
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    "name", ["InternalClientError", "InterfaceError", "ConnectionDoesNotExistError"]
)
def test_a_server_gone_under_a_row_stops_the_scan_as_the_worker_reads_it(name: str) -> None:
    """What ``map_db_errors`` makes of the driver's "the server went away" (the chaos run's
    stale protocol, asyncpg's "connection is closed") is the database, not the row: the
    outbox relay would otherwise bury the row's delivery as dead during a restart."""
    guard = RowGuard(metrics())
    with pytest.raises(DatabaseError), guard.row("outbox_relay", 7), map_db_errors("delivering"):
        raise FAILURES[name]()
