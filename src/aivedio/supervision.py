"""Supervised loops and isolated rows: a dependency failure never kills a daemon, and one bad
row never stops a scan.

Loops. A daemon is one task group of long-running loops (LISTEN, a claimer per lane, the
heartbeat, the maintenance, the acknowledgement flusher, the backlog reader, the outbox
relay, the API's event listener). An exception that leaves a loop goes up through the task
group and ends the process. Naming the exceptions each loop may meet is a list that is
always one class short: in a chaos run the LISTEN keepalive met asyncpg's
``InternalClientError`` during a PostgreSQL restart, which its ``except`` did not name, and
the worker exited. So every loop runs under ``supervise``, which catches any ``Exception``,
never cancellation (anyio's cancellation, ``KeyboardInterrupt`` and ``SystemExit`` are
``BaseException``\\s, and so is an exception group that carries one), logs one event, backs
off and runs the loop's body again. A body that handles a failure itself (a claim that met
the database restarting) reports it through the same ``Loop.failed``. While a loop fails it
is *down* in the process's ``Conditions``, which ``/readyz`` reports (503, naming the loop
and since when); its next success (``Loop.ok``) clears it.

The backoff is exponential with equal jitter (half the ceiling, plus up to the other half):
two workers never retry in step, and a loop that fails at once never spins. A failure from
a dependency (our own errors, sockets, timeouts, the drivers' classes) is logged without a
traceback: it says what it is. Any other class is a bug: its traceback is logged once per
streak of failures, never at every retry.

Rows. A batch scan (a sweeper scan, GC, the integrity audit, the outbox relay's claim) runs
each row's work under ``RowGuard.row``: a row whose work raises is logged as one
``scan_row_failed`` event (the scan, the row's id, the error class and where it was raised,
never a traceback: a bad row is often hostile input), counted in
``aivedio_scan_row_errors_total{scan}``, and skipped; the scan goes on with the next row. A
failure that says a dependency is gone (a refused or reset connection, a timeout,
PostgreSQL's SQLSTATE class 08 or 57P01-57P03) is not the row's fault: it stops the scan,
whose own error handling reports one failure instead of one per row.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio

from aivedio.errors import AivedioError, DatabaseError
from aivedio.logs import get_logger, redact_text
from aivedio.metrics import SupervisionMetrics

log = get_logger("aivedio.supervision")

# Packages whose exceptions are a dependency failing, not a bug of ours: logged without a
# traceback. (Their errors are translated at their seams; one that escapes is still theirs.)
DEPENDENCY_PACKAGES = frozenset({"asyncpg", "aiohttp", "aiobotocore", "botocore"})
DETAIL_CHARS = 300  # of an error's message, in a log event or a readiness reason


def error_class(exc: BaseException) -> str:
    """What failed, for logs, metrics and readiness: our taxonomy's class with the foreign
    exception under it (``database:InternalClientError``), else the exception's class."""
    if isinstance(exc, AivedioError):
        cause = exc.__cause__
        return f"{exc.error_class}:{type(cause).__name__}" if cause else exc.error_class
    return type(exc).__name__


def known_failure(exc: BaseException) -> bool:
    """A dependency failing (logged without a traceback), not a bug."""
    if isinstance(exc, AivedioError | OSError | TimeoutError):
        return True
    return type(exc).__module__.split(".")[0] in DEPENDENCY_PACKAGES


def dependency_down(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says a dependency cannot be reached: a
    refused or reset connection, a timeout, PostgreSQL's SQLSTATE class 08 (connection
    exception) or 57P01-57P03 (shutting down, crashed, starting up), or a DatabaseError
    the store's seam marked as the server gone (asyncpg's "connection is closed" and stale
    protocol carry no SQLSTATE: the seam knows them, as the worker's ``lost_server`` does)."""
    if isinstance(exc, DatabaseError) and exc.server_gone:
        return True
    for found in (exc, exc.__cause__):
        if isinstance(found, ConnectionError | TimeoutError):
            return True
        state = str(getattr(found, "sqlstate", "") or "")
        if state.startswith("08") or state in ("57P01", "57P02", "57P03"):
            return True
    return False


def _message(exc: BaseException) -> str:
    return redact_text(str(exc))[:DETAIL_CHARS]


# -- readiness ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Down:
    """A loop that cannot work: since when (Unix time) and with what."""

    since: float
    error_class: str
    detail: str


class Conditions:
    """The loops of one process that cannot work now; ``/readyz`` reports each."""

    def __init__(self, metrics: SupervisionMetrics | None = None) -> None:
        self.metrics = metrics
        self._down: dict[str, Down] = {}

    def down(self, loop: str, exc: BaseException) -> None:
        """``loop`` failed; it stays down, since its first failure, until ``up``."""
        previous = self._down.get(loop)
        since = previous.since if previous is not None else time.time()
        self._down[loop] = Down(since, error_class(exc), _message(exc))
        if self.metrics is not None:
            self.metrics.loop_failing.labels(loop).set(1)

    def up(self, loop: str) -> None:
        self._down.pop(loop, None)
        if self.metrics is not None:
            self.metrics.loop_failing.labels(loop).set(0)

    def get(self, loop: str) -> Down | None:
        return self._down.get(loop)

    def reasons(self) -> list[str]:
        """One line per loop that cannot work, for ``/readyz``."""
        return [
            f"{name} cannot work since "
            f"{datetime.fromtimestamp(down.since, UTC).isoformat(timespec='seconds')}: "
            f"{down.error_class}"
            for name, down in sorted(self._down.items())
        ]


# -- loops -------------------------------------------------------------------------------------


class Loop:
    """One supervised loop's failure streak: its log event, backoff and readiness."""

    def __init__(
        self,
        name: str,
        *,
        conditions: Conditions | None = None,
        event: str = "loop_failed",
        base_seconds: float = 0.5,
        max_seconds: float = 10.0,
        rand: Callable[[], float] = random.random,
        **ids: Any,
    ) -> None:
        self.name = name
        self.conditions = conditions
        self.event = event
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self.rand = rand
        self.ids = ids  # logged with every event (a lane, an owner)
        self.failures = 0  # in the current streak
        self._since = 0.0
        self._traced: set[str] = set()  # unknown classes whose traceback this streak logged

    def ok(self) -> None:
        """The loop did its work: the streak, if any, ends and readiness is restored."""
        if self.failures:
            down_seconds = round(time.monotonic() - self._since, 3)
            log.info(
                "loop_recovered",
                loop=self.name,
                failures=self.failures,
                down_seconds=down_seconds,
                **self.ids,
            )
            self.failures = 0
            self._traced.clear()
        if self.conditions is not None and self.conditions.get(self.name) is not None:
            self.conditions.up(self.name)

    def failed(self, exc: BaseException) -> float:
        """Record one failure (one event; the readiness condition; the metric); the seconds
        to wait before trying again."""
        if not self.failures:
            self._since = time.monotonic()
        self.failures += 1
        ceiling = min(self.max_seconds, self.base_seconds * 2.0 ** min(self.failures - 1, 30))
        delay: float = ceiling * (0.5 + self.rand() / 2)
        kind = error_class(exc)
        fields = {
            "loop": self.name,
            "error_class": kind,
            "error": _message(exc),
            "failures": self.failures,
            "delay_seconds": round(delay, 3),
            **self.ids,
        }
        if known_failure(exc) or kind in self._traced:
            log.warning(self.event, **fields)
        else:
            self._traced.add(kind)
            log.error(self.event, **fields, exc_info=exc)
        if self.conditions is not None:
            self.conditions.down(self.name, exc)
            if self.conditions.metrics is not None:
                self.conditions.metrics.loop_failures.labels(self.name).inc()
        return delay

    async def backoff(self, exc: BaseException) -> None:
        await anyio.sleep(self.failed(exc))


async def supervise(loop: Loop, body: Callable[[], Awaitable[object]]) -> None:
    """Run ``body`` until it returns; after any exception but cancellation, record the
    failure, back off and run it again. The body calls ``loop.ok()`` when it did its work."""
    while True:
        try:
            await body()
            return
        except Exception as exc:
            await loop.backoff(exc)


# -- rows --------------------------------------------------------------------------------------


class Row:
    """What ``RowGuard.row`` yields: after the block, the exception that skipped the row."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: Exception | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


Skipped = Callable[[str, str, Exception], None]


def _where(exc: BaseException) -> str:
    """The file and line the exception was raised at (its innermost frame)."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


class RowGuard:
    """Per-row isolation for batch scans (see the module docstring)."""

    def __init__(self, metrics: SupervisionMetrics | None = None) -> None:
        self.metrics = metrics

    @contextmanager
    def row(self, scan: str, row_id: object, *, on_skip: Skipped | None = None) -> Iterator[Row]:
        """Run a row's work; if it raises (and no dependency is down), log, count, call
        ``on_skip(scan, row id, exception)`` and swallow it: the scan goes on."""
        row = Row()
        try:
            yield row
        except Exception as exc:
            if dependency_down(exc):
                raise
            row.error = exc
            self.skip(scan, row_id, exc, on_skip=on_skip)

    def skip(
        self, scan: str, row_id: object, exc: Exception, *, on_skip: Skipped | None = None
    ) -> None:
        """Log, count and report one row skipped because of ``exc`` (``row`` calls this; so
        does a caller that caught the row's exception itself)."""
        log.warning(
            "scan_row_failed",
            scan=scan,
            row_id=str(row_id),
            error_class=error_class(exc),
            error=_message(exc),
            where=_where(exc),
        )
        if self.metrics is not None:
            self.metrics.scan_row_errors.labels(scan).inc()
        if on_skip is not None:
            on_skip(scan, str(row_id), exc)
