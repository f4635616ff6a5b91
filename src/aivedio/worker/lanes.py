"""A lane of the worker: its slots, how many it may fill now, and when its claimer wakes.

A lane's claimer (``claimers.py``) sleeps until a NOTIFY for its lane, a freed slot, or its
poll. ``Lane`` keeps what decides whether waking is a reason to ask the database: a freed
slot alone is not; news (an enqueue's notification naming jobs this lane did not already
claim, or ids heard while a claim was in flight that it did not return) is.

Backlog pressure (``pipeline/upkeep/backlog.py``). While outputs near URL expiry wait, a
worker that has a fetch lane lets its media lane fill at most
``media_slots_under_expiry_pressure`` slots and its fetch lane
``fetch_extra_slots_under_expiry_pressure`` more (``limits_under_pressure``): a lane's
claimer claims up to its current limit, and running jobs are never interrupted by a lower one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from aivedio.config.backlog import BacklogConfig

RECENT_CLAIMS_KEPT = 1024  # per lane: far more than a notification can lag behind its claim


def parse_notification(payload: object) -> tuple[str, list[int] | None] | None:
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
class Lane:
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

    def nothing_waiting(self) -> bool:
        """Whether this worker believes the queue holds no job for this lane: its last claim
        came back short and no enqueue was heard since (not a read of the database)."""
        return not self.maybe_more and not self.pledged and not self.heard_in_claim

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


def limits_under_pressure(
    lanes: dict[str, Lane], cfg: BacklogConfig, *, fetch_first: bool
) -> dict[str, int]:
    """Lane limits for a backlog reading: while outputs near expiry wait (``fetch_first``),
    the media lane yields to the fetch lane (only where both run, i.e. compete for this
    machine)."""
    fetch, media = lanes.get("fetch"), lanes.get("media")
    fetch_first = fetch_first and fetch is not None
    limits: dict[str, int] = {}
    if media is not None:
        limits["media"] = (
            min(media.slots, cfg.media_slots_under_expiry_pressure) if fetch_first else media.slots
        )
    if fetch is not None:
        extra = cfg.fetch_extra_slots_under_expiry_pressure if fetch_first else 0
        limits["fetch"] = fetch.slots + extra
    return limits
