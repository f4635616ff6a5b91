"""One bad row never stops a scan (issue 22, item 1), against real PostgreSQL and stores.

The finding: a callback's ``expires_at`` stored as ``-infinity`` crashed every sweep in the
near-expiry scan (a naive ``datetime.min`` compared with an aware ``now``), so the sweeper
job died, ``aivedio sweep --dry-run`` exited 1, and nothing else was swept either. Here
every scan gets rows it must handle and, beside them, a poison row: a real one where a
value can poison it (``-infinity``, a payload nesting too deep to decode, a file list of
the wrong shape), and otherwise a failure injected into the row's own work. The other rows
are still handled, the poison row is logged, counted in
``aivedio_scan_row_errors_total{scan}`` and listed as skipped, and the pass is complete.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from structlog.testing import capture_logs

from aivedio.cli.sweep import add_parsers
from aivedio.config.load import Config
from aivedio.metrics import WorkerMetrics
from aivedio.pipeline.upkeep import backlog, outbox_relay
from aivedio.pipeline.upkeep.sweep_report import SweepReport
from aivedio.pipeline.upkeep.sweeper import open_sweeper
from aivedio.store import uploads
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.outbox import emit
from aivedio.store.queue import JobSpec, Queue
from aivedio.store.uploads import create_session, source_key
from tests.integration.pipeline.upkeep.test_outbox_relay import (
    emit_one,
    open_receiver,
    outbox_config,
)
from tests.integration.pipeline.upkeep.test_sweeper import (
    CFG,
    OLD,
    add_asset,
    add_output,
    add_revision,
    add_variant,
    age,
    root_of,
)
from tests.support.fault_rig import until
from tests.support.pipeline_rig import Rig, make_rig

pytestmark = pytest.mark.anyio

SCANS = (
    "fetching_stale",
    "near_expiry",
    "tasks_without_output",
    "orphaned_watches",
    "stale_uploads",
    "expired_uploads",
    "stuck_assets",
    "integrity",
    "orphan_objects",
    "quarantine_orphans",
)


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


def row_errors(metrics: WorkerMetrics, scan: str) -> float:
    value = metrics.registry.get_sample_value("aivedio_scan_row_errors_total", {"scan": scan})
    return value or 0.0


# -- a history with two rows under every scan ---------------------------------------------------


async def task_without_output(rig: Rig) -> str:
    task = uuid.uuid4()
    await rig.pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status, updated_at) VALUES ($1, $2, 'sim', $3, 'PROVIDER_SUCCEEDED',"
        " now() - interval '1 hour')",
        task,
        rig.tenant_id,
        str(task),
    )
    return str(task)


async def orphaned_watch(rig: Rig) -> str:
    task = uuid.uuid4()
    await rig.pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status, watch) VALUES ($1, $2, 'sim', $3, 'PROVIDER_RUNNING', true)",
        task,
        rig.tenant_id,
        str(task),
    )
    await rig.pool.execute(
        "INSERT INTO task_watches (generation_task_id, tenant_id, provider, provider_task_id,"
        " round, give_up_at, updated_at) VALUES ($1, $2, 'sim', $3, 1, now() + interval '1 day',"
        " now() - interval '1 hour')",
        task,
        rig.tenant_id,
        str(task),
    )
    return str(task)


async def stale_upload(rig: Rig) -> tuple[str, Any]:
    upload = await rig.store.start_upload(f"quarantine/x/{uuid.uuid4()}/source.bin")
    await upload.write(b"half")
    (pending,) = [p for p in await rig.store.list_multipart_uploads() if p.key == upload.key]
    age(root_of(rig.config), f".tmp/{pending.upload_id}.upload", OLD)
    return upload.key, upload


async def expired_session(rig: Rig) -> str:
    video = uuid.uuid4()
    await create_session(
        rig.pool,
        video_id=video,
        tenant_id=rig.tenant_id,
        method="API_PUT",
        content_type="video/mp4",
        filename=None,
        size_bytes=4,
        sha256="0" * 64,
        expires_at=datetime.now(UTC) - timedelta(minutes=1),
        object_key=source_key(rig.tenant_id, video),
    )
    return str(video)


async def published_with_a_missing_file(rig: Rig, files: Any = None) -> str:
    """A PLAYABLE asset whose published playback file is not in the store."""
    asset_id = await add_asset(rig.pool, rig.tenant_id, "PLAYABLE", source="quarantine/none")
    await add_revision(rig.pool, asset_id, 1, "READY")
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    await add_variant(rig.pool, asset_id, 1, "playback", f"{prefix}/playback.mp4", "SUCCEEDED", [])
    await rig.pool.execute(
        "UPDATE asset_revisions SET published_outputs = ARRAY['playback'] WHERE asset_id = $1",
        asset_id,
    )
    await rig.pool.execute("UPDATE assets SET current_revision = 1 WHERE id = $1", asset_id)
    if files is not None:
        await rig.pool.execute(
            "UPDATE asset_variants SET extra = $2 WHERE asset_id = $1", asset_id, files
        )
    return str(asset_id)


async def leftover_of_a_failed_revision(rig: Rig, asset_id: uuid.UUID, name: str) -> str:
    key = f"{keys.revision_prefix(rig.tenant_id, asset_id, 1)}/{name}"
    await rig.store.put_bytes(key, b"x")
    age(root_of(rig.config), key, OLD)
    return key


async def quarantine_orphan(rig: Rig) -> str:
    key = f"quarantine/{keys.tenant_hash(rig.tenant_id)}/{uuid.uuid4()}/source.bin"
    await rig.store.put_bytes(key, b"x")
    age(root_of(rig.config), key, OLD)
    return key


async def two_rows_under_every_scan(rig: Rig) -> tuple[dict[str, list[str]], list[Any]]:
    """Per scan, the subjects (as the report names them) of two rows it must report; and the
    uploads to abort at the end."""
    pool, tenant = rig.pool, rig.tenant_id
    rows: dict[str, list[str]] = {scan: [] for scan in SCANS}
    open_uploads = []
    failed = await add_asset(pool, tenant, "PROCESSING_FAILED")
    await add_revision(pool, failed, 1, "FAILED")
    for n in range(2):
        rows["fetching_stale"].append(
            str(await add_output(pool, tenant, "FETCHING", expires_in=7200))
        )
        rows["near_expiry"].append(
            str(await add_output(pool, tenant, "FETCH_PENDING", expires_in=300))
        )
        rows["tasks_without_output"].append(await task_without_output(rig))
        rows["orphaned_watches"].append(await orphaned_watch(rig))
        key, upload = await stale_upload(rig)
        rows["stale_uploads"].append(key)
        open_uploads.append(upload)
        rows["expired_uploads"].append(await expired_session(rig))
        rows["stuck_assets"].append(
            str(await add_asset(pool, tenant, "QUARANTINED", updated_ago=OLD))
        )
        rows["integrity"].append(await published_with_a_missing_file(rig))
        rows["orphan_objects"].append(
            await leftover_of_a_failed_revision(rig, failed, f"seg_{n}.m4s")
        )
        rows["quarantine_orphans"].append(await quarantine_orphan(rig))
    return rows, open_uploads


def poison_findings(monkeypatch: pytest.MonkeyPatch, subjects: set[str]) -> None:
    """Reporting a finding about any of ``subjects`` raises: a failure in each row's work."""
    add = SweepReport.add

    def poisoned(self: SweepReport, scan: str, finding: Any) -> None:
        if finding.subject in subjects:
            raise TypeError(f"a row nothing can handle: {finding.subject}")
        add(self, scan, finding)

    monkeypatch.setattr(SweepReport, "add", poisoned)


async def test_a_failing_row_under_every_scan_is_skipped_and_the_others_are_swept(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, open_uploads = await two_rows_under_every_scan(rig)
    poison = {subjects[1] for subjects in rows.values()}
    poison_findings(monkeypatch, poison)
    metrics = WorkerMetrics()
    with capture_logs() as logs:
        async with open_sweeper(rig.config, rig.pool, rig.store, sweeper=CFG, metrics=metrics) as s:
            report = await s.sweep(dry_run=True)
    assert report.errors == [], report.errors  # every scan ran to its end
    for scan, (good, bad) in rows.items():
        found = [f.subject for f in getattr(report, scan)]
        assert good in found and bad not in found, (scan, found)
        assert row_errors(metrics, scan) == 1, scan
    assert report.counts["row_errors"] == len(SCANS)
    assert len(report.skipped) == len(SCANS)
    assert all(f.action == "skipped" and f.detail.startswith("TypeError: ") for f in report.skipped)
    failed = [e for e in logs if e["event"] == "scan_row_failed"]
    assert sorted(e["scan"] for e in failed) == sorted(SCANS)
    assert all(e["error_class"] == "TypeError" and "exc_info" not in e for e in failed)
    for upload in open_uploads:
        await upload.abort()


async def test_the_real_pass_counts_a_complete_sweep_with_skipped_rows(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, open_uploads = await two_rows_under_every_scan(rig)
    poison_findings(monkeypatch, {subjects[1] for subjects in rows.values()})
    metrics = WorkerMetrics()
    async with open_sweeper(rig.config, rig.pool, rig.store, sweeper=CFG, metrics=metrics) as s:
        report = await s.sweep(dry_run=False)
    assert report.errors == [] and report.counts["row_errors"] == len(SCANS)
    assert metrics.registry.get_sample_value("aivedio_sweeps_total", {"outcome": "swept"}) == 1
    # The good rows were acted on: e.g. the good watch gave up, the good orphan is gone.
    good_watch = rows["orphaned_watches"][0]
    assert (
        await rig.pool.fetchval(
            "SELECT status FROM task_watches WHERE generation_task_id = $1", uuid.UUID(good_watch)
        )
        == "GAVE_UP"
    )
    assert await rig.store.head(rows["quarantine_orphans"][0]) is None
    for upload in open_uploads:
        await upload.abort()


async def without_sane_check(pool: Pool, table: str, column: str) -> None:
    """Migration 0016's CHECK refuses the infinities; a database restored from before it (or
    whose operator dropped the constraint) can still hold them, and the readers must not care."""
    await pool.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_{column}_sane")


async def test_an_expiry_of_minus_infinity_is_swept_like_any_expired_url(rig: Rig) -> None:
    """The finding itself: a near-expiry scan meeting ``-infinity`` (asyncpg's naive
    ``datetime.min``) crashed the whole sweep. It is an expired URL like any other now."""
    soon = await add_output(rig.pool, rig.tenant_id, "FETCH_PENDING", expires_in=300)
    never = await add_output(rig.pool, rig.tenant_id, "FETCH_PENDING", expires_in=0)
    await without_sane_check(rig.pool, "provider_outputs", "source_url_expires_at")
    await rig.pool.execute(
        "UPDATE provider_outputs SET source_url_expires_at = '-infinity' WHERE id = $1", never
    )
    async with open_sweeper(rig.config, rig.pool, rig.store, sweeper=CFG) as s:
        report = await s.sweep(dry_run=True)
    assert report.errors == [] and report.skipped == []
    found = {f.subject: f for f in report.near_expiry}
    assert set(found) == {str(soon), str(never)}
    assert "expired" in found[str(never)].detail and found[str(never)].data["seconds_left"] < 0
    expires = await rig.pool.fetchval(
        "SELECT source_url_expires_at FROM provider_outputs WHERE id = $1", never
    )
    assert expires.tzinfo is not None and expires < datetime.now(UTC)


def test_sweep_dry_run_exits_0_over_a_poison_row(
    config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = msgspec.structs.replace(
        config, storage=msgspec.structs.replace(config.storage, url=f"file://{tmp_path}/o")
    )

    async def setup() -> tuple[str, str]:
        from aivedio.store.database import open_pool

        async with open_pool(config.database, min_size=1, max_size=2) as pool:
            tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
            soon = await add_output(pool, tenant, "FETCH_PENDING", expires_in=300)
            bad = await add_output(pool, tenant, "FETCH_PENDING", expires_in=300)
            # A value no CHECK forbids: what the task id says is beyond what this scan's
            # rows may hold, and its log line raises (a failure in the row's own work).
            await pool.execute(
                "UPDATE provider_outputs SET provider_task_id = 'poison' WHERE id = $1", bad
            )
        return str(soon), str(bad)

    soon, bad = anyio.run(setup, backend="asyncio")
    from aivedio.pipeline.upkeep import sweep_scans

    real = sweep_scans.log

    class PoisonLog:
        def __getattr__(self, name: str) -> Any:
            def emit(event: str, **fields: Any) -> Any:
                if fields.get("provider_task_id") == "poison":
                    raise OverflowError("a value this row's work cannot handle")
                return getattr(real, name)(event, **fields)

            return emit

    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub, common)
    args = parser.parse_args(["sweep", "--dry-run", "--json"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep_scans, "log", PoisonLog())
        assert args.fn(config, args) == 0
    document = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [f["subject"] for f in document["near_expiry"]] == [soon]
    assert document["skipped"] == [
        {
            "subject": f"near_expiry {bad}",
            "detail": "OverflowError: a value this row's work cannot handle",
            "action": "skipped",
        }
    ]
    assert document["errors"] == [] and document["counts"]["row_errors"] == 1


async def test_a_revision_whose_file_list_has_the_wrong_shape_is_skipped_alone(rig: Rig) -> None:
    good = await published_with_a_missing_file(rig)
    bad = await published_with_a_missing_file(rig, files={"files": [5]})
    metrics = WorkerMetrics()
    async with open_sweeper(rig.config, rig.pool, rig.store, sweeper=CFG, metrics=metrics) as s:
        report = await s.sweep(dry_run=True)
    assert report.errors == []
    assert [f.subject for f in report.integrity] == [good]
    assert [f.subject for f in report.skipped] == [f"integrity {bad}"]
    assert row_errors(metrics, "integrity") == 1


async def test_an_unreadable_root_keeps_its_whole_asset_and_gc_goes_on(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What cannot be proven garbage is kept: a revision row whose roots raise protects
    every key of its asset, and the other assets are collected."""
    from aivedio.pipeline.upkeep import gc

    pool, tenant = rig.pool, rig.tenant_id
    assets = {}
    for name in ("readable", "unreadable"):
        asset_id = await add_asset(pool, tenant, "PLAYABLE")
        await add_revision(pool, asset_id, 1, "READY")
        prefix = keys.revision_prefix(tenant, asset_id, 1)
        await add_variant(pool, asset_id, 1, "playback", f"{prefix}/playback.mp4", "SUCCEEDED", [])
        for path in ("playback.mp4", "stray.bin"):  # referenced, and not
            await rig.store.put_bytes(f"{prefix}/{path}", b"x")
            age(root_of(rig.config), f"{prefix}/{path}", OLD)
        assets[name] = (asset_id, prefix)
    real = gc.keys.revision_root
    unreadable_prefix = assets["unreadable"][1]

    def revision_root(key: str) -> str | None:
        if key.startswith(unreadable_prefix):
            raise ValueError("a root nothing can read")
        return real(key)

    monkeypatch.setattr(gc.keys, "revision_root", revision_root)
    async with open_sweeper(rig.config, pool, rig.store, sweeper=CFG) as s:
        report = await s.sweep(dry_run=False)
    assert report.errors == []
    assert [f.subject for f in report.orphan_objects] == [f"{assets['readable'][1]}/stray.bin"]
    assert await rig.store.head(f"{unreadable_prefix}/stray.bin") is not None  # kept
    assert f"orphan_objects {assets['unreadable'][0]}" in [f.subject for f in report.skipped]


async def test_an_upload_session_that_cannot_be_cleaned_does_not_stop_the_others(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = await expired_session(rig), await expired_session(rig)
    real = uploads.remove_session_objects

    async def remove(store: Any, session: Any) -> Any:
        if str(session.id) == bad:
            raise KeyError("part")
        return await real(store, session)

    monkeypatch.setattr(uploads, "remove_session_objects", remove)
    async with open_sweeper(rig.config, rig.pool, rig.store, sweeper=CFG) as s:
        report = await s.sweep(dry_run=False)
    assert report.errors == []
    assert [(f.subject, f.action) for f in report.expired_uploads] == [
        (good, "expired_and_cleaned")
    ]
    assert [f.subject for f in report.skipped] == [f"expired_uploads {bad}"]


# -- the outbox relay ------------------------------------------------------------------------------


async def test_an_undecodable_event_is_dead_and_the_others_are_delivered(pool: Pool) -> None:
    """jsonb nests deeper than the decoder will go: the claim used to fail whole, every
    pass, with the batch it leased stuck behind it."""
    metrics = WorkerMetrics()
    async with open_receiver() as receiver:
        relay_config = outbox_config(receiver)
        async with outbox_relay.open_outbox_relay(
            relay_config, pool, metrics=metrics.supervision
        ) as relay:
            before = await emit_one(pool)
            async with pool.acquire() as conn, conn.transaction():
                poison = str(
                    await emit(conn, "asset.ready", tenant_id=7, aggregate_id=None, payload={})
                )
                await conn.execute(
                    "UPDATE outbox_events SET payload = $2::text::jsonb WHERE event_id = $1",
                    uuid.UUID(poison),
                    "[" * 1500 + "]" * 1500,
                )
            after = await emit_one(pool)
            relay._wake.set()
            await until(lambda: {before, after} <= set(receiver.ids()), "the others delivered")
            await until_dead(pool, poison)
    assert poison not in receiver.ids()
    error = await pool.fetchval(
        "SELECT d.last_error FROM outbox_deliveries d JOIN outbox_events e"
        " ON e.id = d.outbox_event_id WHERE e.event_id = $1",
        uuid.UUID(poison),
    )
    assert error.startswith("undecodable: RecursionError")
    assert row_errors(metrics, "outbox_relay") == 1


async def until_dead(pool: Pool, event_id: str) -> None:
    with anyio.fail_after(10):
        while not await pool.fetchval(
            "SELECT d.dead_at IS NOT NULL FROM outbox_deliveries d JOIN outbox_events e"
            " ON e.id = d.outbox_event_id WHERE e.event_id = $1",
            uuid.UUID(event_id),
        ):
            await anyio.sleep(0.05)


async def test_a_delivery_whose_sending_raises_is_dead_alone(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    encode = outbox_relay.encode_body

    def encode_body(c: Any) -> bytes:
        if str(c.event_id) == events[1]:
            raise TypeError("nothing can send this")
        return encode(c)

    monkeypatch.setattr(outbox_relay, "encode_body", encode_body)
    async with open_receiver() as receiver:
        relay_config = msgspec.structs.replace(outbox_config(receiver), poll_interval_seconds=30)
        async with outbox_relay.open_outbox_relay(relay_config, pool) as relay:
            # Emitted together after the relay registered: one pass claims all three.
            async with pool.acquire() as conn, conn.transaction():
                for _ in range(3):
                    event = await emit(
                        conn, "asset.ready", tenant_id=7, aggregate_id=None, payload={}
                    )
                    events.append(str(event))
            poison = events[1]
            relay._wake.set()
            others = {events[0], events[2]}
            await until(lambda: others <= set(receiver.ids()), "the others delivered")
            await until_dead(pool, poison)
    assert poison not in receiver.ids()


# -- the backlog reading and the queue gauges ---------------------------------------------------


async def test_a_job_due_at_minus_infinity_stops_no_reading(config: Config, pool: Pool) -> None:
    """``now() - '-infinity'`` is an error in PostgreSQL: one such row failed the backlog
    reading, the queue gauges and the promotion of waits, every time, for ever."""
    queue = Queue(pool)
    async with pool.acquire() as conn:
        for key, lane in (("old", "media"), ("fine", "media"), ("later", "control")):
            spec = JobSpec(kind="render", lane=lane, idempotency_key=key, payload={})
            await queue.enqueue_one(conn, spec)
    await without_sane_check(pool, "jobs", "run_after")
    await pool.execute("UPDATE jobs SET run_after = '-infinity' WHERE idempotency_key = 'old'")
    await pool.execute(
        "UPDATE jobs SET status = 'waiting', run_after = 'infinity' WHERE idempotency_key = 'later'"
    )
    oldest, near = await backlog.read_signals(pool, 900.0)
    assert 0 <= oldest < 60 and near == 0  # the poison row is left out of the age
    stats = await queue.stats()
    assert stats["render"][0] == 2 and 0 <= stats["render"][1] < 60
    promoted, next_due = await queue.promote()
    assert promoted == 0 and next_due is None  # a wait due never is not due


# -- a stage's jobs -----------------------------------------------------------------------------


async def run_until(worker: Any, pool: Pool, sql: str, *args: object) -> Any:
    """Run ``worker`` until ``sql`` returns a row; that row."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        with anyio.fail_after(20):
            while (row := await pool.fetchrow(sql, *args)) is None:
                await anyio.sleep(0.05)
        worker.request_drain(force=True)
    return row


async def test_a_job_with_an_absurd_attempt_count_is_retried_like_any_other(
    config: Config, pool: Pool
) -> None:
    """A row no CHECK refuses (5000 attempts of a budget of 100000): computing its backoff
    overflowed a float, in recording the failure, which ended the worker's task group."""
    from aivedio.worker.daemon import Worker
    from aivedio.worker.kinds import default_registry

    registry = default_registry()
    async with pool.acquire() as conn:
        spec = registry.spec(
            "diag.fail", "absurd", payload={"error_class": "transient"}, max_attempts=100000
        )
        job_id = (await Queue(pool).enqueue_one(conn, spec)).job_id
    await pool.execute("UPDATE jobs SET attempts = 5000 WHERE id = $1", job_id)
    row = await run_until(
        Worker(config, pool, registry),
        pool,
        "SELECT * FROM jobs WHERE id = $1 AND attempts > 5000 AND lease_owner IS NULL",
        job_id,
    )
    assert row["status"] in ("waiting", "queued") and row["last_error_class"] == "transient"


async def test_a_job_whose_outcome_cannot_be_recorded_stops_no_other_job(
    config: Config, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivedio.worker.daemon import Worker
    from aivedio.worker.kinds import default_registry

    registry = default_registry()
    queue = Queue(pool)
    async with pool.acquire() as conn:
        bad = (
            await queue.enqueue_one(
                conn, registry.spec("diag.fail", "bad", payload={"error_class": "transient"})
            )
        ).job_id
    worker = Worker(config, pool, registry)

    async def fail(job: Any, error: Any) -> None:
        raise TypeError("a bug in recording a failure")

    monkeypatch.setattr(worker, "_fail", fail)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: worker.run(install_signal_handlers=False))
            await until(lambda: any(e["event"] == "job_outcome_not_recorded" for e in logs), "it")
            async with pool.acquire() as conn:
                good = (await queue.enqueue_one(conn, registry.spec("diag.noop", "good"))).job_id
            with anyio.fail_after(15):
                while not await pool.fetchval(
                    "SELECT 1 FROM job_history WHERE id = $1 AND status = 'succeeded'", good
                ):
                    await anyio.sleep(0.05)
            worker.request_drain(force=True)
    (event,) = [e for e in logs if e["event"] == "job_outcome_not_recorded"]
    assert event["job_id"] == bad and event["error_class"] == "TypeError"
