"""The leases a worker holds, and how it lets go of them: acknowledged in batches, kept by
one heartbeat, released on drain.

Completions are acknowledged in batches by one flusher (``Acknowledgements``): while one
batch is in flight the next accumulates, so the statement count falls as load rises. The
per-row fencing check in the ``complete`` statement keeps this exactly-once. Pending
acknowledgements ride on the next claim (one round trip for both) unless a claim that
carried some failed: then the flusher, which can drop a result that PostgreSQL refuses,
sends them until one of its flushes succeeds.

Leases. One heartbeat statement (``keep_leases``) extends every lease this worker holds and
returns what it still owns; a running job missing from that answer was taken over (its lease
expired while we stalled), so its task is cancelled: its results could not be committed
anyway.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg

from aivedio import progress
from aivedio.config.worker import WorkerConfig
from aivedio.logs import get_logger
from aivedio.metrics import WorkerMetrics
from aivedio.store.database import until_database_answers
from aivedio.store.queue import Job, Queue
from aivedio.supervision import Loop, error_class

# The worker's events keep the logger name they have always had, whichever module says them.
log = get_logger("aivedio.worker.daemon")

# How long a worker tries to record a job's failure or deferral, or to release leases, while
# the database does not answer (a restart, a failover) before it leaves the lease to expire.
RECORD_SECONDS = 10.0

Lease = tuple[int, int]  # (job id, lease token)


@dataclass
class Running:
    """A job this worker runs: the scope that bounds it by its deadline, and what became of
    its lease (given back on drain, or lost to another worker)."""

    job: Job
    scope: anyio.CancelScope
    claimed_at: float
    released: bool = False
    lease_lost: bool = False
    # How far its media work has got (``aivedio.progress``); the heartbeat stores it.
    meter: progress.Meter = field(default_factory=progress.Meter)


def _is_data_error(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, asyncpg.DataError | asyncpg.exceptions._base.DataError)


class Acknowledgements:
    """Finished jobs whose completion is not yet acknowledged, and the one flusher that
    sends them. It owns the pending list and the leases being sent; it never runs jobs and
    never claims (a claim only carries a batch of it, see ``take_riders``)."""

    def __init__(
        self, queue: Queue, owner: str, config: WorkerConfig, metrics: WorkerMetrics, loop: Loop
    ) -> None:
        self.queue = queue
        self.owner = owner
        self.config = config
        self.metrics = metrics
        self.loop = loop  # the flusher's supervised loop ("ack_flush")
        self.pending: list[tuple[Job, Any]] = []
        # Whether pending acknowledgements ride on the next claim (see the module docstring).
        self.ride = True
        # (id, lease token) of acknowledgements being sent: the heartbeat keeps their leases.
        self.in_flight: set[Lease] = set()
        self._wake = anyio.Event()
        # One flush at a time: the final flush on drain must wait for one in flight, or
        # cancelling the flusher would lose that batch's acknowledgement.
        self._lock = anyio.Lock()

    def add(self, job: Job, result: Any) -> None:
        self.pending.append((job, result))
        self._wake.set()

    def leases(self) -> list[Lease]:
        """The leases of every acknowledgement not yet accepted (pending, then in flight)."""
        return [(job.id, job.lease_token) for job, _ in self.pending] + list(self.in_flight)

    # -- riding on a claim ---------------------------------------------------------------

    def take_riders(self) -> list[tuple[Job, Any]]:
        """The batch the next claim carries (none while riding is off); in flight until
        ``landed``."""
        if not self.ride:
            return []
        batch_max = self.config.ack_batch_max
        acks, self.pending = self.pending[:batch_max], self.pending[batch_max:]
        self.in_flight.update((j.id, j.lease_token) for j, _ in acks)
        return acks

    def riders_failed(self, acks: list[tuple[Job, Any]]) -> None:
        """The claim carrying ``acks`` failed: back to the flusher, which knows what to do
        with a bad result, and no more riding until one of its flushes succeeds."""
        if acks:
            self.pending[:0] = acks
            self.ride = False
            self._wake.set()

    def landed(self, acks: list[tuple[Job, Any]]) -> None:
        """The claim carrying ``acks`` returned, either way: they are no longer in flight."""
        self.in_flight.difference_update((j.id, j.lease_token) for j, _ in acks)

    # -- the flusher ---------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if self.config.ack_flush_seconds > 0:
                await anyio.sleep(self.config.ack_flush_seconds)
            await self.flush()

    async def flush(self, *, final: bool = False) -> None:
        async with self._lock:
            await self._flush_locked(final=final)

    async def _flush_locked(self, *, final: bool) -> None:
        batch_max = self.config.ack_batch_max
        attempts = 0
        while self.pending:
            batch, self.pending = self.pending[:batch_max], self.pending[batch_max:]
            sending = {(j.id, j.lease_token) for j, _ in batch}
            self.in_flight |= sending
            try:
                accepted = await self.queue.complete(
                    self.owner, [(j.id, j.lease_token, r) for j, r in batch]
                )
            except Exception as exc:  # any: the batch goes back, never lost
                self.in_flight -= sending
                if _is_data_error(exc) and any(r is not None for _, r in batch):
                    # A result PostgreSQL will not store (not JSON, a NUL in text): the work
                    # is done, so acknowledge it without its result rather than block the
                    # acknowledgements behind it forever.
                    log.error("job_results_dropped", jobs=[j.id for j, _ in batch], error=str(exc))
                    self.pending[:0] = [(j, None) for j, _ in batch]
                    continue
                self.pending[:0] = batch
                attempts += 1
                delay = self.loop.failed(exc)
                if final and attempts >= 5:
                    return
                await anyio.sleep(delay)
                continue
            self.in_flight -= sending
            self.loop.ok()
            self.ride = True
            self.acked(batch, accepted)

    def acked(self, batch: list[tuple[Job, Any]], accepted: set[int]) -> None:
        for job, _ in batch:
            if job.id in accepted:
                self.metrics.succeeded.labels(job.kind).inc()
            else:
                self.metrics.completion_refused.labels(job.kind).inc()
                log.warning(
                    "job_completion_refused",
                    job_id=job.id,
                    kind=job.kind,
                    lease_token=job.lease_token,
                )


async def keep_leases(
    queue: Queue,
    owner: str,
    config: WorkerConfig,
    loop: Loop,
    running: dict[Lease, Running],
    acks: Acknowledgements,
) -> None:
    """The heartbeat: every ``heartbeat_interval_seconds`` extend every lease this worker
    holds (running jobs not released, acknowledgements not yet accepted); cancel a running
    job whose lease another worker took. The same statement stores each running job's
    progress (``aivedio.progress``: no statement of its own)."""
    while True:
        await anyio.sleep(config.heartbeat_interval_seconds)
        started = time.monotonic()
        measured = {key: r.meter.value for key, r in running.items() if not r.released}
        leases = [*measured, *acks.leases()]
        try:
            owned = await queue.heartbeat(
                owner, config.lease_seconds, leases, [measured.get(key) for key in leases]
            )
        except Exception as exc:  # any: the next beat, on time, is the retry
            loop.failed(exc)
            continue
        loop.ok()
        for run in list(running.values()):
            if run.claimed_at >= started or run.released:
                continue
            if owned.get(run.job.id) != run.job.lease_token:
                run.lease_lost = True
                run.scope.cancel()


async def release_leases(queue: Queue, owner: str, metrics: WorkerMetrics, jobs: list[Job]) -> None:
    """Give back the leases of jobs cancelled on drain (attempts refunded), retrying while
    the database restarts; after that their leases expire and the reaper gives them back."""
    if not jobs:
        return
    try:
        released = await until_database_answers(
            lambda: queue.release(owner, [(j.id, j.lease_token) for j in jobs]),
            "releasing leases",
            within_seconds=RECORD_SECONDS,
        )
    except Exception as exc:  # their leases expire: the reaper gives them back
        log.error(
            "release_failed",
            jobs=[j.id for j in jobs],
            error_class=error_class(exc),
            error=str(exc),
        )
        return
    for job in jobs:
        metrics.released.labels(job.kind).inc()
    log.info("leases_released", jobs=released)


async def hand_back(queue: Queue, owner: str, jobs: list[Job]) -> None:
    """The claim raced the drain signal: release these untouched (attempts refunded)."""
    try:
        await queue.release(owner, [(j.id, j.lease_token) for j in jobs])
    except Exception as exc:  # their leases expire: the reaper gives them back
        log.error(
            "release_failed",
            jobs=[j.id for j in jobs],
            error_class=error_class(exc),
            error=str(exc),
        )
