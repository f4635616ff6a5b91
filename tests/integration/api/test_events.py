"""``GET /v1/assets/{id}/events`` over real HTTP on loopback and real PostgreSQL: history then
live changes, Last-Event-ID, the provider output's and task's events, tenant scoping, commit
order, a lost NOTIFY, a dropped LISTEN connection, keepalives and shutdown."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest

from aivedio.api import events
from aivedio.config.load import Config
from aivedio.states import Entity
from aivedio.store.database import Pool
from aivedio.store.records import transition
from tests.support.api_rig import Api, open_api

pytestmark = pytest.mark.anyio


@dataclass
class Sse:
    id: int | None  # a progress event has none
    event: str
    data: dict[str, Any]


@dataclass
class SseReader:
    """The SSE wire format, parsed line by line from the response body."""

    resp: aiohttp.ClientResponse
    comments: list[str] = field(default_factory=list)
    retry: int | None = None

    async def next(self, timeout: float = 5.0) -> Sse | None:
        """The next event, or None at the end of the stream."""
        fields: dict[str, str] = {}
        data: list[str] = []
        with anyio.fail_after(timeout):
            while True:
                raw = await self.resp.content.readline()
                if not raw:
                    return None
                line = raw.decode().rstrip("\n").rstrip("\r")
                if line == "":
                    if data:
                        return Sse(
                            int(fields["id"]) if "id" in fields else None,
                            fields.get("event", "message"),
                            msgspec.json.decode("\n".join(data)),
                        )
                    fields.clear()
                    continue
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name == "retry":
                    self.retry = int(value)
                else:
                    fields[name] = value

    async def take(self, count: int, timeout: float = 5.0) -> list[Sse]:
        got: list[Sse] = []
        for _ in range(count):
            event = await self.next(timeout)
            assert event is not None, f"the stream ended after {got}"
            got.append(event)
        return got

    async def comments_only(self, comment: str, count: int, timeout: float = 5.0) -> None:
        """Read until ``count`` more ``comment`` lines arrive; assert no event comes first."""
        wanted = self.comments.count(comment) + count
        with anyio.fail_after(timeout):
            while self.comments.count(comment) < wanted:
                raw = await self.resp.content.readline()
                assert raw, f"the stream ended after {self.comments}"
                line = raw.decode().rstrip("\n").rstrip("\r")
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                else:
                    assert line == "", f"unexpected {line!r} while waiting for {comment!r}"

    async def quiet(self, seconds: float) -> None:
        """Assert no event arrives for ``seconds``."""
        with anyio.move_on_after(seconds):
            event = await self.next(seconds + 1)
            raise AssertionError(f"unexpected event {event}")


@asynccontextmanager
async def stream(
    api: Api,
    asset_id: uuid.UUID,
    *,
    last_event_id: str | None = None,
    http: aiohttp.ClientSession | None = None,
) -> AsyncIterator[SseReader]:
    headers = api.auth()
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    session = http or api.http
    async with session.get(f"{api.base}/v1/assets/{asset_id}/events", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert resp.headers["X-Accel-Buffering"] == "no"
        yield SseReader(resp)


async def move(
    pool: Pool, entity: Entity, key: uuid.UUID, expected: str, new: str, **values: Any
) -> None:
    async with pool.acquire() as conn:
        await transition(conn, entity, [key], expected=expected, new=new, values=values)


def gauge(api: Api) -> float | None:
    return api.ctx.metrics.registry.get_sample_value("aivedio_api_event_streams")


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await anyio.sleep(0.05)


async def generated_asset(api: Api, *, fetch_retry: bool = True) -> dict[str, uuid.UUID]:
    """A generation task whose output is fetched through the states (with a retry) and then
    stored as a QUARANTINED asset; a second output of the same task is being fetched."""
    rig = api.rig
    task, output, sibling, asset = (uuid.uuid4() for _ in range(4))
    await rig.pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status) VALUES ($1, $2, 'sim', $3, 'SUBMITTED')",
        task,
        rig.tenant_id,
        f"t-{task}",
    )
    await move(rig.pool, Entity.GENERATION_TASK, task, "SUBMITTED", "PROVIDER_RUNNING")
    await move(rig.pool, Entity.GENERATION_TASK, task, "PROVIDER_RUNNING", "PROVIDER_SUCCEEDED")
    for index, oid in enumerate((output, sibling)):
        await rig.pool.execute(
            "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
            " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
            " fetch_status) VALUES ($1, $2, $3, 'sim', $4, $5, '\\x00', 'k1', 'FETCH_PENDING')",
            oid,
            rig.tenant_id,
            task,
            f"t-{task}",
            index,
        )
    await move(rig.pool, Entity.PROVIDER_OUTPUT, output, "FETCH_PENDING", "FETCHING")
    if fetch_retry:
        await move(
            rig.pool,
            Entity.PROVIDER_OUTPUT,
            output,
            "FETCHING",
            "RETRY_WAIT",
            last_error_class="timeout",
        )
        await move(rig.pool, Entity.PROVIDER_OUTPUT, output, "RETRY_WAIT", "FETCHING")
    await move(rig.pool, Entity.PROVIDER_OUTPUT, sibling, "FETCH_PENDING", "FETCHING")
    async with rig.pool.acquire() as conn, conn.transaction():
        await transition(conn, Entity.PROVIDER_OUTPUT, [output], expected="FETCHING", new="STORED")
        await conn.execute(
            "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id, status,"
            " source_object_key) VALUES ($1, $2, 'PROVIDER_OUTPUT', $3, 'QUARANTINED', 'q/x')",
            asset,
            rig.tenant_id,
            output,
        )
    return {"task": task, "output": output, "sibling": sibling, "asset": asset}


async def test_history_then_live_changes(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No timer to fall back on: live events here come from NOTIFY.
    monkeypatch.setattr(events, "REQUERY_SECONDS", 60.0)
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        other = await api.rig.quarantine(b"b" * 64)
        assert gauge(api) == 0
        async with stream(api, asset) as sse:
            (first,) = await sse.take(1)
            assert sse.retry == events.RETRY_MILLISECONDS
            assert first.event == "stage"
            assert first.data["asset_id"] == str(asset)
            assert (first.data["entity"], first.data["state"]) == ("asset", "QUARANTINED")
            assert first.data["phase"] == "stored"
            assert "error_class" not in first.data and "provider_output_id" not in first.data
            assert gauge(api) == 1
            started = time.monotonic()
            await move(pool, Entity.ASSET, other, "QUARANTINED", "PROBING")
            await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
            await move(pool, Entity.ASSET, asset, "PROBING", "PROCESSING")
            live = await sse.take(2, timeout=3)
            assert time.monotonic() - started < 3
            assert [(e.data["state"], e.data["phase"]) for e in live] == [
                ("PROBING", "processing"),
                ("PROCESSING", "processing"),
            ]
            ids = [first.id] + [e.id for e in live]
            assert ids == sorted(set(ids))
            assert [e.data["event_id"] for e in live] == [e.id for e in live]
            # A failure says why.
            await move(
                pool,
                Entity.ASSET,
                asset,
                "PROCESSING",
                "PROCESSING_FAILED",
                last_error_class="resource_limit",
            )
            (failed,) = await sse.take(1, timeout=3)
            assert failed.data["phase"] == "failed"
            assert failed.data["error_class"] == "resource_limit"
            assert failed.id > ids[-1]
        # The client left: the stream ends and is counted out.
        await until(lambda: gauge(api) == 0)
        assert not api.ctx.streams


async def test_last_event_id_resumes_without_duplicates_or_gaps(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "REQUERY_SECONDS", 60.0)
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        steps = [("QUARANTINED", "PROBING"), ("PROBING", "PROCESSING"), ("PROCESSING", "PLAYABLE")]
        for expected, new in steps:
            await move(pool, Entity.ASSET, asset, expected, new)
        async with stream(api, asset) as sse:
            history = await sse.take(4)
            await sse.quiet(0.3)
        states = [e.data["state"] for e in history]
        assert states == ["QUARANTINED", "PROBING", "PROCESSING", "PLAYABLE"]
        async with stream(api, asset, last_event_id=str(history[1].id)) as sse:
            resumed = await sse.take(2)
            assert [e.id for e in resumed] == [e.id for e in history[2:]]
            await sse.quiet(0.3)
            await move(pool, Entity.ASSET, asset, "PLAYABLE", "ENRICHED")
            (live,) = await sse.take(1, timeout=3)
            assert (live.data["state"], live.data["phase"]) == ("ENRICHED", "enriched")
            assert live.id > history[-1].id
        # Up to date: nothing until the next change.
        async with stream(api, asset, last_event_id=f" {live.id} ") as sse:
            await sse.quiet(0.3)
            await move(pool, Entity.ASSET, asset, "ENRICHED", "DELETED")
            (deleted,) = await sse.take(1, timeout=3)
            assert deleted.data["phase"] == "deleted"
        # Not an id we sent: the whole history again (never a server error).
        for garbage in ("abc", "-5", "1e3", "١٢", "9" * 40):
            async with stream(api, asset, last_event_id=garbage) as sse:
                if garbage == "9" * 40:
                    await sse.quiet(0.2)
                else:
                    replay = await sse.take(6)
                    assert [e.data["state"] for e in replay][-1] == "DELETED"


async def test_a_generated_asset_streams_its_task_and_output(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "REQUERY_SECONDS", 60.0)
    async with open_api(config, pool, tmp_path) as api:
        rows = await generated_asset(api)
        async with stream(api, rows["asset"]) as sse:
            history = await sse.take(9)
            await sse.quiet(0.3)
            seen = [(e.data["entity"], e.data["state"], e.data["phase"]) for e in history]
            assert seen == [
                ("generation_task", "SUBMITTED", "generating"),
                ("generation_task", "PROVIDER_RUNNING", "generating"),
                ("generation_task", "PROVIDER_SUCCEEDED", "generated"),
                ("provider_output", "FETCH_PENDING", "receiving"),
                ("provider_output", "FETCHING", "receiving"),
                ("provider_output", "RETRY_WAIT", "receiving"),
                ("provider_output", "FETCHING", "receiving"),
                ("provider_output", "STORED", "stored"),
                ("asset", "QUARANTINED", "stored"),
            ]
            assert [e.id for e in history] == sorted({e.id for e in history})
            for event in history:
                assert event.data["asset_id"] == str(rows["asset"])
                assert event.data["generation_task_id"] == str(rows["task"])
                if event.data["entity"] != "generation_task":
                    assert event.data["provider_output_id"] == str(rows["output"])
            assert history[5].data["error_class"] == "timeout"
            # The stale error class of the retry is not shown with later states.
            assert "error_class" not in history[7].data
            # The sibling output's changes are not this asset's; the task's are.
            await move(
                pool,
                Entity.PROVIDER_OUTPUT,
                rows["sibling"],
                "FETCHING",
                "OUTPUT_LOST",
                last_error_class="gone",
            )
            await move(
                pool, Entity.GENERATION_TASK, rows["task"], "PROVIDER_SUCCEEDED", "CANCELLED"
            )
            (cancelled,) = await sse.take(1, timeout=3)
            assert (cancelled.data["entity"], cancelled.data["phase"]) == (
                "generation_task",
                "cancelled",
            )
            await sse.quiet(0.3)


async def test_other_tenants_and_missing_keys(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        _, theirs = await api.tenant("globex")
        url = f"/v1/assets/{asset}/events"
        started = time.monotonic()
        foreign = await api.json("GET", url, key=theirs, expect=404)
        missing = await api.json("GET", f"/v1/assets/{uuid.uuid4()}/events", expect=404)
        malformed = await api.json("GET", "/v1/assets/not-a-uuid/events", expect=404)
        assert foreign == missing == malformed
        assert foreign["error"]["code"] == "not_found"
        async with api.http.get(api.base + url) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        async with api.http.get(api.base + url, headers={"Last-Event-ID": "x"}) as resp:
            assert resp.status == 401
        assert time.monotonic() - started < 2
        assert gauge(api) == 0


async def test_an_event_never_overtakes_an_earlier_one_still_uncommitted(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's change takes id N and commits late; the asset's, N+1, commits first. A
    reader that sent N+1 at once would never send N: the stream waits for N's commit."""
    monkeypatch.setattr(events, "REQUERY_SECONDS", 60.0)
    async with open_api(config, pool, tmp_path) as api:
        rows = await generated_asset(api, fetch_retry=False)
        async with stream(api, rows["asset"]) as sse:
            history = await sse.take(7)
            async with pool.acquire() as slow:
                tx = slow.transaction()
                await tx.start()
                try:
                    await slow.execute(
                        "UPDATE generation_tasks SET provider_status = 'CANCELLED',"
                        " version = version + 1 WHERE id = $1",
                        rows["task"],
                    )
                    await move(pool, Entity.ASSET, rows["asset"], "QUARANTINED", "PROBING")
                    await sse.quiet(0.8)
                finally:
                    await tx.commit()
            late = await sse.take(2, timeout=3)
        assert [e.data["state"] for e in late] == ["CANCELLED", "PROBING"]
        assert history[-1].id < late[0].id < late[1].id


async def test_an_event_without_a_notification_arrives_on_the_timer(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "REQUERY_SECONDS", 0.3)
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        async with stream(api, asset) as sse:
            (first,) = await sse.take(1)
            # Appended with no NOTIFY at all (as if it was sent while nobody listened).
            await pool.execute(
                "INSERT INTO stage_events (tenant_id, entity, state, asset_id)"
                " VALUES ($1, 'asset', 'PROBING', $2)",
                api.rig.tenant_id,
                asset,
            )
            (late,) = await sse.take(1, timeout=3)
            assert late.data["state"] == "PROBING"
            assert late.id > first.id


async def listener_pids(pool: Pool) -> list[int]:
    rows = await pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'LISTEN %aivedio_stage_events%'"
    )
    return [r["pid"] for r in rows]


async def test_the_listener_reconnects_and_catches_up(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "REQUERY_SECONDS", 60.0)
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        async with stream(api, asset) as sse:
            await sse.take(1)
            (pid,) = await listener_pids(pool)
            assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
            # Committed while nobody may be listening: read when the listener is back.
            await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
            (missed,) = await sse.take(1, timeout=15)
            assert missed.data["state"] == "PROBING"
            new_pids = await listener_pids(pool)
            assert new_pids and pid not in new_pids
            await move(pool, Entity.ASSET, asset, "PROBING", "PROCESSING")
            (live,) = await sse.take(1, timeout=3)
            assert live.data["state"] == "PROCESSING"


async def test_keepalives_while_idle(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path, sse_keepalive_seconds=0.2) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        started = time.monotonic()
        async with stream(api, asset) as sse:
            await sse.take(1)
            # Idle after the history: keepalives, and nothing else, however slow the host.
            await sse.comments_only("keepalive", 2)
            # Not sent back to back: each waited its 0.2 s of silence after the event (sent
            # after ``started``) or the keepalive before it.
            assert time.monotonic() - started >= 2 * 0.2 - 1e-6


async def test_streams_end_when_the_server_shuts_down(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with aiohttp.ClientSession() as client:
        resp: aiohttp.ClientResponse | None = None
        try:
            async with open_api(config, pool, tmp_path) as api:
                asset = await api.rig.quarantine(b"a" * 64)
                resp = await client.get(f"{api.base}/v1/assets/{asset}/events", headers=api.auth())
                assert resp.status == 200
                sse = SseReader(resp)
                await sse.take(1)
                assert gauge(api) == 1
                started = time.monotonic()
            # Leaving open_api stopped the server (run_app's shutdown): the stream ended
            # first, so the server did not wait out its shutdown timeout.
            assert time.monotonic() - started < 3
            assert await sse.next(timeout=2) is None
            assert gauge(api) == 0
        finally:
            if resp is not None:
                resp.release()


async def test_the_render_progress_is_streamed_and_in_the_status_as_one_number(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivedio.store.queue import Queue
    from aivedio.worker.kinds import default_registry

    monkeypatch.setattr(events, "REQUERY_SECONDS", 0.1)
    async with open_api(config, pool, tmp_path) as api:
        asset = await api.rig.quarantine(b"a" * 64)
        await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
        queue = Queue(pool)
        async with pool.acquire() as conn:
            spec = default_registry().spec("probe", f"p-{asset}", payload={"asset_id": str(asset)})
            await queue.enqueue_one(conn, spec)
        (job,) = await queue.claim("media", 1, "w1", 30)
        lease = [(job.id, job.lease_token)]
        status_url = f"{api.base}/v1/videos/{asset}/status"
        async with api.http.get(status_url, headers=api.auth()) as resp:
            assert "progress" not in await resp.json()  # nothing measured yet
        async with stream(api, asset) as sse:
            assert [e.event for e in await sse.take(2)] == ["stage", "stage"]
            await sse.quiet(0.3)  # no progress event before there is a progress
            await queue.heartbeat("w1", 30, lease, [0.425])
            (first,) = await sse.take(1, timeout=3)
            assert (first.event, first.id) == ("progress", None)
            assert first.data == {"asset_id": str(asset), "progress": 42.5}
            await sse.quiet(0.3)  # the same value is not sent again
            await queue.heartbeat("w1", 30, lease, [0.5])
            (second,) = await sse.take(1, timeout=3)
            assert second.data["progress"] == 50.0
            async with api.http.get(status_url, headers=api.auth()) as resp:
                assert (await resp.json())["progress"] == 50.0
