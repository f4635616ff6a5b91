"""Backlog pressure: one reading, shared by every stage of a process, that tells the fleet to
degrade before it falls over (shed optional work and new uploads, and put fetches whose URLs
are about to expire first) instead of losing paid-for outputs.

The reading is one statement (``sql/queries.sql: backlog_pressure``), each half an index
range scan: the age of the oldest queued job in the media lane (how long new media work
waits for a slot), and how many provider outputs not yet stored have a URL expiring within
``near_expiry_window_seconds`` (work that is lost, and must be generated again and paid for
again, if the fetch lane does not get to it in time). A signal turns on at its threshold
and off below ``clear_ratio`` of it, so a fleet that has just caught up does not flap.

What pressure does, and where:

* **optional outputs are deferred** (``media_stage``): a render makes the required set only
  and the revision is published PLAYABLE; the optional outputs stay PENDING with
  ``asset_variants.deferred_at`` set, one render job for them waits (``run_after``, the
  attempt refunded, ``last_error_class = 'backlog_deferred'``) and renders them together once
  the pressure is gone (or after ``defer_max_seconds`` regardless), and the enrichment path
  publishes them (ENRICHED). A waiting job is a live job, so the sweeper's stuck scans leave
  them alone;
* **new uploads are refused** (``api/videos``): ``POST /v1/videos`` answers 503 with
  ``Retry-After``; provider callbacks are never refused (their URLs expire), and sessions
  already open may still upload and complete;
* **the fetch lane comes first** (``worker``): while outputs near expiry wait, a worker that
  has a fetch lane lets its media lane fill at most ``media_slots_under_expiry_pressure``
  slots (running renders finish; no new ones start beyond that) and its fetch lane fill
  ``fetch_extra_slots_under_expiry_pressure`` more: the CPU, network and object-store
  bandwidth the two lanes share on that machine go to the fetches. Inside the fetch lane the
  claim order already puts the least expiry slack first (``scheduling.sort_at``).

The worker refreshes the reading every ``check_interval_seconds`` in one task; the API reads
it lazily, at most once per interval, however many requests ask.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus

from aivedio.config.backlog import BacklogConfig
from aivedio.errors import DatabaseError
from aivedio.logs import get_logger
from aivedio.metrics import BacklogMetrics
from aivedio.store.database import Pool, map_db_errors
from aivedio.store.queries import query
from aivedio.supervision import Loop

log = get_logger("aivedio.backlog")

MEDIA_OLDEST = "media_oldest_job"
NEAR_EXPIRY = "outputs_near_expiry"
SIGNALS = (MEDIA_OLDEST, NEAR_EXPIRY)
# A deferred optional output's render job is the error class the timeline shows while waiting.
DEFERRED_CLASS = "backlog_deferred"


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of the signals and which of them are on."""

    media_oldest_seconds: float = 0.0
    near_expiry: int = 0
    active: frozenset[str] = frozenset()
    at: float = 0.0  # monotonic time of the read; 0 for "never read"

    @property
    def pressure(self) -> bool:
        return bool(self.active)

    def describe(self) -> str:
        parts = []
        if MEDIA_OLDEST in self.active:
            parts.append(f"the oldest media job has waited {self.media_oldest_seconds:.0f} s")
        if NEAR_EXPIRY in self.active:
            parts.append(f"{self.near_expiry} provider outputs are near URL expiry")
        return "; ".join(parts) or "no pressure"


def active_signals(
    cfg: BacklogConfig, previous: frozenset[str], media_oldest_seconds: float, near_expiry: int
) -> frozenset[str]:
    """The signals on after this reading: on at the threshold, off below ``clear_ratio`` of
    it, unchanged in between. A threshold of 0 turns its signal off."""
    values = {
        MEDIA_OLDEST: (media_oldest_seconds, cfg.media_oldest_job_seconds),
        NEAR_EXPIRY: (float(near_expiry), float(cfg.near_expiry_outputs)),
    }
    active = set()
    for name, (value, threshold) in values.items():
        if threshold <= 0:
            continue
        if value >= threshold or (name in previous and value >= threshold * cfg.clear_ratio):
            active.add(name)
    return frozenset(active)


async def read_signals(pool: Pool, window_seconds: float) -> tuple[float, int]:
    """(age in seconds of the oldest queued media job, outputs near URL expiry)."""
    with map_db_errors("reading the backlog pressure"):
        row = await pool.fetchrow(query("backlog_pressure"), window_seconds)
    assert row is not None
    return max(float(row["media_oldest_seconds"] or 0.0), 0.0), int(row["near_expiry"])


class BacklogMonitor:
    """The process's view of the pressure: a cached reading, refreshed at most once per
    ``check_interval_seconds`` (single flight), mirrored into the metrics."""

    def __init__(
        self,
        cfg: BacklogConfig,
        pool: Pool,
        metrics: BacklogMetrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.metrics = metrics
        self.clock = clock
        self.reading = Reading()
        self._lock = anyio.Lock()

    @property
    def pressure(self) -> bool:
        return self.reading.pressure

    @property
    def defer_optional(self) -> bool:
        return self.cfg.defer_optional_outputs and self.reading.pressure

    @property
    def refuse_uploads(self) -> bool:
        return self.cfg.refuse_uploads and self.reading.pressure

    @property
    def fetch_first(self) -> bool:
        """Outputs near expiry wait: media work yields to fetches where they compete."""
        return self.cfg.prioritize_fetch and NEAR_EXPIRY in self.reading.active

    async def refresh(self) -> Reading:
        """Read the signals now. Raises DatabaseError."""
        oldest, near = await read_signals(self.pool, self.cfg.near_expiry_window_seconds)
        previous = self.reading
        active = active_signals(self.cfg, previous.active, oldest, near)
        self.reading = Reading(oldest, near, active, self.clock())
        if active != previous.active:
            event = "backlog_pressure_on" if active else "backlog_pressure_off"
            log.warning(
                event,
                signals=sorted(active),
                media_oldest_seconds=round(oldest, 1),
                outputs_near_expiry=near,
            )
        self._export()
        return self.reading

    async def current(self) -> Reading:
        """The cached reading, refreshed first when older than the check interval. A failed
        read keeps the last reading (logged): the database being down is its own alarm."""
        if self._fresh():
            return self.reading
        async with self._lock:
            if self._fresh():
                return self.reading
            try:
                return await self.refresh()
            except DatabaseError as exc:
                log.warning("backlog_check_failed", error=str(exc))
                return self.reading

    def _fresh(self) -> bool:
        return self.reading.at > 0 and (
            self.clock() - self.reading.at < self.cfg.check_interval_seconds
        )

    def _export(self) -> None:
        if self.metrics is None:
            return
        reading = self.reading
        for name in SIGNALS:
            self.metrics.pressure.labels(name).set(1 if name in reading.active else 0)
        self.metrics.pressure.labels("any").set(1 if reading.pressure else 0)
        self.metrics.media_oldest.set(reading.media_oldest_seconds)
        self.metrics.near_expiry.set(reading.near_expiry)
        self.metrics.checked.set(time.time())

    async def run(
        self,
        on_reading: Callable[[Reading], None] | None = None,
        loop: Loop | None = None,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Refresh every check interval for ever; ``on_reading`` sees each reading. Started
        (``task_status``) once the first reading was applied, so a worker's lanes never claim
        on a stale view of the pressure. Supervised (``loop``): a failed read or an
        ``on_reading`` that raises keeps the last reading, is logged and reported, and the
        next interval tries again; nothing but cancellation ends it."""
        supervisor = loop or Loop("backlog", event="backlog_check_failed")
        started = False
        while True:
            try:
                async with self._lock:
                    reading = await self.refresh()
                if on_reading is not None:
                    on_reading(reading)
                supervisor.ok()
            except Exception as exc:  # any: the last reading stands until one succeeds
                supervisor.failed(exc)
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(self.cfg.check_interval_seconds)
