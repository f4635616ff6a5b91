"""The job queue: rows in PostgreSQL instead of a message broker.

Why rows: the state change that makes work necessary and the job that does it commit in one
transaction (``enqueue`` takes the caller's connection), so there is no outbox-to-broker hop
to lose. The costs of a table as a queue are paid down the way the queues before us learned:

* claims and acknowledgements are batched (one statement each per round, with a per-row CAS
  on lease owner and fencing token, so batching never weakens exactly-once commit);
* every hot statement is an index range scan over a precomputed ``sort_at`` in a partial
  index of queued rows: nothing sorts all ready rows;
* the hot table holds only live jobs: finishing moves a row to ``job_history`` in the same
  statement, so dead tuples stay few and autovacuum (tuned in the schema) keeps up;
* one heartbeat statement per worker extends all of its leases.

Leases carry a fencing token incremented at every claim. A worker whose lease expired and
was re-claimed cannot complete, retry, bury or release the job: its token no longer matches.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio

from aivedio.errors import DatabaseError, LeaseLostError
from aivedio.scheduling import sort_at
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.enqueuing import SHARED_CHANNEL, Enqueuing, enqueuing
from aivedio.store.enqueuing import LocalLanes as LocalLanes
from aivedio.store.job_types import Enqueued as Enqueued
from aivedio.store.job_types import Job as Job
from aivedio.store.job_types import JobSpec as JobSpec
from aivedio.store.queries import query
from aivedio.store.together import Part, write_together

NOTIFY_CHANNEL = SHARED_CHANNEL


LEASE_NOT_HELD = "AVL01"  # raised by aivedio_hold_lease (migration 0014)


@asynccontextmanager
async def fenced(conn: Connection, job: Job | None) -> AsyncIterator[None]:
    """A transaction that holds ``job``'s lease until it ends: raises LeaseLostError unless
    this run still holds it (the job's row stays share-locked, so the lease cannot move
    before the caller commits). BEGIN and the check go as one simple query, one round trip;
    the ids are integers of our own Job, formatted as such. ``job`` None: a plain
    transaction (work done outside a job, by an operator's command say)."""
    if job is None:
        async with conn.transaction():
            yield
        return
    if conn.is_in_transaction():  # its COMMIT would commit the caller's transaction
        raise RuntimeError("fenced() needs a connection outside any transaction")
    try:
        with map_db_errors("opening a fenced transaction"):
            await conn.execute(
                f"BEGIN; SELECT aivedio_hold_lease({int(job.id)}, {int(job.lease_token)})"
            )
    except BaseException as exc:
        await _rollback(conn)
        if not isinstance(exc, DatabaseError):
            raise
        if _lease_lost(exc):
            raise _lease_error(job) from None
        raise
    try:
        yield
    except BaseException:
        await _rollback(conn)
        raise
    with anyio.CancelScope(shield=True), map_db_errors("committing"):
        await conn.execute("COMMIT")


async def write_fenced(
    conn: Connection, job: Job | None, parts: Mapping[str, Part], doing: str
) -> dict[str, Any]:
    """Writes that happen only while this run holds ``job``'s lease, as ONE statement (atomic
    on its own, no BEGIN or COMMIT): the lease check is one of its parts, and a lease no
    longer held undoes the rest (LeaseLostError). The answers of ``write_together``."""
    if job is not None:
        lease = Part("SELECT aivedio_hold_lease($1, $2)", (int(job.id), int(job.lease_token)))
        parts = {"lease": lease, **parts}
    try:
        return await write_together(conn, parts, doing)
    except DatabaseError as exc:
        if job is not None and _lease_lost(exc):
            raise _lease_error(job) from None
        raise


def lease_left_part(job: Job) -> Part:
    """For ``write_fenced``: the seconds left of ``job``'s lease by the database's clock
    (``value`` ``seconds_left``). Until then no other delivery can have the job: the reaper gives it
    back only once ``lease_until`` has passed."""
    return Part(
        "SELECT extract(epoch FROM lease_until - now())::float8 AS seconds_left FROM jobs"
        " WHERE id = $1 AND lease_token = $2 AND status = 'running'",
        (int(job.id), int(job.lease_token)),
        value="seconds_left",
    )


def _lease_lost(exc: DatabaseError) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == LEASE_NOT_HELD


def _lease_error(job: Job) -> LeaseLostError:
    return LeaseLostError(f"job {job.id}: lease {job.lease_token} is no longer held")


async def _rollback(conn: Connection) -> None:
    """Best effort: a connection that cannot roll back is closed by the pool on release
    (asyncpg rolls back an open transaction there too)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        if not conn.is_closed():
            await conn.execute("ROLLBACK")


class Queue:
    """Verbs over the ``jobs`` tables. Stateless; safe to share across tasks."""

    def __init__(
        self,
        pool: Pool,
        *,
        default_start_within_seconds: float = 3600.0,
        local: LocalLanes | None = None,
    ) -> None:
        self._pool = pool
        self._default_start_within = default_start_within_seconds
        self.local = local  # set by the worker that owns this queue object

    # -- producing -------------------------------------------------------------------------

    def enqueuing(
        self,
        specs: Sequence[JobSpec],
        *,
        name: str = "enqueue",
        when: str | None = None,
        now: datetime | None = None,
    ) -> Enqueuing | None:
        """The parts that enqueue ``specs`` (a known idempotency key once), to be written
        with others in one statement (``store.enqueuing``); None when there are none."""
        unique: dict[str, JobSpec] = {}
        for spec in specs:
            unique.setdefault(spec.idempotency_key, spec)
        if not unique:
            return None
        now = now or datetime.now(UTC)
        items = list(unique.values())
        sort_ats = [
            sort_at(
                now=now,
                expires_at=s.expires_at,
                estimated_seconds=s.estimated_seconds,
                default_start_within_seconds=self._default_start_within,
                start_later_seconds=s.start_later_seconds,
            )
            for s in items
        ]
        return enqueuing(name, items, sort_ats, local=self.local, when=when)

    async def enqueue(
        self, conn: Connection, specs: Sequence[JobSpec], *, now: datetime | None = None
    ) -> list[Enqueued]:
        """Enqueue inside the caller's transaction. A known idempotency key is a no-op that
        returns the existing job id. Returns one result per distinct key, in input order."""
        pending = self.enqueuing(specs, now=now)
        if pending is None:
            return []
        got = await write_together(conn, pending.parts, "enqueueing jobs")
        created = pending.made(got)
        return await self._results(conn, pending, created)

    async def _results(
        self, conn: Connection, pending: Enqueuing, created: Mapping[str, tuple[int, str]]
    ) -> list[Enqueued]:
        """One result per key of ``pending``: the job it created, or the one a known key
        names (read by a fresh statement: the key may have committed after the snapshot)."""
        missing = [k for k in pending.keys if k not in created]
        existing: dict[str, int] = {}
        if missing:
            with map_db_errors("enqueueing jobs"):
                found = await conn.fetch(query("existing_keys"), missing)
            existing = {r["idempotency_key"]: r["job_id"] for r in found}
        return [
            Enqueued(k, created[k][0], True) if k in created else Enqueued(k, existing[k], False)
            for k in pending.keys
        ]

    async def enqueue_one(self, conn: Connection, spec: JobSpec) -> Enqueued:
        (result,) = await self.enqueue(conn, [spec])
        return result

    # -- consuming ---------------------------------------------------------------------------

    async def claim(
        self,
        lane: str,
        limit: int,
        owner: str,
        lease_seconds: float,
        max_tenants: int = 64,
        start_tenant: int = 0,
    ) -> list[Job]:
        """Claim up to ``limit`` jobs; tenants are walked from ``start_tenant`` up, wrapping."""
        jobs, _ = await self.claim_and_complete(
            lane, limit, owner, lease_seconds, max_tenants, start_tenant
        )
        return jobs

    async def claim_and_complete(
        self,
        lane: str,
        limit: int,
        owner: str,
        lease_seconds: float,
        max_tenants: int = 64,
        start_tenant: int = 0,
        done: Sequence[tuple[int, int, Any]] = (),
    ) -> tuple[list[Job], set[int]]:
        """``claim``, acknowledging ``done`` (as ``complete``) in the same statement: the
        claimed jobs and the ids accepted."""
        with map_db_errors("claiming jobs"):
            rows = await self._pool.fetch(
                query("claim"),
                [d[0] for d in done],
                [d[1] for d in done],
                owner,
                [d[2] for d in done],
                lane,
                limit,
                lease_seconds,
                max_tenants,
                start_tenant,
            )
        accepted = set(rows[0]["acked"] or ()) if rows else set()
        jobs = [Job(**{k: v for k, v in r.items() if k != "acked"}) for r in rows if r["id"]]
        return jobs, accepted

    async def complete(self, owner: str, done: Sequence[tuple[int, int, Any]]) -> set[int]:
        """Acknowledge (id, lease_token, result) triples in one statement. Returns the ids
        accepted; an id missing from the answer had lost its lease (fencing)."""
        if not done:
            return set()
        with map_db_errors("completing jobs"):
            rows = await self._pool.fetch(
                query("complete"),
                [d[0] for d in done],
                [d[1] for d in done],
                owner,
                [d[2] for d in done],
            )
        return {r["id"] for r in rows}

    async def retry_later(
        self,
        job: Job,
        owner: str,
        *,
        delay_seconds: float,
        penalty_seconds: float,
        error_class: str,
        detail: str,
        refund_attempt: bool = False,
    ) -> bool:
        with map_db_errors("scheduling a retry"):
            row = await self._pool.fetchval(
                query("retry_later"),
                job.id,
                job.lease_token,
                owner,
                delay_seconds,
                penalty_seconds,
                error_class,
                detail[:2000],
                refund_attempt,
            )
        return row is not None

    async def bury(self, job: Job, owner: str, *, error_class: str, detail: str) -> bool:
        with map_db_errors("moving a job to the dead state"):
            row = await self._pool.fetchval(
                query("bury"), job.id, job.lease_token, owner, error_class, detail[:2000]
            )
        return row is not None

    async def release(self, owner: str, leases: Sequence[tuple[int, int]]) -> list[int]:
        if not leases:
            return []
        with map_db_errors("releasing leases"):
            rows = await self._pool.fetch(
                query("release"), [x[0] for x in leases], [x[1] for x in leases], owner
            )
        return [r["id"] for r in rows]

    async def heartbeat(
        self,
        owner: str,
        lease_seconds: float,
        leases: Sequence[tuple[int, int]],
        progress: Sequence[float | None] | None = None,
    ) -> dict[int, int]:
        """Extend the named (id, lease_token) leases; return those still owned, id → token.
        ``progress``: each lease's job's progress in [0, 1] (None: unmeasured, kept as is)."""
        if not leases:
            return {}
        with map_db_errors("extending leases"):
            rows = await self._pool.fetch(
                query("heartbeat"),
                owner,
                lease_seconds,
                [x[0] for x in leases],
                [x[1] for x in leases],
                list(progress) if progress is not None else [None] * len(leases),
            )
        return {r["id"]: r["lease_token"] for r in rows}

    async def notify(self, lanes: Sequence[str]) -> None:
        """Wake these lanes across the fleet (the shared channel)."""
        with map_db_errors("waking lanes"):
            await self._pool.execute(query("notify"), sorted(set(lanes)))

    # -- maintenance -----------------------------------------------------------------------

    async def reap(self) -> list[tuple[int, str, str, str]]:
        """Expired leases back to the queue (or dead). Returns (id, lane, kind, outcome)."""
        with map_db_errors("reaping expired leases"):
            rows = await self._pool.fetch(query("reap"))
            lanes = sorted({r["lane"] for r in rows if r["outcome"] == "queued"})
            if lanes:
                await self.notify(lanes)
        return [(r["id"], r["lane"], r["kind"], r["outcome"]) for r in rows]

    async def hold(
        self, keys: Sequence[str], seconds: float, conn: Connection | None = None
    ) -> list[str]:
        """Hold back the jobs of these keys that are not running yet (their work is being done
        by the caller); each comes back by itself after ``seconds``. Returns the keys held.
        With ``conn``, inside the caller's transaction."""
        if not keys:
            return []
        with map_db_errors("holding jobs back"):
            rows = await (conn or self._pool).fetch(query("hold"), list(keys), seconds)
        return [r["idempotency_key"] for r in rows]

    def finish_held_parts(self, key: str, result: Any) -> dict[str, Part]:
        """The parts that finish the held job of ``key`` as succeeded with ``result``
        (``held_done``: 1 when it was still held), to be written with the work it stood
        for (``write_fenced``), so the job and its work end together."""
        return {
            "held_done": Part(query("finish_held"), (key,)),
            "held_history": Part(query("finish_held_history"), (result,)),
        }

    async def wake_held(self, keys: Sequence[str]) -> int:
        """Make held jobs claimable now (a job whose work is done then finds it done)."""
        if not keys:
            return 0
        with map_db_errors("waking held jobs"):
            rows = await self._pool.fetch(query("wake_held"), list(keys))
        return len(rows)

    async def promote(self, limit: int = 1000) -> tuple[int, float | None]:
        """Due waits become claimable: how many, and the seconds until the next one is due
        (None when nothing waits)."""
        with map_db_errors("promoting due retries"):
            rows = await self._pool.fetch(query("promote"), limit)
        (next_due,) = [r["next_due"] for r in rows if r["lane"] is None]
        promoted = len(rows) - 1
        if promoted >= limit:
            next_due = 0.0  # more were due than one statement takes
        return promoted, None if next_due is None else max(next_due, 0.0)

    async def replay(self, job_id: int) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            return await self.replay_in(conn, job_id)

    async def replay_in(self, conn: Connection, job_id: int) -> bool:
        """Replay inside the caller's transaction: a dead or cancelled job comes back with a
        fresh budget, a waiting one becomes due now; False when the job is neither."""
        with map_db_errors("replaying a job"):
            rows = await conn.fetch(query("replay"), job_id)
            if rows:
                await conn.execute(query("notify"), sorted({r["lane"] for r in rows}))
        return bool(rows)

    async def get(self, job_id: int) -> dict[str, Any] | None:
        with map_db_errors("reading a job"):
            row = await self._pool.fetchrow(query("get_job"), job_id)
        return dict(row.items()) if row else None

    async def list(
        self, *, status: str | None = None, kind: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        with map_db_errors("listing jobs"):
            rows = await self._pool.fetch(query("list_jobs"), status, kind, limit)
        return [dict(r.items()) for r in rows]

    async def stats(self) -> dict[str, tuple[int, float]]:
        """Queued depth and the age in seconds of the oldest ready job, by kind."""
        with map_db_errors("reading queue statistics"):
            rows = await self._pool.fetch(query("queue_stats"))
        return {r["kind"]: (r["depth"], float(r["oldest_seconds"] or 0.0)) for r in rows}
