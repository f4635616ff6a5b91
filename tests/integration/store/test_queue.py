"""The job queue against real PostgreSQL: idempotency, order, fairness, fencing, retries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aivedio.errors import LeaseLostError
from aivedio.scheduling import Candidate, reference_claim
from aivedio.store.database import Pool
from aivedio.store.queue import JobSpec, LocalLanes, Queue, fenced, write_fenced
from aivedio.store.together import Part

pytestmark = pytest.mark.anyio

OWNER = "test-owner"


def spec(key: str, **kw: object) -> JobSpec:
    fields: dict[str, object] = {"kind": "diag.noop", "lane": "control", "idempotency_key": key}
    fields.update(kw)
    return JobSpec(**fields)  # type: ignore[arg-type]


async def enqueue(pool: Pool, specs: list[JobSpec]) -> list[int]:
    queue = Queue(pool)
    async with pool.acquire() as conn, conn.transaction():
        return [r.job_id for r in await queue.enqueue(conn, specs)]


async def test_duplicate_enqueue_returns_the_existing_job(pool: Pool) -> None:
    queue = Queue(pool)
    async with pool.acquire() as conn:
        first = await queue.enqueue_one(conn, spec("fetch:out-1:v1"))
        again = await queue.enqueue_one(conn, spec("fetch:out-1:v1", priority=9))
    assert first.created and not again.created
    assert again.job_id == first.job_id
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 1


async def test_duplicate_enqueue_after_completion_is_still_a_noop(pool: Pool) -> None:
    queue = Queue(pool)
    (job_id,) = await enqueue(pool, [spec("k")])
    (job,) = await queue.claim("control", 10, OWNER, 30)
    assert await queue.complete(OWNER, [(job.id, job.lease_token, None)]) == {job_id}
    async with pool.acquire() as conn:
        again = await queue.enqueue_one(conn, spec("k"))
    assert not again.created and again.job_id == job_id
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert await pool.fetchval("SELECT status FROM job_history WHERE id = $1", job_id) == (
        "succeeded"
    )


async def test_enqueue_rolls_back_with_the_callers_transaction(pool: Pool) -> None:
    queue = Queue(pool)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await queue.enqueue_one(conn, spec("rolled-back"))
        await tx.rollback()
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert await pool.fetchval("SELECT count(*) FROM job_keys") == 0


async def test_enqueue_wakes_each_new_jobs_lane_once_at_commit_and_a_duplicate_none(
    pool: Pool,
) -> None:
    heard: list[str] = []

    def on_notify(*args: object) -> None:
        heard.append(str(args[3]))

    async with pool.acquire() as listener:
        await listener.add_listener("aivedio_jobs", on_notify)
        queue = Queue(pool)
        async with pool.acquire() as conn, conn.transaction():
            a, b, c = await queue.enqueue(conn, [spec("a"), spec("b"), spec("c", lane="media")])
            await anyio.sleep(0.2)
            assert heard == []  # nothing before the commit
        with anyio.fail_after(5):
            while len(heard) < 2:
                await anyio.sleep(0.02)
        async with pool.acquire() as conn:
            assert not (await queue.enqueue_one(conn, spec("a"))).created
        await anyio.sleep(0.3)
        await listener.remove_listener("aivedio_jobs", on_notify)
    # Each lane once, naming its new jobs (a worker that claimed them already ignores it).
    assert sorted(heard) == [
        f"control:{min(a.job_id, b.job_id)},{max(a.job_id, b.job_id)}",
        f"media:{c.job_id}",
    ]


async def test_a_large_enqueue_names_its_lane_only(pool: Pool) -> None:
    heard: list[str] = []

    def on_notify(*args: object) -> None:
        heard.append(str(args[3]))

    async with pool.acquire() as listener:
        await listener.add_listener("aivedio_jobs", on_notify)
        async with pool.acquire() as conn:
            await Queue(pool).enqueue(conn, [spec(f"k{i}") for i in range(65)])
        with anyio.fail_after(5):
            while not heard:
                await anyio.sleep(0.02)
        await listener.remove_listener("aivedio_jobs", on_notify)
    assert heard == ["control"]  # 65 ids would not fit a notification's payload for long


async def test_held_jobs_wait_until_woken_or_their_time_passes(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("a"), spec("b"), spec("c"), spec("d")])
    (first,) = await queue.claim("control", 1, OWNER, 30)
    assert first.idempotency_key == "a"
    # A running job is not held; a key without a job is ignored.
    assert sorted(await queue.hold(["a", "b", "d", "nothing"], 3600)) == ["b", "d"]
    claimed = await queue.claim("control", 10, OWNER, 30)
    assert [j.idempotency_key for j in claimed] == ["c"]
    assert await queue.wake_held(["b", "c"]) == 1  # c is running: not woken
    (woken,) = await queue.claim("control", 10, OWNER, 30)
    assert woken.idempotency_key == "b"
    assert woken.attempts == 1  # holding spent no attempt
    # Held for a moment only: back by itself once the time passes (the holder died).
    assert await queue.hold(["d"], 0.0) == ["d"]
    assert (await queue.promote())[0] == 1
    (back,) = await queue.claim("control", 10, OWNER, 30)
    assert back.idempotency_key == "d"


async def test_a_job_enqueued_held_waits_for_its_holder_and_is_finished_by_it(
    pool: Pool,
) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("holder")])
    (holder,) = await queue.claim("control", 1, OWNER, 30)
    await enqueue(pool, [spec("held", held_seconds=3600, held_by=holder.id), spec("other")])
    # Held: not claimable, announced to nobody; the other one is.
    assert [j.idempotency_key for j in await queue.claim("control", 10, OWNER, 30)] == ["other"]
    row = await pool.fetchrow("SELECT status, held_by FROM jobs WHERE idempotency_key = 'held'")
    assert row["status"] == "waiting" and row["held_by"] == holder.id
    # Its holder finishes it with its work, in one fenced statement.
    parts = {"work": Part("SELECT 1", ()), **queue.finish_held_parts("held", {"done": 1})}
    async with pool.acquire() as conn:
        got = await write_fenced(conn, holder, parts, "finishing")
    assert got["held_done"] == 1 and got["held_history"] == 1
    done = await pool.fetchrow(
        "SELECT status, result FROM job_history WHERE idempotency_key = 'held'"
    )
    assert done["status"] == "succeeded" and done["result"] == {"done": 1}
    # Finishing again finds nothing held: a no-op.
    async with pool.acquire() as conn:
        again = await write_fenced(conn, holder, queue.finish_held_parts("held", None), "again")
    assert again["held_done"] == 0


async def test_a_held_job_is_due_once_its_holder_dies_or_is_given_back(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("dies"), spec("drained")])
    dies, drained = await queue.claim("control", 2, OWNER, 30)
    await enqueue(
        pool,
        [
            spec("held-1", held_seconds=3600, held_by=dies.id),
            spec("held-2", held_seconds=3600, held_by=drained.id),
        ],
    )
    # The holder's lease expires (its worker died): the reaper makes its held job due now.
    await pool.execute(
        "UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1", dies.id
    )
    assert [r[0] for r in await queue.reap()] == [dies.id]
    claimed = await queue.claim("control", 10, OWNER, 30)
    assert sorted(j.idempotency_key for j in claimed) == ["dies", "held-1"]
    # A holder given back on drain: its held job is due now too.
    await queue.release(OWNER, [(drained.id, drained.lease_token)])
    claimed = await queue.claim("control", 10, OWNER, 30)
    assert sorted(j.idempotency_key for j in claimed) == ["drained", "held-2"]
    # A held job that was claimed is its claimer's: its holder can no longer finish it.
    async with pool.acquire() as conn:
        got = await write_fenced(conn, None, queue.finish_held_parts("held-2", None), "late")
    assert got["held_done"] == 0


async def test_jobs_made_claimable_again_wake_their_lane(pool: Pool) -> None:
    """A promoted retry, a woken held job and a released lease each wake the lane's
    listeners, from the statement that moved them."""
    heard: list[str] = []

    def on_notify(*args: object) -> None:
        heard.append(str(args[3]))

    queue = Queue(pool)
    await enqueue(pool, [spec("p"), spec("w", lane="media"), spec("r", lane="fetch")])
    (leased,) = await queue.claim("fetch", 1, OWNER, 30)
    async with pool.acquire() as listener:
        await listener.add_listener("aivedio_jobs", on_notify)
        assert await queue.hold(["p"], 0.0) == ["p"]
        assert await queue.hold(["w"], 3600) == ["w"]
        assert (await queue.promote())[0] == 1
        assert await queue.wake_held(["w"]) == 1
        assert await queue.release(OWNER, [(leased.id, leased.lease_token)]) == [leased.id]
        assert (await queue.promote())[0] == 0  # nothing moved: nobody woken
        with anyio.fail_after(5):
            while len(heard) < 3:
                await anyio.sleep(0.02)
        await anyio.sleep(0.2)
        await listener.remove_listener("aivedio_jobs", on_notify)
    assert heard == ["control", "media", "fetch"]


async def test_claim_orders_by_expiry_slack_then_priority_then_age(pool: Pool) -> None:
    now = datetime.now(UTC)
    ids = await enqueue(
        pool,
        [
            spec("no-deadline"),  # sorts at now + 1 h
            spec("expires-late", expires_at=now + timedelta(hours=2)),
            spec("expires-soon", expires_at=now + timedelta(minutes=10)),
            # Expires later but needs long to fetch: smaller slack than "expires-soon".
            spec("slow", expires_at=now + timedelta(minutes=20), estimated_seconds=900),
        ],
    )
    claimed = await Queue(pool).claim("control", 10, OWNER, 30)
    order = [j.idempotency_key for j in claimed]
    assert sorted(order) == sorted(["no-deadline", "expires-late", "expires-soon", "slow"])
    # RETURNING order is not the claim order; claim one at a time to observe the order.
    await pool.execute("UPDATE jobs SET status = 'queued', lease_owner = NULL")
    seen = []
    for _ in ids:
        (job,) = await Queue(pool).claim("control", 1, OWNER, 30)
        seen.append(job.idempotency_key)
    assert seen == ["slow", "expires-soon", "no-deadline", "expires-late"]


async def test_priority_breaks_ties_and_age_breaks_priority_ties(pool: Pool) -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    await enqueue(
        pool,
        [
            spec("low", expires_at=when, priority=1),
            spec("high", expires_at=when, priority=5),
            spec("high-younger", expires_at=when, priority=5),
        ],
    )
    seen = []
    for _ in range(3):
        (job,) = await Queue(pool).claim("control", 1, OWNER, 30)
        seen.append(job.idempotency_key)
    assert seen == ["high", "high-younger", "low"]


async def test_a_busy_tenant_delays_another_by_at_most_one_round(pool: Pool) -> None:
    now = datetime.now(UTC)
    # Tenant 1 floods the lane with 10,000 urgent jobs; tenant 2 has one far-off job.
    flood = [
        spec(f"a-{i}", tenant_id=1, expires_at=now + timedelta(minutes=5)) for i in range(10_000)
    ]
    for start in range(0, len(flood), 2000):
        await enqueue(pool, flood[start : start + 2000])
    await enqueue(pool, [spec("b-0", tenant_id=2, expires_at=now + timedelta(days=30))])
    first_round = await Queue(pool).claim("control", 16, OWNER, 30)
    assert len(first_round) == 16
    assert "b-0" in {j.idempotency_key for j in first_round}


async def test_tenants_past_one_rounds_walk_are_reached_by_the_rotating_cursor(
    pool: Pool,
) -> None:
    # 10 tenants, 3 walked per round: the cursor past the last tenant served reaches all.
    await enqueue(pool, [spec(f"t{t}-{i}", tenant_id=t) for t in range(10) for i in range(3)])
    queue = Queue(pool)
    served: list[int] = []
    cursor = 0
    for _ in range(4):
        jobs = await queue.claim("control", 3, OWNER, 30, max_tenants=3, start_tenant=cursor)
        served += [j.tenant_id for j in jobs]
        cursor = max((j.tenant_id for j in jobs), default=-1) + 1
    assert set(served) == set(range(10))


async def test_claim_skips_rows_locked_by_a_concurrent_claimer(pool: Pool) -> None:
    await enqueue(pool, [spec(f"j{i}") for i in range(10)])
    async with pool.acquire() as conn, conn.transaction():
        await conn.fetch("SELECT id FROM jobs ORDER BY id LIMIT 4 FOR UPDATE")
        claimed = await Queue(pool).claim("control", 10, OWNER, 30)
    assert len(claimed) == 6


candidates = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 50), st.integers(0, 3)),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=candidates,
    batch=st.integers(1, 12),
    start=st.integers(0, 5),
    max_tenants=st.integers(1, 5),
)
async def test_sql_claim_matches_the_reference_order(
    pool: Pool, rows: list[tuple[int, int, int]], batch: int, start: int, max_tenants: int
) -> None:
    await pool.execute("TRUNCATE jobs, job_keys, job_history")
    base = datetime(2030, 1, 1, tzinfo=UTC)
    specs = [
        spec(
            f"h{i}",
            tenant_id=tenant,
            expires_at=base + timedelta(minutes=minutes),
            priority=priority,
        )
        for i, (tenant, minutes, priority) in enumerate(rows)
    ]
    ids = await enqueue(pool, specs)
    expected = reference_claim(
        [
            Candidate(job_id, s.tenant_id, s.expires_at or base, s.priority)
            for job_id, s in zip(ids, specs, strict=True)
        ],
        batch,
        max_tenants=max_tenants,
        start_tenant=start,
    )
    claimed = await Queue(pool).claim("control", batch, OWNER, 30, max_tenants, start)
    assert sorted(j.id for j in claimed) == sorted(expected)


async def test_completion_with_a_stale_fencing_token_is_refused(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("fenced")])
    (first,) = await queue.claim("control", 1, "worker-a", 30)
    # Worker A stalls; its lease expires and the reaper hands the job to worker B.
    await pool.execute("UPDATE jobs SET lease_until = now() - interval '1 second'")
    assert [r[3] for r in await queue.reap()] == ["queued"]
    (second,) = await queue.claim("control", 1, "worker-b", 30)
    assert second.id == first.id and second.lease_token == first.lease_token + 1
    assert await queue.complete("worker-a", [(first.id, first.lease_token, None)]) == set()
    # Even the right owner name with the old token is refused.
    assert await queue.complete("worker-b", [(first.id, first.lease_token, None)]) == set()
    assert not await queue.retry_later(
        first, "worker-a", delay_seconds=0, penalty_seconds=0, error_class="x", detail="y"
    )
    assert not await queue.bury(first, "worker-a", error_class="x", detail="y")
    assert await queue.release("worker-a", [(first.id, first.lease_token)]) == []
    assert await queue.complete("worker-b", [(second.id, second.lease_token, {"ok": 1})]) == {
        first.id
    }


async def test_batched_completion_accepts_valid_rows_and_refuses_stale_ones(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec(f"b{i}") for i in range(5)])
    jobs = await queue.claim("control", 5, OWNER, 30)
    done = [(j.id, j.lease_token, None) for j in jobs]
    stale = (jobs[0].id, jobs[0].lease_token + 7, None)
    accepted = await queue.complete(OWNER, [stale, *done[1:]])
    assert accepted == {j.id for j in jobs[1:]}
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1", jobs[0].id) == "running"


async def test_a_claim_carries_acknowledgements_with_the_same_fencing(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("c1"), spec("c2"), spec("m1", lane="media")])
    first, second = await queue.claim("control", 2, OWNER, 30)
    stale = (second.id, second.lease_token + 1, None)
    # One statement: the control jobs acknowledged (the stale token refused), a media job
    # claimed.
    jobs, accepted = await queue.claim_and_complete(
        "media", 4, OWNER, 30, done=[(first.id, first.lease_token, {"n": 1}), stale]
    )
    assert [j.idempotency_key for j in jobs] == ["m1"] and accepted == {first.id}
    history = await pool.fetchrow("SELECT status, result FROM job_history WHERE id = $1", first.id)
    assert history["status"] == "succeeded" and history["result"] == {"n": 1}
    assert await pool.fetchval("SELECT status FROM jobs WHERE id = $1", second.id) == "running"
    # A claim that finds nothing still reports what it acknowledged.
    jobs, accepted = await queue.claim_and_complete(
        "media", 4, OWNER, 30, done=[(second.id, second.lease_token, None)]
    )
    assert jobs == [] and accepted == {second.id}
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE lane = 'control'") == 0


async def test_retry_waits_then_becomes_claimable_with_its_sort_key_penalised(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("r")])
    (job,) = await queue.claim("control", 1, OWNER, 30)
    before = await pool.fetchval("SELECT sort_at FROM jobs WHERE id = $1", job.id)
    assert await queue.retry_later(
        job, OWNER, delay_seconds=0.3, penalty_seconds=60, error_class="throttled", detail="429"
    )
    row = await pool.fetchrow("SELECT status, sort_at, last_error_class FROM jobs")
    assert row["status"] == "waiting" and row["last_error_class"] == "throttled"
    assert row["sort_at"] - before == timedelta(seconds=60)
    assert await queue.claim("control", 1, OWNER, 30) == []
    promoted, next_due = await queue.promote()
    assert promoted == 0 and next_due is not None and 0 < next_due <= 0.3  # not due yet
    await pool.execute("UPDATE jobs SET run_after = now() - interval '1 ms'")
    assert await queue.promote() == (1, None)  # nothing waits any more
    (again,) = await queue.claim("control", 1, OWNER, 30)
    assert again.id == job.id and again.attempts == 2


async def test_release_returns_the_job_without_spending_an_attempt(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("drained")])
    (job,) = await queue.claim("control", 1, OWNER, 30)
    assert job.attempts == 1
    assert await queue.release(OWNER, [(job.id, job.lease_token)]) == [job.id]
    row = await pool.fetchrow("SELECT status, attempts, lease_owner FROM jobs")
    assert (row["status"], row["attempts"], row["lease_owner"]) == ("queued", 0, None)


async def test_expired_lease_on_the_last_attempt_goes_dead(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("poison", max_attempts=1)])
    await queue.claim("control", 1, OWNER, 30)
    await pool.execute("UPDATE jobs SET lease_until = now() - interval '1 second'")
    assert [r[3] for r in await queue.reap()] == ["dead"]
    dead = await queue.list(status="dead")
    assert [d["last_error_class"] for d in dead] == ["lease_expired"]


async def test_heartbeat_extends_only_this_owners_leases(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("mine"), spec("theirs")])
    (mine,) = await queue.claim("control", 1, "me", 1)
    (theirs,) = await queue.claim("control", 1, "them", 1)
    named = [(mine.id, mine.lease_token), (theirs.id, theirs.lease_token)]
    owned = await queue.heartbeat("me", 120, named)
    assert owned == {mine.id: mine.lease_token}
    rows = dict(
        await pool.fetch("SELECT id, lease_until - now() > interval '60 seconds' FROM jobs")
    )
    assert rows == {mine.id: True, theirs.id: False}


async def test_heartbeat_leaves_unnamed_leases_to_expire(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("run"), spec("forgotten")])
    jobs = await queue.claim("control", 2, "me", 1)
    running = next(j for j in jobs if j.idempotency_key == "run")
    assert await queue.heartbeat("me", 120, [(running.id, running.lease_token)]) == {
        running.id: running.lease_token
    }
    await anyio.sleep(1.2)
    reaped = await queue.reap()
    assert [(r[0], r[3]) for r in reaped] == [
        (next(j.id for j in jobs if j.idempotency_key == "forgotten"), "queued")
    ]


async def test_dead_job_replays_with_a_fresh_budget(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("doomed")])
    (job,) = await queue.claim("control", 1, OWNER, 30)
    assert await queue.bury(job, OWNER, error_class="invalid_media", detail="no video stream")
    assert [d["id"] for d in await queue.list(status="dead")] == [job.id]
    assert await queue.replay(job.id)
    assert not await queue.replay(job.id)  # already live again
    (again,) = await queue.claim("control", 1, OWNER, 30)
    assert again.id == job.id and again.attempts == 1
    assert await queue.list(status="dead") == []


async def test_queue_stats_report_depth_and_oldest_age(pool: Pool) -> None:
    await enqueue(pool, [spec("s1"), spec("s2"), spec("s3", kind="diag.sleep")])
    await pool.execute(
        "UPDATE jobs SET run_after = now() - interval '90 seconds' WHERE idempotency_key = 's1'"
    )
    stats = await Queue(pool).stats()
    assert stats["diag.noop"][0] == 2 and stats["diag.noop"][1] >= 90
    assert stats["diag.sleep"][0] == 1


async def test_lanes_the_enqueuing_worker_will_claim_are_announced_to_it_alone(
    pool: Pool,
) -> None:
    """LocalLanes: jobs that fit the enqueuing worker's free slots wake it on its own channel;
    a lane with more jobs than it has free slots is announced to the whole fleet."""
    heard: dict[str, list[str]] = {"aivedio_jobs": [], "aivedio_jobs_me": []}

    def on_notify(_conn: object, _pid: int, channel: str, lane: object) -> None:
        heard[channel].append(str(lane))

    asked: list[dict[str, int]] = []
    unreserved: list[dict[str, int]] = []

    def reserve(wanted: dict[str, int]) -> list[str]:
        asked.append(dict(wanted))
        free = {"control": 2, "media": 1}
        return [lane for lane, n in wanted.items() if n <= free.get(lane, 0)]

    async with pool.acquire() as listener:
        for channel in heard:
            await listener.add_listener(channel, on_notify)
        queue = Queue(pool, local=LocalLanes("aivedio_jobs_me", reserve, unreserved.append))
        async with pool.acquire() as conn, conn.transaction():
            await queue.enqueue(
                conn,
                [spec("a"), spec("b"), spec("c", lane="media"), spec("d", lane="media")],
            )
        with anyio.fail_after(5):
            while sum(len(v) for v in heard.values()) < 2:
                await anyio.sleep(0.02)
        await anyio.sleep(0.2)
        for channel in heard:
            await listener.remove_listener(channel, on_notify)
    assert asked == [{"control": 2, "media": 2}]
    assert unreserved == []  # both control jobs were created
    lanes = {channel: [p.partition(":")[0] for p in said] for channel, said in heard.items()}
    assert lanes == {"aivedio_jobs_me": ["control"], "aivedio_jobs": ["media"]}


async def test_slots_reserved_for_jobs_an_enqueue_did_not_create_are_given_back(
    pool: Pool,
) -> None:
    unreserved: list[dict[str, int]] = []
    queue = Queue(
        pool,
        local=LocalLanes("aivedio_jobs_me", lambda wanted: sorted(wanted), unreserved.append),
    )
    async with pool.acquire() as conn:
        await queue.enqueue(conn, [spec("known")])
        unreserved.clear()
        await queue.enqueue(conn, [spec("known"), spec("new"), spec("m", lane="media")])
    assert unreserved == [{"control": 1}]  # "known" existed; "new" and "m" were created


async def test_a_fenced_transaction_commits_only_while_the_lease_is_held(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("f1"), spec("f2")])
    held, lost = await queue.claim("control", 2, OWNER, 30)
    await pool.execute("CREATE TABLE notes (note text)")
    async with pool.acquire() as conn:
        async with fenced(conn, held):
            await conn.execute("INSERT INTO notes VALUES ('held')")
        await pool.execute("UPDATE jobs SET lease_token = lease_token + 1 WHERE id = $1", lost.id)
        with pytest.raises(LeaseLostError, match=f"job {lost.id}"):
            async with fenced(conn, lost):
                await conn.execute("INSERT INTO notes VALUES ('lost')")

        async def fail_midway() -> None:
            async with fenced(conn, held):
                await conn.execute("INSERT INTO notes VALUES ('failed')")
                raise RuntimeError("the caller fails mid-transaction")

        with pytest.raises(RuntimeError):
            await fail_midway()
        assert not conn.is_in_transaction()
        async with fenced(conn, None):  # no job: a plain transaction
            await conn.execute("INSERT INTO notes VALUES ('no job')")
    assert sorted(await pool.fetchval("SELECT array_agg(note) FROM notes")) == ["held", "no job"]


async def test_a_fenced_write_happens_only_while_the_lease_is_held(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("w1"), spec("w2")])
    held, lost = await queue.claim("control", 2, OWNER, 30)
    await pool.execute("CREATE TABLE notes (note text)")

    def note(text: str) -> dict[str, Part]:
        # The second part reads the first's answer: it writes only when the first did.
        return {
            "first": Part("INSERT INTO notes VALUES ($1) RETURNING note", (text,), value="note"),
            "second": Part("INSERT INTO notes SELECT note || '+' FROM first RETURNING 1", ()),
        }

    async with pool.acquire() as conn:
        got = await write_fenced(conn, held, note("held"), "writing notes")
        assert got == {"lease": 1, "first": "held", "second": 1}
        await pool.execute("UPDATE jobs SET lease_token = lease_token + 1 WHERE id = $1", lost.id)
        with pytest.raises(LeaseLostError, match=f"job {lost.id}"):
            await write_fenced(conn, lost, note("lost"), "writing notes")
        assert not conn.is_in_transaction()
        assert await write_fenced(conn, None, note("no job"), "writing notes") == {
            "first": "no job",
            "second": 1,
        }
    notes = sorted(await pool.fetchval("SELECT array_agg(note) FROM notes"))
    assert notes == ["held", "held+", "no job", "no job+"]


async def test_promote_tells_when_the_next_wait_is_due(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("w1"), spec("w2"), spec("w3")])
    await pool.execute("UPDATE jobs SET status = 'waiting', run_after = now() - interval '1 s'")
    await pool.execute(
        "UPDATE jobs SET run_after = now() + interval '30 s' WHERE idempotency_key = 'w3'"
    )
    assert await queue.promote(limit=1) == (1, 0.0)  # one more was due: promote again now
    promoted, next_due = await queue.promote(limit=10)
    assert promoted == 1 and next_due is not None and 25 < next_due <= 30


async def test_the_heartbeat_stores_progress_and_the_next_claim_clears_it(pool: Pool) -> None:
    queue = Queue(pool)
    await enqueue(pool, [spec("render")])
    (job,) = await queue.claim("control", 1, "me", 1)
    lease = [(job.id, job.lease_token)]
    assert await queue.heartbeat("me", 120, lease, [0.25]) == {job.id: job.lease_token}
    assert await pool.fetchval("SELECT progress FROM jobs WHERE id = $1", job.id) == 0.25
    # Unmeasured this beat: the last value stays.
    await queue.heartbeat("me", 120, lease, [None])
    assert await pool.fetchval("SELECT progress FROM jobs WHERE id = $1", job.id) == 0.25
    # Another owner's beat writes nothing.
    await queue.heartbeat("them", 120, lease, [0.9])
    assert await pool.fetchval("SELECT progress FROM jobs WHERE id = $1", job.id) == 0.25
    # A new attempt starts unmeasured.
    await pool.execute(
        "UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1", job.id
    )
    await queue.reap()
    (again,) = await queue.claim("control", 1, "me", 1)
    assert again.id == job.id
    assert await pool.fetchval("SELECT progress FROM jobs WHERE id = $1", job.id) is None
