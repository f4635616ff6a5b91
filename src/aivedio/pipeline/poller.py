"""The poller: watched generation tasks, read from their provider until they end.

A task submitted elsewhere is registered (``POST /v1/generation-tasks``, ``aivedio watch``,
or a callback that is only a hint) with ``register_watch``: one ``task_watches`` row and one
control-lane job per ``(provider, provider task id)``, so registering twice changes nothing.

Each run of the job reads the task once and then puts itself off (``DeferredError``: the
attempt is refunded, so a long generation never exhausts a retry budget):

* still running: again after the provider's cadence, ± its jitter;
* 429, 5xx, a network failure: again after an exponential backoff with jitter, never sooner
  than the provider's ``Retry-After``; given up after ``MAX_CONSECUTIVE_FAILURES``. A 429
  is about our account, not the one task: it also holds every poll of that provider in this
  worker until ``Retry-After`` (or the backoff) has passed, so other watched tasks do not
  keep a throttling vendor busy;
* 404, the provider does not know the task (a mistyped id, or a forged hint for an id it
  never issued): given up after ``MAX_NOT_FOUND_READS`` such answers, not after hours of
  backoff that spend the provider's request budget of every other watched task;
* this worker's budget of requests to the provider is spent (``poll_requests_per_second``):
  again when it has one, without asking;
* SUCCEEDED: the outputs are recorded by ``intake.record_task_outputs``, exactly as a
  verified callback records them, and the watch ends; FAILED or CANCELLED: the task is
  marked PROVIDER_FAILED and the watch ends. A watch older than ``watch_max_seconds`` is
  given up (registering it again starts a new round). Nothing here ever submits a generation.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from aivedio.config.load import Config
from aivedio.errors import (
    AivedioError,
    DeferredError,
    NotFoundError,
    PolicyBlockedError,
    ThrottledError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.pipeline import jobs
from aivedio.pipeline.intake import record_task_outputs
from aivedio.pipeline.jobs import JobContext, Registry
from aivedio.providers import check_open, check_task_id
from aivedio.providers.seam import ProviderAdapter, ProviderTask, check_reported
from aivedio.states import Entity, allowed
from aivedio.store import generation_tasks
from aivedio.store.database import Connection, acquired, map_db_errors, transaction
from aivedio.store.generation_tasks import end_watch
from aivedio.store.queue import Job, Queue
from aivedio.store.records import transition

log = get_logger("aivedio.poller")

KIND = jobs.POLL.name
LANE = jobs.POLL.lane
MAX_CONSECUTIVE_FAILURES = 30
MAX_NOT_FOUND_READS = 3
MAX_BACKOFF_SECONDS = 600.0
MIN_DELAY_SECONDS = 0.05
FINISHED_TASK_STATES = {
    "PROVIDER_SUCCEEDED": "SUCCEEDED",
    "PROVIDER_FAILED": "FAILED",
    "CANCELLED": "FAILED",
}


class WatchRegistration(msgspec.Struct, frozen=True, kw_only=True):
    generation_task_id: uuid.UUID
    provider: str
    provider_task_id: str
    status: str
    created: bool
    poll_job_id: int | None


def can_poll(config: Config, provider: str) -> bool:
    pc = config.providers.get(provider)
    return pc is not None and (pc.adapter != "generic" or bool(pc.api_base_url))


async def register_watch(
    conn: Connection,
    *,
    queue: Queue,
    config: Config,
    provider: str,
    provider_task_id: str,
    tenant_id: int,
    hurry: bool = False,
    passthrough: str | None = None,
) -> WatchRegistration:
    """Watch a task (idempotent); ``hurry`` makes a waiting poll due now (a callback hint).

    Raises NotFoundError for a provider we cannot poll, PolicyBlockedError whose detail
    starts with its reason: ``provider_shut_down`` (the vendor's API is gone),
    ``invalid_task_id`` (not an id the provider issues),
    ``provider_of_another_tenant`` (``[providers.NAME] tenant`` names another tenant: that
    account's tasks and credentials are its own) or ``tenant_mismatch`` (a task another
    tenant registered)."""
    if not can_poll(config, provider):
        raise NotFoundError(f"provider {provider!r} is not configured with an API to poll")
    pc = config.providers[provider]
    check_open(provider, pc)
    check_task_id(pc, provider_task_id)
    doing = "registering a watched task"
    async with transaction(conn):
        with map_db_errors(doing):
            if pc.tenant:
                owner = await generation_tasks.tenant_id_named(conn, pc.tenant, doing=doing)
                if owner != tenant_id:
                    raise PolicyBlockedError(
                        f"provider_of_another_tenant: provider {provider!r} is another "
                        "tenant's account; its tasks cannot be watched for this tenant"
                    )
            task_id = await generation_tasks.insert_watched_task(
                conn, uuid.uuid4(), tenant_id, provider, provider_task_id, doing=doing
            )
            row = await generation_tasks.lock_watched_task(
                conn, provider, provider_task_id, doing=doing
            )
            assert row is not None
            if row["tenant_id"] != tenant_id:
                raise PolicyBlockedError(
                    f"tenant_mismatch: task {provider}/{provider_task_id} belongs to another tenant"
                )
            task_id = row["id"]
            if passthrough is not None:
                await generation_tasks.keep_passthrough(conn, task_id, passthrough, doing=doing)
            finished = FINISHED_TASK_STATES.get(row["provider_status"])
            inserted = await generation_tasks.insert_watch(
                conn,
                task_id,
                tenant_id,
                provider,
                provider_task_id,
                finished or "WATCHING",
                pc.watch_max_seconds,
                doing=doing,
            )
            watch = await generation_tasks.watch_status(conn, task_id, doing=doing)
            assert watch is not None
            status, round_ = watch["status"], watch["round"]
            if status == "GAVE_UP" and finished is None:
                # Registered again after the cause was fixed: a new round, a new poll job.
                round_ = await generation_tasks.restart_watch(
                    conn, task_id, pc.watch_max_seconds, doing=doing
                )
                status = "WATCHING"
            if finished is None:
                await generation_tasks.mark_task_watched(conn, task_id, doing=doing)
        job_id = None
        if status == "WATCHING":
            spec = jobs.poll_spec(task_id, tenant_id, round_)
            enqueued = await queue.enqueue_one(conn, spec)
            job_id = enqueued.job_id
            if hurry and not enqueued.created:
                await queue.replay_in(conn, job_id)
    return WatchRegistration(
        generation_task_id=uuid.UUID(str(task_id)),
        provider=provider,
        provider_task_id=provider_task_id,
        status=str(status),
        created=inserted is not None,
        poll_job_id=job_id,
    )


# -- pure rules ------------------------------------------------------------------------------


def next_poll_delay(
    *,
    interval_seconds: float,
    jitter_seconds: float,
    failures: int,
    retry_after_seconds: float | None,
    rng: random.Random,
) -> float:
    """When to ask again. An answer: the cadence ± jitter. ``failures`` in a row: an
    exponential backoff from the cadence, halved-to-whole jitter ("equal jitter", so two
    workers never line up yet the delay never collapses), capped, and never sooner than
    ``Retry-After``."""
    if failures <= 0:
        delay = interval_seconds + rng.uniform(-jitter_seconds, jitter_seconds)
    else:
        backoff = min(MAX_BACKOFF_SECONDS, interval_seconds * 2 ** min(failures - 1, 30))
        delay = rng.uniform(backoff / 2, backoff)
        if retry_after_seconds is not None:
            delay = max(delay, retry_after_seconds)
    return max(MIN_DELAY_SECONDS, delay)


@dataclass
class RateLimiter:
    """Requests per second to each provider from this process (a spacing, not a burst)."""

    clock: Callable[[], float] = time.monotonic
    _next_free: dict[str, float] = field(default_factory=dict)

    def hold(self, provider: str, seconds: float) -> None:
        """No request to ``provider`` for ``seconds`` (it answered 429)."""
        self._next_free[provider] = max(self._next_free.get(provider, 0.0), self.clock() + seconds)

    def acquire(self, provider: str, per_second: float) -> float:
        """0 when a request may go now (and takes the slot); else seconds until one may."""
        now = self.clock()
        free_at = self._next_free.get(provider, 0.0)
        if now < free_at:
            return free_at - now
        self._next_free[provider] = now + 1.0 / per_second
        return 0.0


@dataclass
class PollerState:
    """What the ``provider.poll`` jobs of one worker share: the request spacing per provider
    and the jitter's randomness.

    The poll job owns a watched task's ``task_watches`` row and the task's state while it is
    watched (PROVIDER_RUNNING, PROVIDER_FAILED); a success is recorded by intake, as a
    callback's is. It never submits or cancels a generation, and never downloads an output
    (the fetch job intake enqueues does)."""

    limiter: RateLimiter = field(default_factory=RateLimiter)
    rng: random.Random = field(default_factory=random.Random)


# -- the job -----------------------------------------------------------------------------------


async def handle(ctx: JobContext, job: Job) -> dict[str, Any] | None:
    stage = ctx.services.get("fetch")
    if stage is None:
        raise TransientError("this worker has no provider adapters configured")
    state: PollerState = ctx.services.setdefault("poller", PollerState())
    return await poll_once(stage.services, state, uuid.UUID(str(job.payload["generation_task_id"])))


async def poll_once(services: Any, state: PollerState, task_uuid: uuid.UUID) -> dict[str, Any]:
    """One read of a watched task (``services`` is the fetch stage's FetchServices)."""
    config: Config = services.config
    pool = services.pool
    watch = await generation_tasks.load_watch(pool, task_uuid)
    if watch is None:
        return {"outcome": "not_watched"}
    if watch["status"] != "WATCHING":
        return {"outcome": watch["status"].lower()}
    provider = watch["provider"]
    adapter: ProviderAdapter | None = services.adapters.get(provider)
    if adapter is None or watch["give_up_at"] <= datetime.now(UTC):
        why = "no adapter for the provider" if adapter is None else "watched for too long"
        await end_watch(pool, task_uuid, "GAVE_UP", error=("gave_up", why))
        log.warning(
            "watch_gave_up", provider=provider, task_id=watch["provider_task_id"], reason=why
        )
        return {"outcome": "gave_up"}
    pc = config.providers[provider]
    wait = state.limiter.acquire(provider, pc.poll_requests_per_second)
    if wait > 0:
        raise _defer(f"rate limit for provider {provider}", wait, "rate_limited")
    try:
        task = await adapter.get_task(watch["provider_task_id"])
        check_reported(task.provider_task_id, task.outputs)  # a failed poll, not a crash
        if task.status == "SUCCEEDED" and not task.outputs:
            raise TransientError(f"provider {provider} says SUCCEEDED but lists no output")
    except AivedioError as exc:
        if isinstance(exc, DeferredError):
            raise
        return await _failed_poll(pool, state, adapter, watch, exc)
    if task.status == "SUCCEEDED":
        return await _succeeded(services, watch, task)
    if task.status in ("FAILED", "CANCELLED"):
        async with acquired(pool) as conn, transaction(conn):
            await _move_task(conn, task_uuid, "PROVIDER_FAILED")
            await end_watch(conn, task_uuid, "FAILED", provider_status=task.status)
        log.info(
            "watch_ended", provider=provider, task_id=task.provider_task_id, status=task.status
        )
        return {"outcome": "failed", "provider_status": task.status}
    async with acquired(pool) as conn, transaction(conn):
        await _move_task(conn, task_uuid, "PROVIDER_RUNNING")
        await generation_tasks.record_poll(conn, task_uuid, task.status)
    delay = next_poll_delay(
        interval_seconds=adapter.poll_interval_seconds,
        jitter_seconds=adapter.poll_jitter_seconds,
        failures=0,
        retry_after_seconds=None,
        rng=state.rng,
    )
    raise _defer(f"task {task.status.lower()} at provider {provider}", delay, "polling")


def _defer(detail: str, seconds: float, error_class: str) -> DeferredError:
    error = DeferredError(detail, retry_after_seconds=seconds)
    error.error_class = error_class
    return error


async def _failed_poll(
    pool: Any, state: PollerState, adapter: ProviderAdapter, watch: Any, exc: AivedioError
) -> dict[str, Any]:
    failures = int(watch["consecutive_failures"]) + 1
    task_uuid = watch["generation_task_id"]
    not_found = exc.http_status == 404
    if failures >= MAX_CONSECUTIVE_FAILURES or (not_found and failures >= MAX_NOT_FOUND_READS):
        await end_watch(pool, task_uuid, "GAVE_UP", error=(exc.error_class, exc.detail))
        log.warning(
            "watch_gave_up",
            provider=watch["provider"],
            task_id=watch["provider_task_id"],
            error_class=exc.error_class,
            detail=exc.detail,
            failures=failures,
        )
        return {"outcome": "gave_up"}
    await generation_tasks.record_failed_poll(
        pool, task_uuid, failures, exc.error_class, exc.detail[:2000]
    )
    delay = next_poll_delay(
        interval_seconds=adapter.poll_interval_seconds,
        jitter_seconds=adapter.poll_jitter_seconds,
        failures=failures,
        retry_after_seconds=exc.retry_after_seconds,
        rng=state.rng,
    )
    if isinstance(exc, ThrottledError):
        state.limiter.hold(watch["provider"], delay)
    log.info(
        "watch_poll_failed",
        provider=watch["provider"],
        task_id=watch["provider_task_id"],
        error_class=exc.error_class,
        failures=failures,
        delay_seconds=round(delay, 3),
    )
    raise _defer(f"poll failed: {exc.detail}", delay, f"poll_{exc.error_class}")


async def _succeeded(services: Any, watch: Any, task: ProviderTask) -> dict[str, Any]:
    task_uuid = watch["generation_task_id"]
    async with acquired(services.pool) as conn, transaction(conn):
        recorded = await record_task_outputs(
            conn,
            queue=services.queue,
            cipher=services.cipher,
            config=services.config,
            provider=watch["provider"],
            task=task,
            tenant_id=int(watch["tenant_id"]),
        )
        await end_watch(conn, task_uuid, "SUCCEEDED", provider_status=task.status)
    log.info(
        "watch_succeeded",
        provider=watch["provider"],
        task_id=task.provider_task_id,
        outputs=len(recorded),
    )
    return {"outcome": "succeeded", "outputs": len(recorded)}


async def _move_task(conn: Connection, task_uuid: uuid.UUID, new: str) -> None:
    row = await generation_tasks.lock_task(conn, task_uuid)
    if row is not None and allowed(Entity.GENERATION_TASK, row["provider_status"], new):
        await transition(
            conn,
            Entity.GENERATION_TASK,
            (task_uuid,),
            expected=row["provider_status"],
            new=new,
            version=row["version"],
        )


def register(registry: Registry) -> None:
    registry.bind(jobs.POLL, handle)
