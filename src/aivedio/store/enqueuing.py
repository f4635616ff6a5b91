"""Enqueueing as parts of one statement (``store.together``): the one place of its SQL.

An enqueue is four parts: the idempotency keys claimed in ``job_keys`` (the arbiter across
live and finished jobs: a known key is a no-op), the jobs inserted for the keys won, the
lanes' notification (delivered at commit) and the jobs made, as JSON. ``Queue.enqueue`` sends
them alone; a step that changes state and makes the job that carries on from it sends them
with its own writes (``write_fenced``), one round trip for both. ``when`` makes the enqueue
conditional on earlier parts of the statement (``"EXISTS (SELECT 1 FROM asset)"``: only when
that part wrote a row), since a statement has no transaction to roll back.

The notification payload names the lane and, up to 64 of them, the new jobs' ids
(``'control:17,18'``), so a worker that already claimed them does not ask again
(worker/lanes.py, ``Lane.hear``). Lanes the enqueuing worker has the slots for wake it alone, on
its own channel (``LocalLanes``): the other workers would only claim nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from aivedio.store.job_types import JobSpec
from aivedio.store.together import Part

SHARED_CHANNEL = "aivedio_jobs"

_KEYS = (
    "INSERT INTO job_keys (idempotency_key, job_id)"
    " SELECT t.k, nextval('jobs_id_seq') FROM unnest($1::text[]) AS t(k) WHERE {when}"
    " ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key, job_id"
)
_JOBS = (
    "INSERT INTO jobs (id, kind, lane, idempotency_key, tenant_id, payload, status, priority,"
    " expires_at, estimated_seconds, sort_at, max_attempts, timeout_seconds, run_after,"
    " held_by)"
    " SELECT k.job_id, i.kind, i.lane, i.idempotency_key, i.tenant_id, i.payload,"
    " CASE WHEN i.held > 0 THEN 'waiting' ELSE 'queued' END,"
    " i.priority, i.expires_at, i.estimated_seconds, i.sort_at, i.max_attempts,"
    " i.timeout_seconds, now() + make_interval(secs => i.held), i.held_by"
    " FROM {keys} k JOIN unnest($1::text[], $2::text[], $3::text[], $4::bigint[],"
    " $5::jsonb[], $6::int[], $7::timestamptz[], $8::float8[], $9::timestamptz[], $10::int[],"
    " $11::float8[], $12::float8[], $13::bigint[]) AS i(kind, lane, idempotency_key,"
    " tenant_id, payload, priority, expires_at, estimated_seconds, sort_at, max_attempts,"
    " timeout_seconds, held, held_by)"
    " USING (idempotency_key)"
    " RETURNING id, idempotency_key, lane, status"
)
# A held job wakes nobody: it is due later, its enqueuer does its work meanwhile.
_NOTIFY = (
    "SELECT pg_notify(CASE WHEN i.lane = ANY($1::text[]) THEN $2::text ELSE '"
    + SHARED_CHANNEL
    + "' END, CASE WHEN count(*) <= 64"
    " THEN i.lane || ':' || string_agg(i.id::text, ',' ORDER BY i.id) ELSE i.lane END)"
    " FROM {jobs} i WHERE i.status = 'queued' GROUP BY i.lane"
)
_MADE = (
    "SELECT json_agg(json_build_array(i.idempotency_key, i.id, i.lane))::text AS made FROM {jobs} i"
)


class LocalLanes:
    """What a worker tells its queue so that the jobs it enqueues for itself wake only it.

    ``channel``: the worker's own notification channel (it LISTENs on it beside
    ``SHARED_CHANNEL``). ``reserve``: given the number of jobs an enqueue makes per lane,
    the lanes whose jobs this worker will claim itself (they fit its free slots; it counts
    them as promised until its next claim there), none while it does not listen or drains.
    Those lanes are notified on the private channel: the enqueuing worker claims the jobs,
    and the others, which would hear the shared channel and claim nothing, stay asleep. Any
    other lane (more jobs than free slots, a fan-out such as chunk pieces) is announced to
    the whole fleet as before. ``created``, after the statement, gives back what was
    reserved for jobs it did not create (known keys). A reservation is a promise to claim,
    not to claim that job: when the worker's next claim there comes back full (older jobs
    first), it announces the lane to the fleet (``Queue.notify``). A private wake-up that
    goes astray (the enqueue rolled back, the worker died) costs at most the other workers'
    idle poll (``worker.claim_poll_seconds``), never a job.
    """

    def __init__(
        self,
        channel: str,
        reserve: Callable[[dict[str, int]], list[str]],
        unreserve: Callable[[dict[str, int]], None],
    ) -> None:
        self.channel = channel
        self.reserve = reserve
        self.unreserve = unreserve  # the reserved jobs an enqueue did not create, per lane

    def lanes_for(self, lanes: Sequence[str]) -> list[str]:
        return sorted(self.reserve(dict(Counter(lanes))))

    def created(self, private: Sequence[str], asked: Sequence[str], made: Sequence[str]) -> None:
        """After the statement: give back what was reserved for jobs it did not create."""
        if private:
            wanted, got = Counter(asked), Counter(made)
            unused = {n: wanted[n] - got[n] for n in private if wanted[n] > got[n]}
            if unused:
                self.unreserve(unused)


@dataclass
class Enqueuing:
    """The parts of one enqueue, and what to do with the statement's answer (``made``)."""

    name: str
    parts: dict[str, Part]
    keys: list[str]
    lanes: list[str]
    private: list[str]
    local: LocalLanes | None = field(default=None, repr=False)
    held: set[str] = field(default_factory=set)  # keys inserted held (announced to nobody)

    def made(self, got: dict[str, Any]) -> dict[str, tuple[int, str]]:
        """The jobs this statement created, by key: (id, lane). Known keys are missing (an
        earlier enqueue made their job; ``when`` false made none). Gives back to the local
        lanes what was reserved for jobs it did not create."""
        text = got[f"{self.name}_made"]
        rows = msgspec.json.decode(text) if text else []
        created = {str(key): (int(job_id), str(lane)) for key, job_id, lane in rows}
        if self.local is not None:
            woken = [lane for key, (_, lane) in created.items() if key not in self.held]
            self.local.created(self.private, self.lanes, woken)
        return created


def enqueuing(
    name: str,
    specs: Sequence[JobSpec],
    sort_ats: Sequence[Any],
    *,
    local: LocalLanes | None,
    when: str | None = None,
) -> Enqueuing:
    """The parts that enqueue ``specs`` (distinct keys, one ``sort_at`` each), named
    ``{name}_keys``, ``{name}_jobs``, ``{name}_notify`` and ``{name}_made``. A held spec
    (``held_seconds``) is inserted waiting and announced to nobody."""
    lanes = [s.lane for s in specs]
    woken = [s.lane for s in specs if not s.held_seconds]  # a held job wakes nobody
    private = local.lanes_for(woken) if local is not None else []
    keys = f"{name}_keys"
    jobs = f"{name}_jobs"
    parts = {
        keys: Part(_KEYS.format(when=when or "true"), ([s.idempotency_key for s in specs],)),
        jobs: Part(
            _JOBS.format(keys=keys),
            (
                [s.kind for s in specs],
                lanes,
                [s.idempotency_key for s in specs],
                [s.tenant_id for s in specs],
                [s.payload for s in specs],
                [s.priority for s in specs],
                [s.expires_at for s in specs],
                [s.estimated_seconds for s in specs],
                list(sort_ats),
                [s.max_attempts for s in specs],
                [s.timeout_seconds for s in specs],
                [max(s.held_seconds, 0.0) for s in specs],
                [s.held_by for s in specs],
            ),
        ),
        f"{name}_notify": Part(
            _NOTIFY.format(jobs=jobs), (private, local.channel if local else SHARED_CHANNEL)
        ),
        f"{name}_made": Part(_MADE.format(jobs=jobs), (), value="made"),
    }
    held = {s.idempotency_key for s in specs if s.held_seconds}
    return Enqueuing(
        name, parts, [s.idempotency_key for s in specs], woken, private, local, held=held
    )
