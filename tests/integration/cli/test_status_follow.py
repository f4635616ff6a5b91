"""``aivedio status --follow`` against real PostgreSQL while another task moves the records
through their states: live lines in order and once each, the end at a final state, LISTEN
wake-ups, the timer when no notification comes, every output of a task, an output that
never gets an asset, cancellation, and the command itself (exit 0 when final, 130 on
Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from aivedio.cli import common
from aivedio.cli.status import Target, follow
from aivedio.config.load import Config
from aivedio.states import Entity
from aivedio.store import listening
from aivedio.store.database import Pool
from aivedio.store.records import transition

pytestmark = pytest.mark.anyio


@dataclass
class Task:
    id: uuid.UUID
    provider_task_id: str
    tenant_id: int
    outputs: list[uuid.UUID]


async def move(
    pool: Pool, entity: Entity, key: uuid.UUID, expected: str, new: str, **values: Any
) -> None:
    async with pool.acquire() as conn:
        await transition(conn, entity, [key], expected=expected, new=new, values=values)


async def make_task(pool: Pool, outputs: int = 1) -> Task:
    tenant_id = await pool.fetchval(
        "INSERT INTO tenants (name) VALUES ($1) RETURNING id", f"t-{uuid.uuid4().hex[:8]}"
    )
    task = Task(uuid.uuid4(), f"task-{uuid.uuid4().hex[:8]}", tenant_id, [])
    await pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status) VALUES ($1, $2, 'sim', $3, 'PROVIDER_SUCCEEDED')",
        task.id,
        tenant_id,
        task.provider_task_id,
    )
    for index in range(outputs):
        output = uuid.uuid4()
        await pool.execute(
            "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
            " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
            " source_url_expires_at, fetch_status)"
            " VALUES ($1, $2, $3, 'sim', $4, $5, '\\x00', 'k1', now() + interval '1 hour',"
            " 'FETCH_PENDING')",
            output,
            tenant_id,
            task.id,
            task.provider_task_id,
            index,
        )
        task.outputs.append(output)
    return task


async def fetch_and_store(pool: Pool, task: Task, output: uuid.UUID) -> uuid.UUID:
    """FETCHING, one attempt that stores the bytes, then STORED and the QUARANTINED asset in
    one transaction, as the fetch stage does."""
    await move(pool, Entity.PROVIDER_OUTPUT, output, "FETCH_PENDING", "FETCHING")
    attempt = await pool.fetchval(
        "INSERT INTO fetch_attempts (provider_output_id, job_id, attempt) VALUES ($1, 1, 1)"
        " RETURNING id",
        output,
    )
    await anyio.sleep(0.05)
    asset = uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE fetch_attempts SET finished_at = now(), outcome = 'stored', bytes = 64"
            " WHERE id = $1",
            attempt,
        )
        await transition(conn, Entity.PROVIDER_OUTPUT, [output], expected="FETCHING", new="STORED")
        await conn.execute(
            "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id, status,"
            " source_object_key) VALUES ($1, $2, 'PROVIDER_OUTPUT', $3, 'QUARANTINED', 'q/x')",
            asset,
            task.tenant_id,
            output,
        )
    return asset


async def finished_job(pool: Pool, tenant_id: int, kind: str, asset: uuid.UUID) -> None:
    """A job of the asset that ran and succeeded (not notified: found by a re-read)."""
    job_id = await pool.fetchval("SELECT nextval('jobs_id_seq')")
    await pool.execute(
        "INSERT INTO job_history (id, kind, lane, idempotency_key, tenant_id, payload, status,"
        " priority, attempts, max_attempts, timeout_seconds, lease_token, created_at,"
        " started_at) VALUES ($1, $2, 'media', $3, $4, $5, 'succeeded', 0, 1, 5, 60, 1,"
        " now(), now())",
        job_id,
        kind,
        f"{kind}:{asset}",
        tenant_id,
        {"asset_id": str(asset)},
    )


async def publish(pool: Pool, asset: uuid.UUID) -> None:
    await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
    await move(pool, Entity.ASSET, asset, "PROBING", "PROCESSING")
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status,"
            " published_outputs) VALUES ($1, 1, 1, 'READY', ARRAY['playback'])",
            asset,
        )
        await conn.execute(
            "INSERT INTO releases (asset_id, revision, outputs) VALUES ($1, 1, ARRAY['playback'])",
            asset,
        )
        await transition(
            conn,
            Entity.ASSET,
            [asset],
            expected="PROCESSING",
            new="PLAYABLE",
            values={"current_revision": 1},
        )
    await move(pool, Entity.ASSET, asset, "PLAYABLE", "ENRICHED")


class Lines:
    """What the command wrote, and a way to wait for a line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changed = anyio.Event()

    def write(self, text: str) -> None:
        self.lines.extend(text.splitlines())
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, fragment: str, timeout: float = 5.0) -> None:
        with anyio.fail_after(timeout):
            while not any(fragment in line for line in self.lines):
                await self.changed.wait()

    def index(self, fragment: str, after: int = -1) -> int:
        for i, line in enumerate(self.lines):
            if i > after and fragment in line:
                return i
        raise AssertionError(f"{fragment!r} not after line {after} in {self.lines}")

    def in_order(self, *fragments: str) -> None:
        at = -1
        for fragment in fragments:
            at = self.index(fragment, at)

    def count(self, fragment: str) -> int:
        return sum(fragment in line for line in self.lines)


async def run_follow(
    pool: Pool, config: Config, target: Target, lines: Lines, result: list[int], **kw: Any
) -> None:
    result.append(await follow(pool, target, lines.write, listen=config.database, **kw))


async def test_follows_an_output_into_its_asset_until_enriched(pool: Pool, config: Config) -> None:
    task = await make_task(pool)
    (output,) = task.outputs
    lines, result = Lines(), list[int]()
    async with anyio.create_task_group() as tg:
        # A long timer: state changes must arrive by NOTIFY.
        tg.start_soon(
            lambda: run_follow(
                pool, config, Target("output", str(output)), lines, result, interval_seconds=30.0
            )
        )
        await lines.wait_for("no asset yet")
        assert "FETCH_PENDING" in lines.lines[0] and "URL expires" in lines.lines[0]
        assert lines.count("output             recorded") == 1
        started = time.monotonic()
        asset = await fetch_and_store(pool, task, output)
        await lines.wait_for("asset              → QUARANTINED", timeout=3)
        assert time.monotonic() - started < 3
        await finished_job(pool, task.tenant_id, "probe", asset)
        await publish(pool, asset)
        with anyio.fail_after(5):
            while not result:
                await lines.changed.wait()
    assert result == [0]
    lines.in_order(
        "no asset yet",
        "output             → FETCHING",
        "fetch              stored",
        "output             → STORED",
        "asset              → QUARANTINED",
        "asset              created",
        "asset              → PROBING",
        "asset              → PROCESSING",
        "asset              → PLAYABLE",
        "asset              → ENRICHED",
        f"== asset {asset}: ENRICHED, final",
    )
    # The job that was not notified was found by the re-read that a notification caused.
    assert lines.count("probe              succeeded") == 1
    assert lines.count("publish            released") == 1
    # Nothing twice: the fetch attempt (shown for the output, then in the asset's timeline)
    # and every state change appear once. Whether the attempt is also shown as started
    # depends on whether the re-read that → FETCHING caused ran before it finished: at most
    # once either way.
    assert lines.count("fetch              started") <= 1
    once = (
        "fetch              stored",
        "→ FETCHING",
        "→ STORED",
        "→ PROBING",
        "→ ENRICHED",
        "asset              created",
    )
    for fragment in once:
        assert lines.count(fragment) == 1, fragment
    assert lines.lines[-1] == f"== asset {asset}: ENRICHED, final"


async def test_a_change_made_while_the_listen_opens_is_shown_at_once(
    pool: Pool, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await make_task(pool)
    (output,) = task.outputs
    asset = await fetch_and_store(pool, task, output)
    opening = listening.open_connection

    def open_after_a_change(database: Any) -> Any:
        # The first read is done; the change commits before the LISTEN exists, so its
        # notification reaches nobody.
        cm = opening(database)

        class ChangeFirst:
            async def __aenter__(self) -> Any:
                await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
                return await cm.__aenter__()

            async def __aexit__(self, *exc: Any) -> Any:
                return await cm.__aexit__(*exc)

        return ChangeFirst()

    monkeypatch.setattr(listening, "open_connection", open_after_a_change)
    lines, result = Lines(), list[int]()
    with anyio.move_on_after(10):
        async with anyio.create_task_group() as tg:
            # A long timer: only the read after the LISTEN can show the change in time.
            tg.start_soon(
                lambda: run_follow(
                    pool, config, Target("asset", str(asset)), lines, result, interval_seconds=30.0
                )
            )
            await lines.wait_for("→ PROBING", timeout=3)
            tg.cancel_scope.cancel()
    assert lines.count("asset              → PROBING") == 1


async def test_a_lost_notification_only_delays_a_line(pool: Pool, config: Config) -> None:
    task = await make_task(pool)
    (output,) = task.outputs
    asset = await fetch_and_store(pool, task, output)
    lines, result = Lines(), list[int]()
    async with anyio.create_task_group() as tg:

        async def without_listen() -> None:
            result.append(
                await follow(
                    pool,
                    Target("asset", str(asset)),
                    lines.write,
                    listen=None,
                    interval_seconds=0.2,
                )
            )

        tg.start_soon(without_listen)
        await lines.wait_for(f"asset {asset}: QUARANTINED")
        await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
        await lines.wait_for("→ PROBING", timeout=3)
        await move(
            pool,
            Entity.ASSET,
            asset,
            "PROBING",
            "INVALID_MEDIA",
            last_error_class="invalid_media",
            last_error_detail="unsupported_container:html",
        )
        with anyio.fail_after(5):
            while not result:
                await lines.changed.wait()
    assert result == [0]
    lines.in_order(
        "→ PROBING",
        "→ INVALID_MEDIA  [invalid_media]",
        f"== asset {asset}: INVALID_MEDIA (invalid_media), final",
    )
    # The initial timeline is not repeated.
    assert lines.count("asset              created") == 1
    assert lines.count("fetch              stored") == 1


async def test_follows_every_output_of_a_task(pool: Pool, config: Config) -> None:
    task = await make_task(pool, outputs=2)
    first, second = task.outputs
    lines, result = Lines(), list[int]()
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_follow(
                pool,
                config,
                Target("task", task.provider_task_id),
                lines,
                result,
                interval_seconds=0.5,
            )
        )
        await lines.wait_for(f"provider output {second}")
        asset = await fetch_and_store(pool, task, first)
        await move(pool, Entity.PROVIDER_OUTPUT, second, "FETCH_PENDING", "FETCHING")
        await move(
            pool,
            Entity.PROVIDER_OUTPUT,
            second,
            "FETCHING",
            "OUTPUT_LOST",
            last_error_class="output_lost",
        )
        await lines.wait_for("#1  ", timeout=3)
        assert not result, "one output is still being processed"
        await move(pool, Entity.ASSET, asset, "QUARANTINED", "PROBING")
        await move(pool, Entity.ASSET, asset, "PROBING", "PROCESSING")
        await move(pool, Entity.ASSET, asset, "PROCESSING", "REJECTED", last_error_class="rejected")
        with anyio.fail_after(5):
            while not result:
                await lines.changed.wait()
    assert result == [0]
    assert sum(line.startswith("provider output ") for line in lines.lines) == 2
    lines.in_order("#0  ", "#0", "#0", "→ REJECTED  [rejected]")
    assert any(
        line.startswith("#1") and "→ OUTPUT_LOST  [output_lost]" in line for line in lines.lines
    )
    assert any(
        line.startswith("#0") and "asset              → PROCESSING" in line for line in lines.lines
    )
    assert lines.lines[-2:] == [
        f"== asset {asset}: REJECTED (rejected), final",
        f"== provider output {second}: OUTPUT_LOST (output_lost), final",
    ]
    # The generation task's id works as well as the provider's.
    by_uuid, result2 = Lines(), list[int]()
    await run_follow(pool, config, Target("task", str(task.id)), by_uuid, result2)
    assert result2 == [0] and by_uuid.count(", final") == 2


async def test_unknown_ids_are_not_found(pool: Pool, config: Config) -> None:
    for target in (
        Target("asset", str(uuid.uuid4())),
        Target("output", str(uuid.uuid4())),
        Target("task", "no-such-task"),
    ):
        lines, result = Lines(), list[int]()
        await run_follow(pool, config, target, lines, result)
        assert result == [common.EXIT_NOT_FOUND]
        assert lines.lines == ["aivedio status: nothing found"]


async def test_cancellation_ends_it_and_closes_the_listen_connection(
    pool: Pool, config: Config
) -> None:
    task = await make_task(pool)
    (output,) = task.outputs
    lines, result = Lines(), list[int]()

    async def listening() -> int:
        return int(
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'LISTEN%'"
            )
        )

    with anyio.move_on_after(10) as timeout:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_follow(
                    pool,
                    config,
                    Target("output", str(output)),
                    lines,
                    result,
                    interval_seconds=30.0,
                )
            )
            await lines.wait_for("no asset yet")
            with anyio.fail_after(3):
                while await listening() == 0:
                    await anyio.sleep(0.05)
            cancelled = time.monotonic()
            tg.cancel_scope.cancel()
    assert not timeout.cancelled_caught
    assert time.monotonic() - cancelled < 2
    assert result == []
    with anyio.fail_after(3):
        while await listening():
            await anyio.sleep(0.05)


# -- the command in a process of its own --------------------------------------------------------


def command(config: Config, *argv: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env["AIVEDIO_DATABASE_URL"] = config.database.url
    return subprocess.Popen(
        [sys.executable, "-m", "aivedio", "status", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


async def first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    readline: Callable[[], str] = proc.stdout.readline
    with anyio.fail_after(20):
        return await anyio.to_thread.run_sync(readline)


async def wait(proc: subprocess.Popen[str], timeout: float = 20) -> tuple[int, str, str]:
    out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=timeout))
    return proc.returncode, out, err


async def test_the_command_follows_until_final(pool: Pool, config: Config) -> None:
    task = await make_task(pool)
    (output,) = task.outputs
    # Before any asset exists, the output answers, in text and JSON.
    code, out, _ = await wait(command(config, "--provider-output", str(output), "--json"))
    document = json.loads(out)
    assert code == 0 and document["state"] == "FETCH_PENDING" and document["asset_id"] is None
    assert document["timeline"][0]["event"] == "recorded" and "url" not in document
    proc = command(config, "--provider-output", str(output), "--follow", "--interval", "0.5")
    try:
        assert "FETCH_PENDING, no asset yet" in await first_line(proc)
        asset = await fetch_and_store(pool, task, output)
        await move(pool, Entity.ASSET, asset, "QUARANTINED", "DELETED", last_error_class="deleted")
        code, out, err = await wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    assert out.rstrip().endswith(f"== asset {asset}: DELETED (deleted), final")
    assert "→ STORED" in out and "→ DELETED  [deleted]" in out
    assert "Traceback" not in err


async def test_ctrl_c_ends_the_command_quietly_with_130(pool: Pool, config: Config) -> None:
    task = await make_task(pool)
    proc = command(config, "--task", task.provider_task_id, "-f")
    try:
        assert "no asset yet" in await first_line(proc)
        await anyio.sleep(0.3)  # the command is waiting now
        proc.send_signal(signal.SIGINT)
        code, out, err = await wait(proc, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert ", final" not in out


async def test_follow_shows_the_render_progress_as_it_moves(pool: Pool, config: Config) -> None:
    from aivedio.store.queue import Queue
    from aivedio.worker.kinds import default_registry

    task = await make_task(pool)
    (output,) = task.outputs
    asset = await fetch_and_store(pool, task, output)
    queue = Queue(pool)
    async with pool.acquire() as conn:
        spec = default_registry().spec("probe", f"p-{asset}", payload={"asset_id": str(asset)})
        await queue.enqueue_one(conn, spec)
    (job,) = await queue.claim("media", 1, "w1", 30)
    lease = [(job.id, job.lease_token)]
    await queue.heartbeat("w1", 30, lease, [0.1])
    lines, result = Lines(), list[int]()
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_follow(
                pool, config, Target("asset", str(asset)), lines, result, interval_seconds=0.1
            )
        )
        await lines.wait_for("created")
        assert lines.lines[0].endswith(", progress 10%")  # the first read has it
        await queue.heartbeat("w1", 30, lease, [0.375])
        await lines.wait_for("progress           37.5%")
        await queue.heartbeat("w1", 30, lease, [0.375])
        await queue.heartbeat("w1", 30, lease, [0.9])
        await lines.wait_for("progress           90%")
        await publish(pool, asset)
        with anyio.fail_after(5):
            while not result:
                await lines.changed.wait()
    assert result == [0]
    # Each value once, in order, the end at 100 % before the final line.
    lines.in_order("37.5%", "90%", "progress           100%", f"== asset {asset}: ENRICHED")
    assert lines.count("37.5%") == 1 and lines.count("progress           100%") == 1
