"""The worker daemon: the process that runs jobs, from start to drain.

Shape. One anyio task group owns everything: the signal watcher, the health server
(``health.py``), the LISTEN connection, the heartbeat and the acknowledgement flusher
(``leases.py``), the maintenance loop (due retries, expired leases, queue gauges:
``maintenance.py``), and a nested group that owns the job tasks. Each lane (``lanes.py``) has
one claimer (``claimers.py``) that claims at most its free slots; every job then runs in its
own task under its own deadline (``Worker._run_job``).

Backlog pressure (``pipeline/upkeep/backlog.py``). One task refreshes the reading every
``[backlog] check_interval_seconds``; every stage of the worker reads the same one (it is the
``backlog`` service), and the lanes' limits follow it (``lanes.limits_under_pressure``).

Metrics. The worker's ``WorkerMetrics`` (given, or its own) reach every stage as the
``metrics`` service; the command that opens the object store wraps it in
``store.metered.MeteredObjectStore`` over the same metrics before the stages get it. The age
of the oldest running job of each kind is read from the running set at each scrape.

Supervision. Every loop above runs under ``supervision.supervise`` with its own ``Loop``
(``self.loops``): it survives any exception but cancellation, backs off, logs one event, and
is down in ``self.conditions`` (``/readyz``) until its next success.

Drain. SIGTERM or SIGINT: stop claiming at once; let running jobs finish for up to
``drain_timeout_seconds``; then cancel what is left and release those leases without
spending their attempt; flush acknowledgements; exit 0. A second signal skips the wait.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import anyio.abc

from aivedio import progress
from aivedio.config.load import Config
from aivedio.errors import AivedioError, DeferredError, TransientError, unexpected
from aivedio.logs import get_logger, redact_text
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.jobs import JobContext, Registry
from aivedio.pipeline.upkeep.backlog import BacklogMonitor, Reading
from aivedio.scheduling import decide_retry
from aivedio.store import listening
from aivedio.store.database import Pool, lost_server, until_database_answers
from aivedio.store.queue import NOTIFY_CHANNEL, Job, LocalLanes, Queue
from aivedio.supervision import Conditions, Loop, error_class, supervise
from aivedio.worker.claimers import Claimer
from aivedio.worker.health import serve_health
from aivedio.worker.lanes import Lane, limits_under_pressure, parse_notification
from aivedio.worker.leases import (
    RECORD_SECONDS,
    Acknowledgements,
    Running,
    keep_leases,
    release_leases,
)
from aivedio.worker.maintenance import Maintenance

log = get_logger("aivedio.worker.daemon")

# How soon a job of a kind this worker cannot run is offered again (to any worker).
UNKNOWN_KIND_RETRY_SECONDS = 30.0
# The LISTEN connection proves it is alive this often (store/listening.py).
LISTEN_KEEPALIVE_SECONDS = 5.0


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """One worker process: it owns its lanes and their claimers, the jobs it runs (each in
    its own task, under its deadline), the outcome it records for each (acknowledged,
    retried, deferred, buried or released), its leases, its LISTEN connection, its health
    endpoint and its drain. It never runs a job whose lease it lost (the heartbeat cancels
    that run, and its outcome is not recorded), never decides what a job does (the
    registry's handlers do, with ``self.context``), and holds no SQL of its own: every
    statement goes through ``store.queue.Queue``."""

    def __init__(
        self,
        config: Config,
        pool: Pool,
        registry: Registry,
        *,
        services: dict[str, Any] | None = None,
        owner: str | None = None,
        readiness: Callable[[], Any] | None = None,
        metrics: WorkerMetrics | None = None,
        queue: Queue | None = None,
        conditions: Conditions | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.registry = registry
        self.owner = owner or default_owner()
        # This worker's own notification channel (see LocalLanes); heard only while listening.
        self._channel = f"{NOTIFY_CHANNEL}_{secrets.token_hex(8)}"
        self._listening = False
        # The stages enqueue through the same queue object (``queue``, when given), so the
        # jobs they make for this worker wake it alone.
        self.queue = queue or Queue(
            pool, default_start_within_seconds=config.queue.default_start_within_seconds
        )
        self.queue.local = LocalLanes(self._channel, self._reserve, self._unreserve)
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        # What keeps this worker from working, for /readyz: each loop below runs supervised
        # (supervision.py) and is down here while it fails.
        self.conditions = conditions or Conditions(self.metrics.supervision)
        self.loops = {
            name: Loop(name, conditions=self.conditions, event=event, owner=self.owner)
            for name, event in (
                ("listen", "listen_connection_lost"),
                ("heartbeat", "heartbeat_failed"),
                ("maintenance", "maintenance_failed"),
                ("ack_flush", "ack_failed"),
                ("backlog", "backlog_check_failed"),
            )
        }
        self.context = JobContext(owner=self.owner, services=dict(services or {}))
        # Shared by every stage of this worker (the media stage defers optional outputs by
        # it); a caller may supply its own.
        self.backlog: BacklogMonitor = self.context.services.setdefault(
            "backlog", BacklogMonitor(config.backlog, pool, self.metrics.backlog)
        )
        self.context.services.setdefault("metrics", self.metrics)
        self.draining = False
        self.http_port: int | None = None
        self._lanes = {
            name: Lane(name, lane.slots)
            for name, lane in config.worker.lanes.items()
            if lane.slots > 0
        }
        # Whether no media job waits for this worker (the probe makes the enrichment in its
        # own slot only then: ``probe_stage``); a worker without a media lane has none.
        media = self._lanes.get("media")
        self.context.services.setdefault(
            "media_queue_empty", media.nothing_waiting if media else lambda: True
        )
        # Keyed by (job id, lease token): after a lease lapsed under us and we re-claimed the
        # same job, the stale run and the new one are two entries, never one overwriting.
        self._running: dict[tuple[int, int], Running] = {}
        self.acks = Acknowledgements(
            self.queue, self.owner, config.worker, self.metrics, self.loops["ack_flush"]
        )
        self.maintenance = Maintenance(
            self.queue, registry, config.worker, self.metrics, self.loops["maintenance"]
        )
        self._to_release: list[Job] = []
        self._drain_requested = anyio.Event()
        self._force = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._claimers: list[Claimer] = []
        for lane in self._lanes.values():
            self.loops[f"claim:{lane.name}"] = Loop(
                f"claim:{lane.name}",
                conditions=self.conditions,
                event="claim_failed",
                base_seconds=0.2,
                max_seconds=5.0,
                owner=self.owner,
                lane=lane.name,
            )
            self._claimers.append(
                Claimer(
                    lane,
                    self.loops[f"claim:{lane.name}"],
                    queue=self.queue,
                    owner=self.owner,
                    config=config,
                    acks=self.acks,
                    draining=lambda: self.draining,
                    start=self._start_jobs,
                )
            )
            self.metrics.slots_total.labels(lane.name).set(lane.slots)
            self.metrics.slots_busy.labels(lane.name).set(0)
            self.metrics.slot_limit.labels(lane.name).set(lane.limit)
        # The kinds this worker can run (a 0 while none runs), plus any it has run.
        self._running_kinds = {kind.name for kind in registry if kind.lane in self._lanes}
        self.metrics.before_scrape(self._observe_running)

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        wc = self.config.worker
        log.info(
            "worker_starting",
            owner=self.owner,
            lanes={n: lane.slots for n, lane in self._lanes.items()},
        )
        async with anyio.create_task_group() as tg:
            if install_signal_handlers:
                tg.start_soon(self._watch_signals)
            self.http_port = await tg.start(serve_health, self, wc.http_host, wc.http_port)
            tg.start_soon(self._listen)
            heartbeat = partial(
                keep_leases,
                self.queue,
                self.owner,
                wc,
                self.loops["heartbeat"],
                self._running,
                self.acks,
            )
            tg.start_soon(supervise, self.loops["heartbeat"], heartbeat)
            tg.start_soon(supervise, self.loops["maintenance"], self.maintenance.run)
            tg.start_soon(supervise, self.loops["ack_flush"], self.acks.run)
            await tg.start(self.backlog.run, self._apply_pressure, self.loops["backlog"])
            async with anyio.create_task_group() as jobs_tg:
                async with anyio.create_task_group() as claim_tg:
                    for claimer in self._claimers:
                        claim_tg.start_soon(supervise, claimer.loop, partial(claimer.run, jobs_tg))
                    await self._drain_requested.wait()
                    claim_tg.cancel_scope.cancel()
                await self._wait_for_running()
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(15):
                    await self.acks.flush(final=True)
                with anyio.move_on_after(10):
                    await self._release_leases()
            tg.cancel_scope.cancel()
        log.info("worker_stopped", owner=self.owner)

    def request_drain(self, *, force: bool = False) -> None:
        if not self.draining:
            log.info(
                "worker_draining",
                owner=self.owner,
                running=len(self._running),
                drain_timeout_seconds=self.config.worker.drain_timeout_seconds,
            )
        self.draining = True
        self.metrics.draining.set(1)
        self._drain_requested.set()
        for lane in self._lanes.values():
            lane.poke()
        if force:
            self._force.set()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("worker_signal", signal=signal.Signals(signum).name)
                self.request_drain(force=self.draining)

    async def _wait_for_running(self) -> None:
        with anyio.move_on_after(self.config.worker.drain_timeout_seconds):
            async with anyio.create_task_group() as tg:

                async def forced() -> None:
                    await self._force.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(forced)
                await self._idle.wait()
                tg.cancel_scope.cancel()
        unfinished = list(self._running.values())
        if unfinished:
            log.warning(
                "worker_drain_timeout", owner=self.owner, cancelling=[r.job.id for r in unfinished]
            )
        for running in unfinished:
            running.released = True
            running.scope.cancel()

    def _observe_running(self) -> None:
        now = time.monotonic()
        oldest: dict[str, float] = {}
        for running in self._running.values():
            kind = running.job.kind
            oldest[kind] = max(oldest.get(kind, 0.0), now - running.claimed_at)
        self._running_kinds.update(oldest)
        for kind in self._running_kinds:
            self.metrics.running_oldest.labels(kind).set(oldest.get(kind, 0.0))

    async def _release_leases(self) -> None:
        jobs, self._to_release = self._to_release, []
        await release_leases(self.queue, self.owner, self.metrics, jobs)

    # -- slots ---------------------------------------------------------------------------

    def _unreserve(self, unused: dict[str, int]) -> None:
        """Give back promised slots of jobs an enqueue did not create (known keys)."""
        for name, count in unused.items():
            lane = self._lanes.get(name)
            if lane is not None:
                lane.pledged = max(0, lane.pledged - count)

    def _reserve(self, wanted: dict[str, int]) -> list[str]:
        """The lanes of an enqueue that this worker will claim itself (``LocalLanes``): those
        whose jobs fit its free slots, while it listens and is not draining."""
        if self.draining or not self._listening:
            return []
        mine = []
        for name, count in wanted.items():
            lane = self._lanes.get(name)
            if lane is not None and count <= lane.limit - lane.busy - lane.pledged:
                lane.pledged += count
                mine.append(name)
        return mine

    def _apply_pressure(self, reading: Reading) -> None:
        """Lane limits for this reading (``lanes.limits_under_pressure``); a lane whose
        limit changed wakes its claimer."""
        limits = limits_under_pressure(
            self._lanes, self.config.backlog, fetch_first=self.backlog.fetch_first
        )
        for name, limit in limits.items():
            lane = self._lanes[name]
            if lane.limit != limit:
                log.info(
                    "lane_limit_changed",
                    lane=name,
                    limit=limit,
                    slots=lane.slots,
                    reason=reading.describe(),
                )
                lane.limit = limit
                self.metrics.slot_limit.labels(name).set(limit)
                lane.poke()

    # -- running ---------------------------------------------------------------------------

    def _start_jobs(self, lane: Lane, jobs: list[Job], jobs_tg: anyio.abc.TaskGroup) -> None:
        """A claim's jobs: one slot and one task each, under the job's own deadline."""
        now = time.monotonic()
        for job in jobs:
            lane.busy += 1
            scope = anyio.CancelScope(deadline=anyio.current_time() + job.timeout_seconds)
            self._running[(job.id, job.lease_token)] = Running(job, scope, now)
            self._idle = anyio.Event()
            self.metrics.claimed.labels(job.kind).inc()
            jobs_tg.start_soon(self._run_alone, lane, self._running[(job.id, job.lease_token)])
        self.metrics.slots_busy.labels(lane.name).set(lane.busy)

    async def _run_alone(self, lane: Lane, running: Running) -> None:
        """``_run_job``, whose exceptions stop at the job (the last line: a handler's are
        recorded as the job's failure; one in recording its outcome would otherwise end the
        task group of every job, and the worker). Its lease then expires: the reaper returns
        the job."""
        try:
            await self._run_job(lane, running)
        except Exception as exc:
            job = running.job
            log.error(
                "job_outcome_not_recorded",
                job_id=job.id,
                kind=job.kind,
                error_class=error_class(exc),
                error=redact_text(str(exc)),
            )

    async def _run_job(self, lane: Lane, running: Running) -> None:
        job = running.job
        kind = self.registry.get(job.kind)
        error: AivedioError | None = None
        result: Any = None
        finished = False
        try:
            if kind is not None:
                measuring = progress.current.set(running.meter)
                try:
                    with running.scope:
                        result = await kind.handler(self.context, job)
                        finished = True
                finally:
                    progress.current.reset(measuring)
                if not finished and not running.released and not running.lease_lost:
                    error = TransientError(f"deadline of {job.timeout_seconds:g}s exceeded")
                    error.error_class = "deadline_exceeded"
        except AivedioError as exc:
            error = exc
        except Exception as exc:
            lost = lost_server(exc)
            if lost is not None:  # a restart or failover under a stage's own pool call
                error = lost
                log.warning(
                    "job_database_lost",
                    job_id=job.id,
                    kind=job.kind,
                    error=redact_text(lost.detail),
                )
            else:
                error = unexpected(exc, redact_text(f"{type(exc).__name__}: {exc}"))
                log.exception(
                    "job_crashed", job_id=job.id, kind=job.kind, error_class=error.error_class
                )
        finally:
            del self._running[(job.id, job.lease_token)]
            lane.busy -= 1
            self.metrics.slots_busy.labels(lane.name).set(lane.busy)
            lane.poke()
            if not self._running:
                self._idle.set()
        if kind is None:
            # A kind this build does not know (a newer release enqueued it during a rolling
            # deploy): hand it back for a worker that does, without spending an attempt.
            unknown = DeferredError(
                f"no handler for job kind {job.kind!r} in this worker",
                retry_after_seconds=UNKNOWN_KIND_RETRY_SECONDS,
            )
            unknown.error_class = "unknown_kind"
            await self._defer(job, unknown)
        elif running.released:
            self._to_release.append(job)
        elif running.lease_lost:
            self.metrics.completion_refused.labels(job.kind).inc()
            log.warning("job_lease_lost", job_id=job.id, kind=job.kind)
        elif error is None:
            self.acks.add(job, result)
        else:
            await self._fail(job, error)

    async def _defer(self, job: Job, error: DeferredError) -> None:
        delay = error.retry_after_seconds or self.config.queue.backoff_base_seconds
        self.maintenance.promote_by(delay)
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(RECORD_SECONDS + 2):
                await until_database_answers(
                    lambda: self.queue.retry_later(
                        job,
                        self.owner,
                        delay_seconds=delay,
                        penalty_seconds=0,
                        error_class=error.error_class,
                        detail=redact_text(error.detail),
                        refund_attempt=True,
                    ),
                    "deferring a job",
                    within_seconds=RECORD_SECONDS,
                )
        except Exception as exc:  # any: the lease expires and the reaper returns the job
            log.error(
                "job_defer_failed",
                job_id=job.id,
                kind=job.kind,
                error_class=error_class(exc),
                error=str(exc),
            )
            return
        log.info(
            "job_deferred",
            job_id=job.id,
            kind=job.kind,
            error_class=error.error_class,
            detail=error.detail,
            delay_seconds=round(delay, 3),
        )

    async def _fail(self, job: Job, error: AivedioError) -> None:
        qc = self.config.queue
        if isinstance(error, DeferredError):
            await self._defer(job, error)
            return
        self.metrics.failed.labels(job.kind, error.error_class).inc()
        decision = decide_retry(
            retry_class=error.retry,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            base_seconds=qc.backoff_base_seconds,
            max_seconds=qc.backoff_max_seconds,
            retry_after_seconds=error.retry_after_seconds,
        )
        detail = redact_text(error.detail)

        async def record() -> bool:
            if decision.retry:
                return await self.queue.retry_later(
                    job,
                    self.owner,
                    delay_seconds=decision.delay_seconds,
                    penalty_seconds=qc.retry_penalty_seconds * job.attempts,
                    error_class=error.error_class,
                    detail=detail,
                )
            return await self.queue.bury(
                job, self.owner, error_class=error.error_class, detail=detail
            )

        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(RECORD_SECONDS + 2):
                if decision.retry:
                    self.maintenance.promote_by(decision.delay_seconds)
                # Again while the database restarts: a failure left unrecorded would leave
                # the lease to expire, which the reaper counts as a crash (the poison rule).
                ok = await until_database_answers(
                    record, "recording a job's failure", within_seconds=RECORD_SECONDS
                )
                (self.metrics.retried if decision.retry else self.metrics.dead).labels(
                    job.kind
                ).inc()
        except Exception as exc:  # any: the lease expires and the reaper returns the job
            log.error(
                "job_failure_not_recorded",
                job_id=job.id,
                kind=job.kind,
                error_class=error_class(exc),
                error=str(exc),
            )
            return
        event = "job_retry_scheduled" if decision.retry else "job_dead"
        log.warning(
            event,
            job_id=job.id,
            kind=job.kind,
            tenant_id=job.tenant_id,
            attempt=job.attempts,
            error_class=error.error_class,
            detail=detail,
            delay_seconds=round(decision.delay_seconds, 3),
            reason=decision.reason,
            recorded=ok,
        )

    # -- notifications -------------------------------------------------------------------

    async def _listen(self) -> None:
        """LISTEN for enqueues; the poll interval covers any gap while reconnecting."""

        def on_notify(_c: object, _pid: int, _channel: str, payload: object) -> None:
            heard = parse_notification(payload)
            if heard is not None and heard[0] in self._lanes:
                self._lanes[heard[0]].hear(heard[1])

        def on_listening() -> None:
            # Enqueues made while we were not listening announced nothing to us.
            for lane in self._lanes.values():
                lane.poke(news=True)
            self._listening = True

        def on_stopped() -> None:
            self._listening = False

        await listening.run(
            self.loops["listen"],
            self.config.database,
            {NOTIFY_CHANNEL: on_notify, self._channel: on_notify},
            on_listening=on_listening,
            on_stopped=on_stopped,
            keepalive_seconds=LISTEN_KEEPALIVE_SECONDS,
        )
