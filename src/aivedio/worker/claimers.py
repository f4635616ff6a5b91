"""One claimer per lane: claim at most the lane's free slots, hand the jobs to the worker,
sleep until there may be more.

A lane's claimer claims at most its free slots (never more: a claimed job holds a lease, and
a lease held by a job that is not running is a delay for nobody's benefit), has the worker
start one task per job, and sleeps until a NOTIFY for its lane (on the shared channel, or on
this worker's own for the jobs its stages made for it: ``LocalLanes``), a freed slot, or its
poll (see docs/architecture.md, "Wake-ups", for when it asks the database and when it does
not). Pending acknowledgements ride on the claim (``leases.Acknowledgements``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from aivedio.config.load import Config
from aivedio.config.worker import claim_poll_seconds
from aivedio.logs import get_logger
from aivedio.store.queue import Job, Queue
from aivedio.supervision import Loop, error_class
from aivedio.worker.lanes import Lane
from aivedio.worker.leases import Acknowledgements, hand_back

# The worker's events keep the logger name they have always had, whichever module says them.
log = get_logger("aivedio.worker.daemon")

# Starts the claimed jobs of a lane, one task each in the task group given.
StartJobs = Callable[[Lane, list[Job], anyio.abc.TaskGroup], None]


class Claimer:
    """The claim loop of one lane. It owns the lane's wake-up bookkeeping between claims
    (``Lane.maybe_more``, ``poll_at``, ``pledged``, ``tenant_cursor``); it never runs a job
    (``start`` does) and never records an outcome."""

    def __init__(
        self,
        lane: Lane,
        loop: Loop,
        *,
        queue: Queue,
        owner: str,
        config: Config,
        acks: Acknowledgements,
        draining: Callable[[], bool],
        start: StartJobs,
    ) -> None:
        self.lane = lane
        self.loop = loop  # its supervised loop ("claim:<lane>")
        self.queue = queue
        self.owner = owner
        self.config = config
        self.acks = acks
        self.draining = draining
        self.start = start

    async def run(self, jobs_tg: anyio.abc.TaskGroup) -> None:
        lane = self.lane
        wc = self.config.worker
        supervisor = self.loop
        while not self.draining():
            free = lane.limit - lane.busy
            if free <= 0:
                if lane.pledged:
                    # Full, with jobs announced to this worker alone since its last claim
                    # (reserved while a claim was in flight): let the fleet take them.
                    lane.pledged = 0
                    await self.announce()
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
            acks: list[tuple[Job, Any]] = self.acks.take_riders()
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
                    self.acks.acked(acks, accepted)
                    # Next round starts past the last tenant served (wrapping), so a lane
                    # with more tenants than one round walks leaves none of them out.
                    lane.tenant_cursor = max((j.tenant_id for j in jobs), default=-1) + 1
                except Exception as exc:  # any: the claimer must outlive what it meets
                    retry_in = supervisor.failed(exc)
                    self.acks.riders_failed(acks)
                finally:
                    left_over = lane.claimed({j.id for j in jobs or ()})
                    self.acks.landed(acks)
                if self.draining() and jobs:
                    await hand_back(self.queue, self.owner, jobs)
                    return
            if jobs is None:
                await anyio.sleep(retry_in)
                continue
            self.start(lane, jobs, jobs_tg)
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
                await self.announce()

    async def announce(self) -> None:
        try:
            await self.queue.notify([self.lane.name])
        except Exception as exc:  # the other workers' polls are the fallback
            log.warning(
                "announce_failed", lane=self.lane.name, error_class=error_class(exc), error=str(exc)
            )
