"""The worker's maintenance loop: due waits promoted, expired leases reaped, queue gauges
refreshed.

``poll_interval_seconds`` is its beat. Due waits (retries, deferrals, held pieces) become
``queued`` by a promote that also answers when the next wait is due: this worker promotes at
that time, or at once when it sets a wait itself that ends sooner (``promote_by``), and
otherwise every ``claim_poll_seconds`` (the net for the waits of a worker that died).
"""

from __future__ import annotations

import time

import anyio

from aivedio.config.worker import WorkerConfig, claim_poll_seconds
from aivedio.logs import get_logger
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.jobs import Registry
from aivedio.store.queue import Queue
from aivedio.supervision import Loop

# The worker's events keep the logger name they have always had, whichever module says them.
log = get_logger("aivedio.worker.daemon")


class Maintenance:
    """What keeps the queue moving for every worker: promotes, reaps, gauges. It owns when
    the next promote is due; it never claims, runs or acknowledges a job."""

    def __init__(
        self,
        queue: Queue,
        registry: Registry,
        config: WorkerConfig,
        metrics: WorkerMetrics,
        loop: Loop,
    ) -> None:
        self.queue = queue
        self.registry = registry
        self.config = config
        self.metrics = metrics
        self.loop = loop  # its supervised loop ("maintenance")
        self._promote_at = 0.0  # monotonic time of the next promote of due waits
        self._wake = anyio.Event()

    def promote_by(self, delay_seconds: float) -> None:
        """A wait this worker set ends in ``delay_seconds``: promote no later than that."""
        at = time.monotonic() + delay_seconds
        if at < self._promote_at:
            self._promote_at = at
            self._wake.set()

    async def run(self) -> None:
        wc = self.config
        last_reap = last_stats = 0.0
        while True:
            asked = False  # whether this round asked the database anything (then: ok)
            try:
                now = time.monotonic()
                if now >= self._promote_at:
                    # Next when the earliest wait is due, or the idle poll: waits set later by
                    # this worker move it closer (promote_by); another worker's are promoted
                    # by that worker, or here within claim_poll_seconds if it died.
                    self._promote_at = now + claim_poll_seconds(wc)
                    _, next_due = await self.queue.promote()
                    asked = True
                    if next_due is not None:
                        self.promote_by(next_due)
                if now - last_reap >= min(wc.lease_seconds / 4, 5.0):
                    last_reap = now
                    for job_id, _lane, kind, outcome in await self.queue.reap():
                        self.metrics.lease_expiries.labels(kind).inc()
                        log.warning("lease_expired", job_id=job_id, kind=kind, outcome=outcome)
                    asked = True
                if now - last_stats >= 5.0:
                    last_stats = now
                    await self.refresh_queue_gauges()
                    asked = True
                if asked:
                    self.loop.ok()
            except Exception as exc:  # any: the next round, within the poll interval, retries
                self.loop.failed(exc)
                self.promote_by(wc.poll_interval_seconds)
            with anyio.move_on_after(
                min(wc.poll_interval_seconds, max(self._promote_at - time.monotonic(), 0.01))
            ):
                await self._wake.wait()
            self._wake = anyio.Event()

    async def refresh_queue_gauges(self) -> None:
        stats = await self.queue.stats()
        for kind in self.registry:
            depth, oldest = stats.get(kind.name, (0, 0.0))
            self.metrics.queue_depth.labels(kind.name).set(depth)
            self.metrics.queue_oldest.labels(kind.name).set(oldest)
