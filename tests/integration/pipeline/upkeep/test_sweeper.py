"""The compensation sweeper against real PostgreSQL and the local object store; the case of
a segment lost from under a published playlist through the worker with real ffmpeg.

Most histories are built as rows and tiny objects directly (fast, and any shape can be
made); ages are set with ``os.utime`` on the local store's files, which is what
``ObjectInfo.last_modified`` reports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aivedio.cli.sweep import add_parsers
from aivedio.config.load import Config
from aivedio.config.sweeper import SweeperConfig, validate_sweeper
from aivedio.errors import ConfigError, TransientError
from aivedio.pipeline.jobs import Registry, probe_spec
from aivedio.pipeline.upkeep.lifecycle import delete_asset
from aivedio.pipeline.upkeep.sweeper import (
    INTEGRITY_EVENT,
    ROOT_REVISIONS,
    Sweeper,
    open_sweeper,
    playlist_uris,
    register,
    resolve_uri,
    seed_periodic_sweep,
    sweep_spec,
)
from aivedio.store.database import Pool, open_pool
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectStore, ObjectStoreError
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import JobSpec, Queue
from aivedio.worker.daemon import Worker
from tests.conftest import make_config
from tests.support.hls_check import check_hls
from tests.support.media_fixtures import MediaCache, h264_faststart
from tests.support.pipeline_rig import Rig, fake_job, make_rig, running_worker

pytestmark = pytest.mark.anyio

GRACE = 3600.0
OLD = 2 * GRACE
CFG = SweeperConfig(
    orphan_grace_seconds=GRACE,
    processing_budget_seconds=GRACE,
    multipart_stale_seconds=GRACE,
    expiry_warning_seconds=900,
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    cache = MediaCache(tmp_path_factory.mktemp("media"))
    return cache.get("h264", h264_faststart, width=320, height=240, seconds=2).read_bytes()


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(config, pool, tmp_path) as r:
        yield r


@asynccontextmanager
async def sweeper(rig: Rig, cfg: SweeperConfig = CFG) -> AsyncIterator[Sweeper]:
    async with open_sweeper(rig.config, rig.pool, rig.store, sweeper=cfg) as s:
        yield s


def root_of(config: Config) -> Path:
    return Path(config.storage.url.removeprefix("file://"))


def age(root: Path, key: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(root / key, (then, then))


async def exists(store: ObjectStore, key: str) -> bool:
    return await store.head(key) is not None


# -- rows --------------------------------------------------------------------------------------


async def add_asset(
    pool: Pool, tenant_id: int, status: str, *, updated_ago: float = 0, source: str | None = None
) -> uuid.UUID:
    asset_id = uuid.uuid4()
    await pool.execute(
        "INSERT INTO assets (id, tenant_id, source_type, status, source_object_key,"
        " source_size_bytes, updated_at) VALUES ($1, $2, 'UPLOAD', $3, $4, 1,"
        " now() - make_interval(secs => $5))",
        asset_id,
        tenant_id,
        status,
        source,
        updated_ago,
    )
    return asset_id


async def add_revision(
    pool: Pool,
    asset_id: uuid.UUID,
    revision: int,
    status: str,
    *,
    required: tuple[str, ...] = ("playback",),
    optional: tuple[str, ...] = (),
) -> None:
    await pool.execute(
        "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status,"
        " required_outputs, optional_outputs) VALUES ($1, $2, 1, $3, $4, $5)",
        asset_id,
        revision,
        status,
        list(required),
        list(optional),
    )


async def add_variant(
    pool: Pool,
    asset_id: uuid.UUID,
    revision: int,
    variant_type: str,
    object_key: str,
    status: str,
    paths: list[str],
) -> None:
    files = [
        {"path": p, "size": 1, "sha256": "", "mime": "application/octet-stream"} for p in paths
    ]
    await pool.execute(
        "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
        " mime_type, size_bytes, checksum_alg, checksum, status, extra)"
        " VALUES ($1, $2, $3, $4, $5, 'application/octet-stream', 1, 'sha256', '', $6, $7)",
        uuid.uuid4(),
        asset_id,
        revision,
        variant_type,
        object_key,
        status,
        {"files": files} if paths else None,
    )


async def add_output(pool: Pool, tenant_id: int, status: str, *, expires_in: float) -> uuid.UUID:
    task, output = uuid.uuid4(), uuid.uuid4()
    await pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status) VALUES ($1, $2, 'sim', $3, 'PROVIDER_SUCCEEDED')",
        task,
        tenant_id,
        str(task),
    )
    await pool.execute(
        "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
        " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
        " fetch_status, source_url_expires_at) VALUES ($1, $2, $3, 'sim', $4, 0, '\\x00', 'k1',"
        " $5, now() + make_interval(secs => $6))",
        output,
        tenant_id,
        task,
        str(task),
        status,
        expires_in,
    )
    return output


# -- a segment lost from under a published playlist -----------------------------------------


async def publish_with_hls(rig: Rig, source: bytes) -> uuid.UUID:
    """An asset published through the worker with HLS in its required set and nothing
    optional: one complete revision per build."""
    media = msgspec.structs.replace(
        rig.config.media, required_outputs=["playback", "poster", "hls"], optional_outputs=[]
    )
    rig.config = msgspec.structs.replace(rig.config, media=media)
    asset_id = await rig.quarantine(source)
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT current_revision = 1 FROM assets WHERE id = $1", asset_id)
        await rig.wait_idle(asset_id)
    return asset_id


async def publish_then_lose_a_segment(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> tuple[uuid.UUID, str]:
    """An asset published through the worker, then one HLS segment of it deleted from the
    store (its playlist still names it): the asset id and the lost key."""
    asset_id = await publish_with_hls(rig, source)
    hls = await rig.pool.fetchrow(
        "SELECT object_key, extra FROM asset_variants WHERE asset_id = $1 AND revision = 1"
        " AND variant_type = 'hls'",
        asset_id,
    )
    assert hls is not None
    base = hls["object_key"].rsplit("/hls/", 1)[0]
    segments = [f["path"] for f in hls["extra"]["files"] if f["path"].endswith(".m4s")]
    assert len(segments) >= 2
    lost = f"{base}/{segments[1]}"
    await rig.store.delete(lost)
    return asset_id, lost


async def test_a_published_segment_deleted_afterwards_is_found_alerted_and_rebuild_enqueued(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    asset_id, lost = await publish_then_lose_a_segment(rig, source, monkeypatch)
    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    (finding,) = report.integrity
    assert finding.subject == str(asset_id)
    assert finding.action == "alerted_and_rebuild"
    assert {"key": lost, "problem": "missing"} in finding.data["problems"]
    (event,) = [e for e in await rig.events(asset_id) if e["event_type"] == INTEGRITY_EVENT]
    assert event["payload"]["revision"] == 1
    assert event["payload"]["rebuild_job_id"] == str(finding.data["rebuild_job_id"])
    job = await Queue(rig.pool).get(finding.data["rebuild_job_id"])
    assert job is not None and job["kind"] == "reprocess"
    assert job["payload"] == {"asset_id": str(asset_id)}

    async with sweeper(rig) as s:  # alerted once per revision, rebuilt once
        again = await s.sweep(dry_run=False)
    assert [f.action for f in again.integrity] == ["already_alerted"]
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'reprocess'") == 1
    assert len([e for e in await rig.events(asset_id) if e["event_type"] == INTEGRITY_EVENT]) == 1


async def test_the_rebuild_publishes_a_new_revision_whose_hls_is_complete(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    asset_id, _ = await publish_then_lose_a_segment(rig, source, monkeypatch)
    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    assert [f.action for f in report.integrity] == ["alerted_and_rebuild"]
    async with running_worker(rig):
        # Published, or (fail fast) the new revision's moderation gave up on it.
        await rig.wait(
            "SELECT current_revision > 1 OR EXISTS (SELECT 1 FROM job_history WHERE"
            " kind = 'moderate' AND payload->>'asset_id' = $2"
            " AND result->>'outcome' = 'not_building') FROM assets WHERE id = $1",
            asset_id,
            str(asset_id),
        )
        await rig.wait_idle(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["current_revision"] > 1
    revisions = {r["revision"]: r for r in await rig.revisions(asset_id)}
    current = revisions[asset["current_revision"]]
    assert current["status"] == "READY" and "hls" in current["published_outputs"]
    assert revisions[1]["status"] == "SUPERSEDED"
    master = await rig.pool.fetchval(
        "SELECT object_key FROM asset_variants WHERE asset_id = $1 AND revision = $2"
        " AND variant_type = 'hls'",
        asset_id,
        current["revision"],
    )
    assert check_hls(root_of(rig.config) / master, decode=False) == []
    async with sweeper(rig) as s:
        after = await s.sweep(dry_run=False)
    assert after.integrity == [], after.integrity
    assert after.counts["revisions_audited"] == 1


# -- orphan GC: a property over random histories ---------------------------------------------------

NAMES = (
    "playback.mp4",
    "poster.jpg",
    "hls/master.m3u8",
    "hls/240p/index.m3u8",
    "hls/240p/init.mp4",
    "hls/240p/seg_000.m4s",
    "hls/240p/seg_001.m4s",
)
REVISION_STATES = ("BUILDING", "READY", "SUPERSEDED", "FAILED", "ABANDONED")
ASSET_STATES = ("PLAYABLE", "ENRICHED", "PROCESSING", "PROCESSING_FAILED", "DELETED")

variant_st = st.tuples(
    st.integers(0, 3),  # which earlier revision's prefix holds its files (enrichment shares)
    st.sampled_from(NAMES),  # the primary object
    st.lists(st.sampled_from(NAMES), max_size=4, unique=True),  # extra.files
    st.sampled_from(("SUCCEEDED", "FAILED", "PENDING")),
)
asset_st = st.tuples(
    st.sampled_from(ASSET_STATES),
    st.lists(
        st.tuples(st.sampled_from(REVISION_STATES), st.lists(variant_st, max_size=3)),
        min_size=1,
        max_size=4,
    ),
    # Objects nobody may reference: (revision number, name); they may coincide with
    # referenced ones, which must then survive.
    st.lists(st.tuples(st.integers(1, 5), st.sampled_from((*NAMES, "stray.bin"))), max_size=4),
)
history_st = st.tuples(st.lists(asset_st, min_size=1, max_size=3), st.integers(0, 2**16))


def is_old(salt: int, key: str) -> bool:
    return zlib.crc32(f"{salt}:{key}".encode()) % 3 != 0


async def _gc_example(dsn: str, root: Path, history: Any) -> None:
    assets, salt = history
    shutil.rmtree(root, ignore_errors=True)
    config = make_config(dsn)
    config = msgspec.structs.replace(
        config, storage=msgspec.structs.replace(config.storage, url=f"file://{root}")
    )
    async with (
        open_pool(config.database, min_size=1, max_size=4) as pool,
        open_object_store(config.storage) as store,
    ):
        # One database for every example: start each from no assets (the ledger is
        # append-only, so tables are emptied one by one rather than truncated in cascade).
        for table in ("asset_variants", "asset_revisions", "assets"):
            await pool.execute(f"DELETE FROM {table}")
        tenant = await pool.fetchval(
            "INSERT INTO tenants (name) VALUES ('t') ON CONFLICT (name)"
            " DO UPDATE SET name = excluded.name RETURNING id"
        )
        referenced: set[str] = set()
        protected: list[str] = []
        written: set[str] = set()
        for asset_status, revisions, strays in assets:
            asset_id = await add_asset(pool, tenant, asset_status)

            def key(number: int, name: str, asset_id: uuid.UUID = asset_id) -> str:
                return f"{keys.revision_prefix(tenant, asset_id, number)}/{name}"

            for number, (status, variants) in enumerate(revisions, start=1):
                await add_revision(pool, asset_id, number, status)
                pending = False
                for index, (holder, primary, paths, variant_status) in enumerate(variants):
                    base = min(holder, number - 1) + 1
                    await add_variant(
                        pool,
                        asset_id,
                        number,
                        f"v{index}",
                        key(base, primary),
                        variant_status,
                        paths,
                    )
                    names = {key(base, primary), *(key(base, p) for p in paths)}
                    written |= names
                    pending |= variant_status == "PENDING"
                    if asset_status != "DELETED" and status in ROOT_REVISIONS:
                        referenced |= names
                if asset_status != "DELETED" and (
                    status == "BUILDING" or (status == "READY" and pending)
                ):
                    protected.append(keys.revision_prefix(tenant, asset_id, number) + "/")
            written |= {key(number, name) for number, name in strays}
        for name in sorted(written):
            await store.put_bytes(name, b"x")
            age(root, name, OLD if is_old(salt, name) else 60)
        async with open_sweeper(config, pool, store, sweeper=CFG) as s:
            report = await s.sweep(dry_run=False)
        assert report.errors == []
        for name in sorted(written):
            present = await exists(store, name)
            if name in referenced:
                assert present, f"referenced {name} was deleted"
            elif not is_old(salt, name):
                assert present, f"{name} is inside the grace period but was deleted"
            elif name.startswith(tuple(protected)):  # a render may still be recording it
                assert present, f"{name} under a building revision's prefix was deleted"
            else:
                assert not present, f"unreferenced old {name} was kept"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=history_st)
def test_orphan_gc_never_deletes_what_a_published_or_building_revision_references(
    database: str, tmp_path: Path, history: Any
) -> None:
    anyio.run(_gc_example, database, tmp_path / "objects", history, backend="asyncio")


# -- deletion, uploads, dry run ------------------------------------------------------------------


async def test_objects_of_a_deleted_asset_are_collected_only_after_the_grace_period(
    rig: Rig,
) -> None:
    root, th = root_of(rig.config), keys.tenant_hash(rig.tenant_id)
    source = f"quarantine/{th}/{uuid.uuid4()}/source.bin"
    asset_id = await add_asset(rig.pool, rig.tenant_id, "PROCESSING", source=source)
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    await add_revision(rig.pool, asset_id, 1, "BUILDING", required=("playback", "poster"))
    await add_variant(
        rig.pool, asset_id, 1, "playback", f"{prefix}/playback.mp4", "SUCCEEDED", ["playback.mp4"]
    )
    await add_variant(rig.pool, asset_id, 1, "poster", f"{prefix}/poster.jpg", "PENDING", [])
    # A cancelled sibling whose source is under retention: kept however old it is.
    kept_source = f"quarantine/{th}/{uuid.uuid4()}/source.bin"
    retained = await add_asset(rig.pool, rig.tenant_id, "DELETED", source=kept_source)
    await rig.pool.execute(
        "UPDATE assets SET source_retain_until = now() + interval '30 days' WHERE id = $1",
        retained,
    )
    objects = [source, f"{prefix}/playback.mp4", f"{prefix}/poster.jpg"]
    for name in [*objects, kept_source]:
        await rig.store.put_bytes(name, b"x")

    assert await delete_asset(rig.pool, asset_id)  # while its revision was still building
    async with sweeper(rig) as s:
        young = await s.sweep(dry_run=False)
    assert young.orphan_objects == [] and young.quarantine_orphans == []
    assert all([await exists(rig.store, name) for name in objects])

    for name in [*objects, kept_source]:
        age(root, name, OLD)
    async with sweeper(rig) as s:
        old = await s.sweep(dry_run=False)
    assert {(f.subject, f.detail, f.action) for f in old.orphan_objects} == {
        (f"{prefix}/playback.mp4", "deleted_asset", "deleted"),
        (f"{prefix}/poster.jpg", "deleted_asset", "deleted"),
    }
    assert [(f.subject, f.action) for f in old.quarantine_orphans] == [(source, "deleted")]
    assert not any([await exists(rig.store, name) for name in objects])
    assert await exists(rig.store, kept_source)


async def test_stale_multipart_uploads_are_aborted_and_recent_ones_kept(rig: Rig) -> None:
    root = root_of(rig.config)
    stale = await rig.store.start_upload("quarantine/x/stale/source.bin")
    fresh = await rig.store.start_upload("quarantine/x/fresh/source.bin")
    await stale.write(b"half")
    await fresh.write(b"half")
    (pending,) = [p for p in await rig.store.list_multipart_uploads() if "stale" in p.key]
    age(root, f".tmp/{pending.upload_id}.upload", OLD)
    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    assert [(f.subject, f.action) for f in report.stale_uploads] == [
        ("quarantine/x/stale/source.bin", "aborted")
    ]
    left = await rig.store.list_multipart_uploads()
    assert [p.key for p in left] == ["quarantine/x/fresh/source.bin"]
    await fresh.abort()
    await stale.abort()


async def test_a_dry_run_reports_everything_and_changes_nothing(rig: Rig) -> None:
    root = root_of(rig.config)
    failed = await add_asset(rig.pool, rig.tenant_id, "PROCESSING_FAILED")
    await add_revision(rig.pool, failed, 1, "FAILED")
    leftover = f"{keys.revision_prefix(rig.tenant_id, failed, 1)}/hls/240p/seg_000.m4s"
    await rig.store.put_bytes(leftover, b"x")
    age(root, leftover, OLD)
    stuck = await add_asset(rig.pool, rig.tenant_id, "PROCESSING", updated_ago=OLD)
    await add_revision(rig.pool, stuck, 1, "BUILDING", required=("playback", "poster"))
    await add_variant(rig.pool, stuck, 1, "playback", "k/rev/1/p.mp4", "SUCCEEDED", [])
    await add_variant(rig.pool, stuck, 1, "poster", "k/rev/1/p.jpg", "PENDING", [])
    upload = await rig.store.start_upload("quarantine/x/source.bin")
    (pending,) = await rig.store.list_multipart_uploads()
    age(root, f".tmp/{pending.upload_id}.upload", OLD)
    before = await rig.pool.fetch("SELECT id, status, version FROM assets ORDER BY id")

    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=True)
    assert report.dry_run and report.errors == []
    assert [(f.subject, f.detail, f.action) for f in report.orphan_objects] == [
        (leftover, "failed_revision", "would_delete")
    ]
    assert [f.action for f in report.stale_uploads] == ["would_abort"]
    assert [(f.subject, f.action) for f in report.stuck_assets] == [
        (str(stuck), "would_revision_failed")
    ]
    assert await exists(rig.store, leftover)
    assert len(await rig.store.list_multipart_uploads()) == 1
    assert await rig.pool.fetch("SELECT id, status, version FROM assets ORDER BY id") == before
    assert await rig.pool.fetchval("SELECT count(*) FROM asset_variants WHERE status = 'PENDING'")
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs") == 0

    async with sweeper(rig) as s:  # and the real pass does what the dry run said
        real = await s.sweep(dry_run=False)
    assert [f.action for f in real.orphan_objects] == ["deleted"]
    assert [f.action for f in real.stale_uploads] == ["aborted"]
    assert not await exists(rig.store, leftover)
    await upload.abort()


# -- stuck work ------------------------------------------------------------------------------------


async def test_stuck_assets_fail_or_move_on_by_the_required_set_rule(rig: Rig) -> None:
    pool, tenant = rig.pool, rig.tenant_id
    queue = Queue(pool)
    # D: a probe job that ran and died (its key is spent): the asset cannot wait forever.
    dead_probe = await add_asset(pool, tenant, "PROBING", updated_ago=OLD)
    async with pool.acquire() as conn:
        await queue.enqueue_one(conn, probe_spec(dead_probe, tenant))
    (job,) = await queue.claim("media", 1, "t", 30)
    assert await queue.bury(job, "t", error_class="lease_expired", detail="gone")
    # A: a required output whose render jobs are gone.
    broken = await add_asset(pool, tenant, "PROCESSING", updated_ago=OLD)
    await add_revision(pool, broken, 1, "BUILDING", required=("playback", "poster"))
    await add_variant(pool, broken, 1, "playback", "k/rev/1/p.mp4", "SUCCEEDED", [])
    await add_variant(pool, broken, 1, "poster", "k/rev/1/p.jpg", "PENDING", [])
    # B: the required set is done; an optional output is stuck: moderation goes ahead.
    optional = await add_asset(pool, tenant, "PROCESSING", updated_ago=OLD)
    await add_revision(pool, optional, 1, "BUILDING", required=("playback",), optional=("hls",))
    await add_variant(pool, optional, 1, "playback", "k/rev/1/p.mp4", "SUCCEEDED", [])
    await add_variant(pool, optional, 1, "hls", "k/rev/1/hls/master.m3u8", "PENDING", [])
    # F: published, and its rebuild's render jobs are gone: only the rebuild fails.
    rebuilt = await add_asset(pool, tenant, "PLAYABLE")
    await add_revision(pool, rebuilt, 1, "READY")
    await add_revision(pool, rebuilt, 2, "BUILDING")
    await add_variant(pool, rebuilt, 2, "playback", "k/rev/2/p.mp4", "PENDING", [])
    await pool.execute(
        "UPDATE asset_revisions SET updated_at = now() - interval '3 hours'"
        " WHERE asset_id = $1 AND revision = 2",
        rebuilt,
    )
    await pool.execute("UPDATE assets SET current_revision = 1 WHERE id = $1", rebuilt)
    # C: quarantined and never probed; E: slow but inside its budget.
    unprobed = await add_asset(pool, tenant, "QUARANTINED", updated_ago=OLD)
    recent = await add_asset(pool, tenant, "PROBING", updated_ago=60)

    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    actions = {f.subject: f.action for f in report.stuck_assets}
    assert actions == {
        str(dead_probe): "processing_failed",
        str(broken): "revision_failed",
        str(optional): "moderate_enqueued",
        str(unprobed): "probe_enqueued",
        str(rebuilt): "revision_failed",
    }
    states = {r["id"]: r for r in await pool.fetch("SELECT * FROM assets")}
    assert states[dead_probe]["status"] == "PROCESSING_FAILED"
    assert states[dead_probe]["last_error_class"] == "stuck"
    assert states[broken]["status"] == "PROCESSING_FAILED"
    assert states[optional]["status"] == "PROCESSING"
    assert states[unprobed]["status"] == "QUARANTINED"
    assert states[recent]["status"] == "PROBING"
    assert states[rebuilt]["status"] == "PLAYABLE" and states[rebuilt]["current_revision"] == 1
    variants = {
        (r["asset_id"], r["variant_type"]): r["status"]
        for r in await pool.fetch("SELECT asset_id, variant_type, status FROM asset_variants")
    }
    assert variants[(broken, "poster")] == "FAILED"
    assert variants[(optional, "hls")] == "FAILED"
    assert variants[(optional, "playback")] == "SUCCEEDED"
    revisions = {
        (r["asset_id"], r["revision"]): r["status"]
        for r in await pool.fetch("SELECT asset_id, revision, status FROM asset_revisions")
    }
    assert revisions[(broken, 1)] == "FAILED"
    assert revisions[(rebuilt, 1)] == "READY" and revisions[(rebuilt, 2)] == "FAILED"
    live = {(r["kind"], r["payload"]["asset_id"]) for r in await pool.fetch("SELECT * FROM jobs")}
    assert live == {("moderate", str(optional)), ("probe", str(unprobed))}


async def test_fetch_escalations_expired_leases_and_tasks_without_outputs(rig: Rig) -> None:
    pool, tenant = rig.pool, rig.tenant_id
    queue = Queue(pool)
    expiring = await add_output(pool, tenant, "FETCH_PENDING", expires_in=300)
    await add_output(pool, tenant, "FETCH_PENDING", expires_in=7200)  # far from expiry
    orphaned = await add_output(pool, tenant, "FETCHING", expires_in=7200)
    leased = await add_output(pool, tenant, "FETCHING", expires_in=7200)
    spec = JobSpec(
        kind="fetch",
        lane="fetch",
        idempotency_key=f"fetch:{leased}:v1",
        payload={"provider_output_id": str(leased)},
    )
    async with pool.acquire() as conn:
        await queue.enqueue_one(conn, spec)
    (job,) = await queue.claim("fetch", 1, "gone-worker", 0.01)  # a worker that died
    await anyio.sleep(0.05)
    lonely = uuid.uuid4()
    await pool.execute(
        "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
        " provider_status, updated_at) VALUES ($1, $2, 'sim', 'lonely', 'PROVIDER_SUCCEEDED',"
        " now() - interval '1 hour')",
        lonely,
        tenant,
    )

    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    assert [f.subject for f in report.near_expiry] == [str(expiring)]
    assert report.near_expiry[0].action == "escalated"
    assert 200 < report.near_expiry[0].data["seconds_left"] <= 300
    assert {(f.subject, f.action) for f in report.fetching_stale} == {
        (str(orphaned), "reported"),
        (str(leased), "requeued"),
    }
    assert [(f.subject, f.action) for f in report.reaped_jobs] == [(f"job {job.id}", "requeued")]
    assert (await queue.get(job.id) or {})["status"] == "queued"
    assert [f.subject for f in report.tasks_without_output] == [str(lonely)]


async def test_a_watch_whose_poll_job_died_gives_up_instead_of_waiting_forever(rig: Rig) -> None:
    pool, tenant = rig.pool, rig.tenant_id
    queue = Queue(pool)
    ids = {}
    for name, age in (("polled", "1 hour"), ("orphaned", "1 hour"), ("fresh", "0 seconds")):
        task = ids[name] = uuid.uuid4()
        await pool.execute(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status, watch) VALUES ($1, $2, 'sim', $3, 'PROVIDER_RUNNING', true)",
            task,
            tenant,
            name,
        )
        await pool.execute(
            "INSERT INTO task_watches (generation_task_id, tenant_id, provider,"
            " provider_task_id, round, give_up_at, updated_at) VALUES ($1, $2, 'sim', $3, 2,"
            f" now() + interval '1 day', now() - interval '{age}')",
            task,
            tenant,
            name,
        )
    spec = JobSpec(
        kind="poll",
        lane="control",
        idempotency_key=f"poll:{ids['polled']}:r2",
        payload={"generation_task_id": str(ids["polled"])},
    )
    async with pool.acquire() as conn:
        await queue.enqueue_one(conn, spec)
    # A poll job of an earlier round is no poll job of this one.
    stale = JobSpec(
        kind="poll",
        lane="control",
        idempotency_key=f"poll:{ids['orphaned']}:r1",
        payload={"generation_task_id": str(ids["orphaned"])},
    )
    async with pool.acquire() as conn:
        await queue.enqueue_one(conn, stale)

    async with sweeper(rig) as s:
        dry = await s.sweep(dry_run=True)
        assert [(f.subject, f.action) for f in dry.orphaned_watches] == [
            (str(ids["orphaned"]), "would_give_up")
        ]
        assert (
            await pool.fetchval(
                "SELECT status FROM task_watches WHERE generation_task_id = $1", ids["orphaned"]
            )
            == "WATCHING"
        )
        report = await s.sweep(dry_run=False)
    assert [(f.subject, f.action) for f in report.orphaned_watches] == [
        (str(ids["orphaned"]), "gave_up")
    ]
    rows = {r["generation_task_id"]: r for r in await pool.fetch("SELECT * FROM task_watches")}
    assert rows[ids["orphaned"]]["status"] == "GAVE_UP"
    assert rows[ids["orphaned"]]["last_error_class"] == "poll_job_dead"
    assert rows[ids["polled"]]["status"] == rows[ids["fresh"]]["status"] == "WATCHING"
    watched = {
        r["id"]: r["watch"] for r in await pool.fetch("SELECT id, watch FROM generation_tasks")
    }
    assert watched == {ids["orphaned"]: False, ids["polled"]: True, ids["fresh"]: True}


# -- the periodic job and the one-at-a-time rule --------------------------------------------------


async def test_the_sweep_job_defers_until_due_chains_the_next_and_runs_alone(rig: Rig) -> None:
    async with sweeper(rig) as s:
        early = fake_job({"not_before": time.time() + 60}, "sweep")
        with pytest.raises(Exception, match="not due") as raised:
            await s.run_job(early)
        assert raised.value.retry_after_seconds is not None  # type: ignore[attr-defined]
        result = await s.run_job(fake_job({"not_before": 0}, "sweep"))
        assert result["outcome"] == "swept"
        following = sweep_spec(s.clock(), CFG.interval_seconds, following=True)
        job = await Queue(rig.pool).get(result["next_job_id"])
        assert job is not None and job["idempotency_key"] == following.idempotency_key
        assert job["payload"]["not_before"] > time.time()
        async with s._exclusive() as held:  # another member of the fleet is sweeping
            assert held
            busy = await s.run_job(fake_job({"not_before": 0}, "sweep"))
        assert busy["outcome"] == "another_sweeper_running"


async def test_the_periodic_sweep_runs_through_a_worker_once_per_interval(rig: Rig) -> None:
    registry = Registry()  # the sweep kind alone, whatever the default registry holds
    register(registry)
    cfg = msgspec.structs.replace(CFG, interval_seconds=1.0)
    started = time.monotonic()  # before anything that could start a pass
    async with sweeper(rig, cfg) as s, anyio.create_task_group() as tg:
        worker = Worker(rig.config, rig.pool, registry, services={"sweeper": s})
        tg.start_soon(lambda: worker.run(install_signal_handlers=False))
        for _ in range(3):  # every worker seeds at start: one job per bucket
            await seed_periodic_sweep(rig.pool, Queue(rig.pool), cfg)
        await rig.wait(
            "SELECT count(*) >= 3 FROM job_history WHERE kind = 'sweep'"
            " AND status = 'succeeded' AND result->>'outcome' = 'swept'",
            timeout=20,
        )
        worker.request_drain(force=True)
    elapsed = time.monotonic() - started
    rows = await rig.pool.fetch(
        "SELECT idempotency_key, (payload->>'not_before')::float8 AS due, finished_at,"
        " result->>'outcome' AS outcome FROM job_history WHERE kind = 'sweep' ORDER BY id"
    )
    buckets = [int(r["idempotency_key"].rsplit(":", 1)[1]) for r in rows]
    assert len(buckets) == len(set(buckets))  # one job per bucket
    # Each job swept, or found another pass holding the fleet's lock. Their order is not
    # promised: on a loaded machine a bucket's job claimed late, once the next bucket is due
    # as well, may run beside it (the lock lets one of them sweep) or after it; a pass is
    # idempotent, so that costs a pass, never a result.
    assert {r["outcome"] for r in rows} <= {"swept", "another_sweeper_running"}, rows
    # None ran early: a job claimed before its bucket is due defers itself (its started_at
    # may be that early claim), so the pass, and its completion, come after the due time.
    assert all(r["finished_at"].timestamp() >= r["due"] for r in rows)
    assert elapsed >= 1.0  # three passes need at least two intervals after the first


def test_sweeper_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"sweeper\.orphan_grace_seconds: must be positive"):
        validate_sweeper(SweeperConfig(orphan_grace_seconds=0))
    with pytest.raises(ConfigError, match=r"sweeper\.audit_sample"):
        validate_sweeper(SweeperConfig(audit_sample=-1))
    validate_sweeper(SweeperConfig(audit_sample=0))  # no audit is a choice


def test_playlist_uris_resolve_only_inside_their_revision() -> None:
    text = '#EXTM3U\n#EXT-X-MAP:URI="init.mp4"\n#EXTINF:1.0,\nseg_0.m4s\n#EXTINF:1.0,\nseg_0.m4s\n'
    assert playlist_uris(text) == ["init.mp4", "seg_0.m4s"]
    media = "assets/t/a/rev/2/hls/240p/index.m3u8"
    assert resolve_uri(media, "seg_0.m4s?x=1") == "assets/t/a/rev/2/hls/240p/seg_0.m4s"
    assert resolve_uri("assets/t/a/rev/2/hls/master.m3u8", "240p/index.m3u8") == media
    for outside in ("../../../rev/1/hls/x.m4s", "https://cdn.example/x.m4s", "/abs.m4s"):
        assert resolve_uri(media, outside) is None


# -- the command ----------------------------------------------------------------------------------


def test_sweep_dry_run_json_prints_findings_and_changes_nothing(
    config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = msgspec.structs.replace(
        config, storage=msgspec.structs.replace(config.storage, url=f"file://{tmp_path}/o")
    )
    stray = f"assets/{keys.tenant_hash(1)}/{uuid.uuid4()}/rev/1/seg.m4s"

    async def setup() -> str:
        async with (
            open_pool(config.database, min_size=1, max_size=2) as pool,
            open_object_store(config.storage) as store,
        ):
            tenant = await pool.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
            asset_id = await add_asset(pool, tenant, "DELETED")
            key = f"{keys.revision_prefix(tenant, asset_id, 1)}/seg.m4s"
            await store.put_bytes(key, b"x")
            await store.put_bytes(stray, b"x")  # an asset the database does not know: kept
        for name in (key, stray):
            age(tmp_path / "o", name, 3 * 24 * 3600.0)  # past the default grace (24 h)
        return key

    key = anyio.run(setup, backend="asyncio")
    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub, common)
    args = parser.parse_args(["sweep", "--dry-run", "--json"])
    assert args.fn(config, args) == 0
    # The report is the last line (unconfigured structlog prints its events to stdout too).
    document = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert document["dry_run"] is True and document["outcome"] == "swept"
    assert [(f["subject"], f["action"]) for f in document["orphan_objects"]] == [
        (key, "would_delete")
    ]
    assert document["counts"]["orphan_objects_unattributed"] == 1
    assert (tmp_path / "o" / key).exists() and (tmp_path / "o" / stray).exists()
    text = parser.parse_args(["sweep", "--dry-run"])
    assert text.fn(config, text) == 0
    out = capsys.readouterr().out.splitlines()
    assert "sweep (dry run): swept" in out
    assert ["orphan_objects", "1"] in [line.split() for line in out]
    findings = out.index(next(line for line in out if line.split()[:2] == ["scan", "action"]))
    assert ["orphan_objects", "would_delete", key] in [line.split()[:3] for line in out[findings:]]


async def test_upload_sessions_keep_their_bytes_until_they_expire_then_are_reaped(
    rig: Rig,
) -> None:

    from aivedio.store.uploads import create_session, source_key

    root = root_of(rig.config)
    now = datetime.now(UTC)
    keys_of: dict[str, str] = {}
    for name, expires_in in (("live", 3600), ("expired", -60)):
        video = uuid.uuid4()
        key = source_key(rig.tenant_id, video)
        await create_session(
            rig.pool,
            video_id=video,
            tenant_id=rig.tenant_id,
            method="API_PUT",
            content_type="video/mp4",
            filename=None,
            size_bytes=4,
            sha256="0" * 64,
            expires_at=now + timedelta(seconds=expires_in),
            object_key=key,
        )
        await rig.store.put_bytes(key, b"half")
        age(root, key, OLD)  # past the orphan grace period: only the session protects it
        keys_of[name] = key
    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    assert await exists(rig.store, keys_of["live"])
    assert not await exists(rig.store, keys_of["expired"])
    assert [f.action for f in report.expired_uploads] == ["expired_and_cleaned"]
    statuses = await rig.pool.fetch("SELECT status FROM upload_sessions ORDER BY expires_at")
    assert [r["status"] for r in statuses] == ["EXPIRED", "AWAITING_UPLOAD"]


async def test_an_upload_a_live_job_owns_is_never_aborted_whatever_its_reported_age(
    rig: Rig, s3_endpoint: str
) -> None:
    """moto reports every multipart upload as started in 2010, as a store with a skewed
    clock might (the sweep's clock is moved past the stale age for engines that tell the
    truth): the stale-upload scan must still leave a running fetch's upload alone."""
    from tests.support.s3_server import s3_config

    storage = s3_config(s3_endpoint, f"stale-{uuid.uuid4().hex[:8]}")
    async with open_object_store(storage, part_size_bytes=5 << 20) as store:
        output = str(uuid.uuid4())
        owned = await store.start_upload(f"quarantine/t/{output}/7/source.bin")
        orphan = await store.start_upload(f"quarantine/t/{uuid.uuid4()}/8/source.bin")
        for upload in (owned, orphan):  # past one part: the multipart upload exists
            await upload.write(b"x" * ((5 << 20) + 1))
        spec = JobSpec(
            kind="fetch",
            lane="fetch",
            idempotency_key=f"fetch:{output}:v1",
            tenant_id=rig.tenant_id,
            payload={"provider_output_id": output},
            max_attempts=3,
            timeout_seconds=60,
        )
        async with rig.pool.acquire() as conn:
            await Queue(rig.pool).enqueue_one(conn, spec)
        later = datetime.now(UTC) + timedelta(seconds=OLD)
        async with open_sweeper(rig.config, rig.pool, store, sweeper=CFG, clock=lambda: later) as s:
            report = await s.sweep(dry_run=False)
        assert [f.subject for f in report.stale_uploads] == [orphan.key]
        assert [u.key for u in await store.list_multipart_uploads()] == [owned.key]
        await owned.abort()
        await orphan.abort()


class _Unanswering:
    """The rig's store, but reads of ``failing`` (a method name) raise ``error``."""

    def __init__(self, store: ObjectStore, failing: str, error: Exception) -> None:
        self._store, self._failing, self._error = store, failing, error

    def __getattr__(self, name: str) -> Any:
        if name == self._failing:

            async def refuse(*args: Any, **kwargs: Any) -> Any:
                raise self._error

            return refuse
        return getattr(self._store, name)


@pytest.mark.parametrize("failing", ["get_bytes", "sizes"])
async def test_a_store_that_cannot_answer_is_no_integrity_failure(
    rig: Rig, source: bytes, failing: str
) -> None:
    """Seen in a chaos run: the audit met the S3 outage while reading a master playlist,
    took "unreadable: transient" for a broken revision and rebuilt a whole one."""
    asset_id = await publish_with_hls(rig, source)
    outage = _Unanswering(rig.store, failing, TransientError("s3: connection refused"))
    async with open_sweeper(rig.config, rig.pool, outage, sweeper=CFG) as s:  # type: ignore[arg-type]
        report = await s.sweep(dry_run=False)
    assert report.integrity == []
    assert report.counts["revisions_inconclusive"] == 1
    assert report.errors == [], report.errors
    assert [e for e in await rig.events(asset_id) if e["event_type"] == INTEGRITY_EVENT] == []
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'reprocess'") == 0
    # A refusal no retry will fix is a verdict on the object, as before.
    refused = _Unanswering(rig.store, "get_bytes", ObjectStoreError("s3: 403 AccessDenied"))
    async with open_sweeper(rig.config, rig.pool, refused, sweeper=CFG) as s:  # type: ignore[arg-type]
        report = await s.sweep(dry_run=False)
    (finding,) = report.integrity
    assert finding.action == "alerted_and_rebuild"
    assert any(p["problem"] == "unreadable: object_store" for p in finding.data["problems"])


async def test_a_broken_revision_whose_source_cannot_be_checked_now_waits_for_the_next_pass(
    rig: Rig, source: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real problem, but the HEAD of the source (which decides the rebuild) meets an
    outage: nothing is alerted or rebuilt this pass, the next one does both."""
    asset_id, lost = await publish_then_lose_a_segment(rig, source, monkeypatch)
    outage = _Unanswering(rig.store, "head", TransientError("s3: connection refused"))
    async with open_sweeper(rig.config, rig.pool, outage, sweeper=CFG) as s:  # type: ignore[arg-type]
        report = await s.sweep(dry_run=False)
    assert report.integrity == [] and report.errors == []
    assert report.counts["revisions_inconclusive"] == 1
    assert [e for e in await rig.events(asset_id) if e["event_type"] == INTEGRITY_EVENT] == []
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'reprocess'") == 0
    async with sweeper(rig) as s:
        report = await s.sweep(dry_run=False)
    (finding,) = report.integrity
    assert finding.action == "alerted_and_rebuild"
    assert {"key": lost, "problem": "missing"} in finding.data["problems"]
