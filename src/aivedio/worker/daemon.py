"""The worker daemon: lanes of slots, one claimer per lane, every job under its own deadline.

Shape. One anyio task group owns everything: the signal watcher, the health server, the
LISTEN connection, the heartbeat, the maintenance loop (due retries, expired leases, queue
gauges), the acknowledgement flusher, and a nested group that owns the job tasks. A lane's
claimer claims at most its free slots (never more: a claimed job holds a lease, and a lease
held by a job that is not running is a delay for nobody's benefit), starts one task per job,
and sleeps until a NOTIFY for its lane (on the shared channel, or on this worker's own for
the jobs its stages made for it: ``LocalLanes``), a freed slot, or its poll (see
docs/architecture.md, "Wake-ups", for when it asks the database and when it does not).

Completions are acknowledged in batches by one flusher: while one batch is in flight the
next accumulates, so the statement count falls as load rises. The per-row fencing check in
the ``complete`` statement keeps this exactly-once.

Leases. One heartbeat statement extends every lease this worker holds and returns what it
still owns; a running job missing from that answer was taken over (its lease expired while
we stalled), so its task is cancelled: its results could not be committed anyway.

Backlog pressure (``pipeline/upkeep/backlog.py``). One task refreshes the reading every
``[backlog] check_interval_seconds``; every stage of the worker reads the same one (it is the
``backlog`` service). While outputs near URL expiry wait, a worker that has a fetch lane lets
its media lane fill at most ``media_slots_under_expiry_pressure`` slots and its fetch lane
``fetch_extra_slots_under_expiry_pressure`` more: a lane's claimer claims up to its current
limit, and running jobs are never interrupted by a lower one.

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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import asyncpg

from aivedio.config.load import Config, claim_poll_seconds
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
from aivedio.worker.health import serve_health

log = get_logger("aivedio.worker.daemon")

# How long a worker tries to record a job's failure or deferral while the database does not
# answer (a restart, a failover) before it leaves the lease to expire.
RECORD_SECONDS = 10.0
# How soon a job of a kind this worker cannot run is offered again (to any worker).
UNKNOWN_KIND_RETRY_SECONDS = 30.0
# The LISTEN connection proves it is alive this often (store/listening.py).
LISTEN_KEEPALIVE_SECONDS = 5.0


@dataclass
class _Running:
    job: Job
    scope: anyio.CancelScope
    claimed_at: float
    released: bool = False
    lease_lost: bool = False


RECENT_CLAIMS_KEPT = 1024  # per lane: far more than a notification can lag behind its claim


def _parse_notification(payload: object) -> tuple[str, list[int] | None] | None:
    """``'lane'`` or ``'lane:1,2'`` (queries.sql, enqueue) → (lane, ids or None)."""
    if not isinstance(payload, str):
        return None
    lane, sep, ids = payload.partition(":")
    if not sep:
        return lane, None
    try:
        return lane, [int(job_id) for job_id in ids.split(",")]
    except ValueError:
        return lane, None


@dataclass
class _Lane:
    name: str
    slots: int
    busy: int = 0
    # The slots it may fill now: ``slots``, adjusted under backlog pressure.
    limit: int = -1
    tenant_cursor: int = 0
    wake: anyio.Event = field(default_factory=anyio.Event)
    # Whether the queue may hold jobs for this lane that the last claim did not see: true
    # after a full claim, an enqueue's notification or the poll interval; false after a
    # claim that came back short. A freed slot alone is no reason to ask the database.
    maybe_more: bool = True
    poll_at: float = 0.0
    news: int = 0  # notifications heard; one that arrives during a claim keeps maybe_more
    # Jobs this worker enqueued for itself (``LocalLanes``) since its last claim here: they
    # take free slots before they are claimed, so a second enqueue does not count them again.
    pledged: int = 0
    claiming: bool = False
    # Job ids announced while a claim was in flight: those it did not return may have been
    # committed after its snapshot, so they are news once it returns.
    heard_in_claim: set[int] = field(default_factory=set)
    # The ids this lane claimed lately: an announcement of those alone is old news (the
    # notification of a commit can arrive after a claim already took the job).
    recent: dict[int, None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.limit < 0:
            self.limit = self.slots

    def poke(self, *, news: bool = False) -> None:
        """Wake the lane's loop; ``news``: jobs were enqueued for it since its last claim."""
        if news:
            self.maybe_more = True
            self.news += 1
        self.wake.set()

    def hear(self, ids: list[int] | None) -> None:
        """A notification for this lane, with the new jobs' ids when it named them."""
        if ids is None:
            self.poke(news=True)
        elif self.claiming:
            self.heard_in_claim.update(ids)
        elif any(job_id not in self.recent for job_id in ids):
            self.poke(news=True)

    def claimed(self, ids: set[int]) -> bool:
        """Note a claim's jobs; whether ids announced during it are left for another claim."""
        for job_id in ids:
            self.recent[job_id] = None
        while len(self.recent) > RECENT_CLAIMS_KEPT:
            del self.recent[next(iter(self.recent))]
        left = bool(self.heard_in_claim - ids)
        self.heard_in_claim.clear()
        self.claiming = False
        return left

    async def sleep(self, at_most_seconds: float | None) -> None:
        with anyio.move_on_after(at_most_seconds):
            await self.wake.wait()
        self.wake = anyio.Event()


def _is_data_error(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, asyncpg.DataError | asyncpg.exceptions._base.DataError)


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
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
            name: _Lane(name, lane.slots)
            for name, lane in config.worker.lanes.items()
            if lane.slots > 0
        }
        # Keyed by (job id, lease token): after a lease lapsed under us and we re-claimed the
        # same job, the stale run and the new one are two entries, never one overwriting.
        self._running: dict[tuple[int, int], _Running] = {}
        self._acks: list[tuple[Job, Any]] = []
        self._ack_wake = anyio.Event()
        # One flush at a time: the final flush on drain must wait for one in flight, or
        # cancelling the flusher would lose that batch's acknowledgement.
        self._ack_lock = anyio.Lock()
        # Pending acknowledgements ride on the next claim (one round trip for both) unless a
        # claim that carried some failed: then the ack loop, which can drop a result that
        # PostgreSQL refuses, sends them until one of its flushes succeeds.
        self._acks_ride = True
        # (id, lease token) of acknowledgements being sent: the heartbeat keeps their leases.
        self._acks_in_flight: set[tuple[int, int]] = set()
        self._promote_at = 0.0  # monotonic time of the next promote of due waits
        self._maintenance_wake = anyio.Event()
        self._to_release: list[Job] = []
        self._drain_requested = anyio.Event()
        self._force = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
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
            tg.start_soon(supervise, self.loops["heartbeat"], self._heartbeat_loop)
            tg.start_soon(supervise, self.loops["maintenance"], self._maintenance_loop)
            tg.start_soon(supervise, self.loops["ack_flush"], self._ack_loop)
            await tg.start(self.backlog.run, self._apply_pressure, self.loops["backlog"])
            async with anyio.create_task_group() as jobs_tg:
                async with anyio.create_task_group() as claim_tg:
                    for lane in self._lanes.values():
                        claim_tg.start_soon(
                            supervise,
                            self.loops[f"claim:{lane.name}"],
                            partial(self._lane_loop, lane, jobs_tg),
                        )
                    await self._drain_requested.wait()
                    claim_tg.cancel_scope.cancel()
                await self._wait_for_running()
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(15):
                    await self._flush_acks(final=True)
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

    # -- claiming and running --------------------------------------------------------------

    async def _lane_loop(self, lane: _Lane, jobs_tg: anyio.abc.TaskGroup) -> None:
        wc = self.config.worker
        supervisor = self.loops[f"claim:{lane.name}"]
        while not self.draining:
            free = lane.limit - lane.busy
            if free <= 0:
                if lane.pledged:
                    # Full, with jobs announced to this worker alone since its last claim
                    # (reserved while a claim was in flight): let the fleet take them.
                    lane.pledged = 0
                    await self._announce(lane.name)
                await lane.sleep(None)
                continue
            polled = False  # this claim is the idle poll, not news or a full claim
            if not lane.maybe_more:
                remaining = lane.poll_at - anyio.current_time()
                if remaining > 0:
                    await lane.sleep(remaining)  # until news, a freed slot or the poll
                    continue
                lane.maybe_more = polled = True
            want = min(free, wc.claim_batch_max)
            news_seen = lane.news
            pledged, lane.pledged = lane.pledged, 0  # this claim takes what was enqueued for us
            lane.claiming = True
            jobs: list[Job] | None = None
            retry_in = 0.0
            acks: list[tuple[Job, Any]] = []
            if self._acks_ride:
                acks, self._acks = self._acks[: wc.ack_batch_max], self._acks[wc.ack_batch_max :]
                self._acks_in_flight.update((j.id, j.lease_token) for j, _ in acks)
            # Shielded: a drain must not cancel a claim the server may already have
            # committed, or those jobs would be held by nobody until their leases expire.
            with anyio.CancelScope(shield=True):
                try:
                    jobs, accepted = await self.queue.claim_and_complete(
                        lane.name,
                        want,
                        self.owner,
                        wc.lease_seconds,
                        self.config.queue.max_tenants_per_claim,
                        lane.tenant_cursor,
                        [(j.id, j.lease_token, r) for j, r in acks],
                    )
                    supervisor.ok()
                    self._acked(acks, accepted)
                    # Next round starts past the last tenant served (wrapping), so a lane
                    # with more tenants than one round walks leaves none of them out.
                    lane.tenant_cursor = max((j.tenant_id for j in jobs), default=-1) + 1
                except Exception as exc:  # any: the claimer must outlive what it meets
                    retry_in = supervisor.failed(exc)
                    if acks:  # back to the ack loop, which knows what to do with a bad result
                        self._acks[:0] = acks
                        self._acks_ride = False
                        self._ack_wake.set()
                finally:
                    left_over = lane.claimed({j.id for j in jobs or ()})
                    self._acks_in_flight.difference_update((j.id, j.lease_token) for j, _ in acks)
                if self.draining and jobs:
                    await self._hand_back(jobs)
                    return
            if jobs is None:
                await anyio.sleep(retry_in)
                continue
            now = time.monotonic()
            for job in jobs:
                lane.busy += 1
                scope = anyio.CancelScope(deadline=anyio.current_time() + job.timeout_seconds)
                self._running[(job.id, job.lease_token)] = _Running(job, scope, now)
                self._idle = anyio.Event()
                self.metrics.claimed.labels(job.kind).inc()
                jobs_tg.start_soon(self._run_alone, lane, self._running[(job.id, job.lease_token)])
            self.metrics.slots_busy.labels(lane.name).set(lane.busy)
            if len(jobs) < want and lane.news == news_seen and not left_over:
                lane.maybe_more = False
                # Short after news: look again after one poll interval (a concurrent claim
                # may have held rows it did not take, SKIP LOCKED hid them); only a poll that
                # found nothing at all waits the longer idle interval.
                idle = polled and not jobs
                lane.poll_at = anyio.current_time() + (
                    claim_poll_seconds(wc) if idle else wc.poll_interval_seconds
                )
            elif pledged and len(jobs) == want and lane.busy >= lane.limit:
                # Full, and no slot left to claim again: jobs this worker announced to itself
                # alone may be left behind (the claim takes the most urgent first); let the
                # fleet know they are there.
                await self._announce(lane.name)

    async def _announce(self, lane: str) -> None:
        try:
            await self.queue.notify([lane])
        except Exception as exc:  # the other workers' polls are the fallback
            log.warning("announce_failed", lane=lane, error_class=error_class(exc), error=str(exc))

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
        """Lane limits for this reading: while outputs near expiry wait, the media lane
        yields to the fetch lane (only where both run, i.e. compete for this machine)."""
        cfg = self.config.backlog
        fetch, media = self._lanes.get("fetch"), self._lanes.get("media")
        fetch_first = self.backlog.fetch_first and fetch is not None
        limits: dict[str, int] = {}
        if media is not None:
            limits["media"] = (
                min(media.slots, cfg.media_slots_under_expiry_pressure)
                if fetch_first
                else media.slots
            )
        if fetch is not None:
            extra = cfg.fetch_extra_slots_under_expiry_pressure if fetch_first else 0
            limits["fetch"] = fetch.slots + extra
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

    async def _hand_back(self, jobs: list[Job]) -> None:
        """The claim raced the drain signal: release these untouched (attempts refunded)."""
        try:
            await self.queue.release(self.owner, [(j.id, j.lease_token) for j in jobs])
        except Exception as exc:  # their leases expire: the reaper gives them back
            log.error(
                "release_failed",
                jobs=[j.id for j in jobs],
                error_class=error_class(exc),
                error=str(exc),
            )

    async def _run_alone(self, lane: _Lane, running: _Running) -> None:
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

    async def _run_job(self, lane: _Lane, running: _Running) -> None:
        job = running.job
        kind = self.registry.get(job.kind)
        error: AivedioError | None = None
        result: Any = None
        finished = False
        try:
            if kind is not None:
                with running.scope:
                    result = await kind.handler(self.context, job)
                    finished = True
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
            self._acks.append((job, result))
            self._ack_wake.set()
        else:
            await self._fail(job, error)

    async def _defer(self, job: Job, error: DeferredError) -> None:
        delay = error.retry_after_seconds or self.config.queue.backoff_base_seconds
        self._promote_by(delay)
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
                    self._promote_by(decision.delay_seconds)
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

    # -- acknowledgements and leases -------------------------------------------------------

    async def _ack_loop(self) -> None:
        while True:
            await self._ack_wake.wait()
            self._ack_wake = anyio.Event()
            if self.config.worker.ack_flush_seconds > 0:
                await anyio.sleep(self.config.worker.ack_flush_seconds)
            await self._flush_acks()

    async def _flush_acks(self, *, final: bool = False) -> None:
        async with self._ack_lock:
            await self._flush_acks_locked(final=final)

    async def _flush_acks_locked(self, *, final: bool) -> None:
        batch_max = self.config.worker.ack_batch_max
        attempts = 0
        while self._acks:
            batch, self._acks = self._acks[:batch_max], self._acks[batch_max:]
            sending = {(j.id, j.lease_token) for j, _ in batch}
            self._acks_in_flight |= sending
            try:
                accepted = await self.queue.complete(
                    self.owner, [(j.id, j.lease_token, r) for j, r in batch]
                )
            except Exception as exc:  # any: the batch goes back, never lost
                self._acks_in_flight -= sending
                if _is_data_error(exc) and any(r is not None for _, r in batch):
                    # A result PostgreSQL will not store (not JSON, a NUL in text): the work
                    # is done, so acknowledge it without its result rather than block the
                    # acknowledgements behind it forever.
                    log.error("job_results_dropped", jobs=[j.id for j, _ in batch], error=str(exc))
                    self._acks[:0] = [(j, None) for j, _ in batch]
                    continue
                self._acks[:0] = batch
                attempts += 1
                delay = self.loops["ack_flush"].failed(exc)
                if final and attempts >= 5:
                    return
                await anyio.sleep(delay)
                continue
            self._acks_in_flight -= sending
            self.loops["ack_flush"].ok()
            self._acks_ride = True
            self._acked(batch, accepted)

    def _acked(self, batch: list[tuple[Job, Any]], accepted: set[int]) -> None:
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

    async def _release_leases(self) -> None:
        jobs, self._to_release = self._to_release, []
        if not jobs:
            return
        try:
            released = await until_database_answers(
                lambda: self.queue.release(self.owner, [(j.id, j.lease_token) for j in jobs]),
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
            self.metrics.released.labels(job.kind).inc()
        log.info("leases_released", jobs=released)

    async def _heartbeat_loop(self) -> None:
        wc = self.config.worker
        while True:
            await anyio.sleep(wc.heartbeat_interval_seconds)
            started = time.monotonic()
            leases = [key for key, r in self._running.items() if not r.released]
            leases += [(job.id, job.lease_token) for job, _ in self._acks]
            leases += self._acks_in_flight
            try:
                owned = await self.queue.heartbeat(self.owner, wc.lease_seconds, leases)
            except Exception as exc:  # any: the next beat, on time, is the retry
                self.loops["heartbeat"].failed(exc)
                continue
            self.loops["heartbeat"].ok()
            for running in list(self._running.values()):
                if running.claimed_at >= started or running.released:
                    continue
                if owned.get(running.job.id) != running.job.lease_token:
                    running.lease_lost = True
                    running.scope.cancel()

    def _promote_by(self, delay_seconds: float) -> None:
        """A wait this worker set ends in ``delay_seconds``: promote no later than that."""
        at = time.monotonic() + delay_seconds
        if at < self._promote_at:
            self._promote_at = at
            self._maintenance_wake.set()

    async def _maintenance_loop(self) -> None:
        wc = self.config.worker
        last_reap = last_stats = 0.0
        while True:
            asked = False  # whether this round asked the database anything (then: ok)
            try:
                now = time.monotonic()
                if now >= self._promote_at:
                    # Next when the earliest wait is due, or the idle poll: waits set later by
                    # this worker move it closer (_promote_by); another worker's are promoted
                    # by that worker, or here within claim_poll_seconds if it died.
                    self._promote_at = now + claim_poll_seconds(wc)
                    _, next_due = await self.queue.promote()
                    asked = True
                    if next_due is not None:
                        self._promote_by(next_due)
                if now - last_reap >= min(wc.lease_seconds / 4, 5.0):
                    last_reap = now
                    for job_id, _lane, kind, outcome in await self.queue.reap():
                        self.metrics.lease_expiries.labels(kind).inc()
                        log.warning("lease_expired", job_id=job_id, kind=kind, outcome=outcome)
                    asked = True
                if now - last_stats >= 5.0:
                    last_stats = now
                    await self._refresh_queue_gauges()
                    asked = True
                if asked:
                    self.loops["maintenance"].ok()
            except Exception as exc:  # any: the next round, within the poll interval, retries
                self.loops["maintenance"].failed(exc)
                self._promote_by(wc.poll_interval_seconds)
            with anyio.move_on_after(
                min(wc.poll_interval_seconds, max(self._promote_at - time.monotonic(), 0.01))
            ):
                await self._maintenance_wake.wait()
            self._maintenance_wake = anyio.Event()

    async def _refresh_queue_gauges(self) -> None:
        stats = await self.queue.stats()
        for kind in self.registry:
            depth, oldest = stats.get(kind.name, (0, 0.0))
            self.metrics.queue_depth.labels(kind.name).set(depth)
            self.metrics.queue_oldest.labels(kind.name).set(oldest)

    async def _listen(self) -> None:
        """LISTEN for enqueues; the poll interval covers any gap while reconnecting."""

        def on_notify(_c: object, _pid: int, _channel: str, payload: object) -> None:
            heard = _parse_notification(payload)
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
