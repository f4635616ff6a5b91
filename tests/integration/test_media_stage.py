"""The media stage through the worker: probe job, one render job per output, variants.

Real PostgreSQL, the local object store, real ffmpeg in the sandbox.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from aivedio.config import Config
from aivedio.errors import DeferredError, RenderError
from aivedio.media_config import MediaConfig, RungConfig
from aivedio.pipeline import dag
from aivedio.pipeline.kinds import default_registry
from aivedio.pipeline.media_stage import MediaStage, open_media_stage
from aivedio.store import keys
from aivedio.store.database import Pool
from aivedio.store.objects import ObjectStore, open_object_store
from aivedio.store.queue import Job, Queue
from aivedio.worker import Worker
from tests.hls_check import check_hls
from tests.media_fixtures import MediaCache, h264_faststart, html_error_page

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()
SMALL_LADDER = [RungConfig(height=240), RungConfig(height=180)]


@pytest.fixture(scope="module")
def media_cache(tmp_path_factory: pytest.TempPathFactory) -> MediaCache:
    return MediaCache(tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def source(media_cache: MediaCache) -> Path:
    return media_cache.get("h264", h264_faststart, width=320, height=240, seconds=2)


@dataclass
class Rig:
    config: Config
    pool: Pool
    store: ObjectStore
    tenant_id: int

    async def quarantine(self, body: bytes, *, sha256: str | None = None) -> uuid.UUID:
        """An uploaded asset in quarantine, as the fetch or upload stage leaves it."""
        asset_id = uuid.uuid4()
        key = f"quarantine/{keys.tenant_hash(self.tenant_id)}/{asset_id}/source.bin"
        await self.store.put_bytes(key, body)
        await self.pool.execute(
            "INSERT INTO assets (id, tenant_id, source_type, status, source_object_key,"
            " source_size_bytes, source_sha256) VALUES ($1, $2, 'UPLOAD', 'QUARANTINED',"
            " $3, $4, $5)",
            asset_id,
            self.tenant_id,
            key,
            len(body),
            sha256 or hashlib.sha256(body).hexdigest(),
        )
        return asset_id

    async def enqueue_probe(self, asset_id: uuid.UUID) -> int:
        spec = REGISTRY.spec(
            "probe", f"probe:{asset_id}:v1", tenant_id=self.tenant_id,
            payload={"asset_id": str(asset_id)},
        )  # fmt: skip
        async with self.pool.acquire() as conn:
            return (await Queue(self.pool).enqueue_one(conn, spec)).job_id

    async def asset(self, asset_id: uuid.UUID) -> dict[str, Any]:
        row = await self.pool.fetchrow("SELECT * FROM assets WHERE id = $1", asset_id)
        assert row is not None
        return dict(row.items())

    async def variants(self, asset_id: uuid.UUID) -> dict[str, dict[str, Any]]:
        rows = await self.pool.fetch("SELECT * FROM asset_variants WHERE asset_id = $1", asset_id)
        return {r["variant_type"]: dict(r.items()) for r in rows}

    async def wait(self, predicate_sql: str, *args: object, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.pool.fetchval(predicate_sql, *args)
            if value:
                return value
            await anyio.sleep(0.1)
        raise AssertionError(f"timed out waiting for: {predicate_sql} {args}")

    async def wait_jobs_done(self, asset_id: uuid.UUID, timeout: float = 90) -> None:
        """Until no job for this asset is left in the live queue."""
        await self.wait(
            "SELECT count(*) = 0 FROM jobs WHERE payload->>'asset_id' = $1",
            str(asset_id),
            timeout=timeout,
        )


@pytest.fixture
async def rig(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Rig]:
    media = MediaConfig(ladder=SMALL_LADDER, segment_seconds=1.0, scratch_dir=str(tmp_path / "s"))
    cfg = msgspec.structs.replace(
        config,
        media=media,
        storage=msgspec.structs.replace(config.storage, url=f"file://{tmp_path}/objects"),
        queue=msgspec.structs.replace(
            config.queue, backoff_base_seconds=0.05, backoff_max_seconds=0.2
        ),
    )
    tenant_id = await pool.fetchval("INSERT INTO tenants (name) VALUES ('acme') RETURNING id")
    async with open_object_store(cfg.storage) as store:
        yield Rig(cfg, pool, store, tenant_id)


@asynccontextmanager
async def running_worker(rig: Rig) -> AsyncIterator[Worker]:
    queue = Queue(rig.pool)
    async with (
        open_media_stage(rig.config, rig.pool, queue, rig.store) as stage,
        anyio.create_task_group() as tg,
    ):
        w = Worker(rig.config, rig.pool, REGISTRY, services={"media": stage})
        tg.start_soon(lambda: w.run(install_signal_handlers=False))
        yield w
        w.request_drain(force=True)


async def download_prefix(store: ObjectStore, prefix: str, target: Path) -> list[str]:
    names = []
    async for info in store.list(prefix + "/"):
        name = info.key[len(prefix) + 1 :]
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join([c async for c in store.get(info.key)]))
        names.append(name)
    return names


async def test_a_valid_source_is_probed_planned_and_every_output_rendered(
    rig: Rig, source: Path, tmp_path: Path
) -> None:
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_jobs_done(asset_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING"
    assert (asset["width"], asset["height"], asset["video_codec"]) == (320, 240, "h264")
    assert asset["probe"]["verdict"] == "valid"
    revision = await rig.pool.fetchrow(
        "SELECT * FROM asset_revisions WHERE asset_id = $1", asset_id
    )
    assert revision["revision"] == 1 and revision["status"] == "BUILDING"
    assert revision["plan"]["mode"] == "remux"
    assert revision["required_outputs"] == ["playback", "poster"]
    variants = await rig.variants(asset_id)
    assert set(variants) == {"playback", "poster", "hls", "proxy", "sprite", "waveform",
                             "keyframes"}  # fmt: skip
    prefix = keys.revision_prefix(rig.tenant_id, asset_id, 1)
    for name, variant in variants.items():
        assert variant["status"] == "SUCCEEDED", name
        assert variant["object_key"].startswith(prefix + "/")
        body = await rig.store.get_bytes(variant["object_key"])
        assert len(body) == variant["size_bytes"]
        assert hashlib.sha256(body).hexdigest() == variant["checksum"]
        for file in variant["extra"]["files"]:
            info = await rig.store.head(f"{prefix}/{file['path']}")
            assert info is not None and info.size == file["size"]
    assert variants["playback"]["mime_type"] == "video/mp4"
    assert variants["hls"]["object_key"] == f"{prefix}/hls/master.m3u8"
    # What landed in the store is a complete, aligned, decodable ladder.
    local = tmp_path / "downloaded"
    names = await download_prefix(rig.store, prefix, local)
    assert "playback.mp4" in names
    assert check_hls(local / "hls" / "master.m3u8") == []
    # This worker runs the media stage only: the moderation job it enqueues is not its own.
    history = await rig.pool.fetch(
        "SELECT kind, status, result FROM job_history WHERE payload->>'asset_id' = $1"
        " AND kind IN ('probe', 'render')",
        str(asset_id),
    )
    assert sorted(h["kind"] for h in history) == ["probe"] + ["render"] * 7
    assert all(h["status"] == "succeeded" for h in history)
    # One render job made everything in one run; the others found their output done.
    rendered = [h["result"] for h in history if h["result"].get("outcome") == "rendered"]
    assert len(rendered) == 1 and len(rendered[0]["done"]) == 7
    # Whether ffmpeg had a network namespace is recorded in the job results either way.
    probe_result = next(h["result"] for h in history if h["kind"] == "probe")
    assert isinstance(probe_result["network_isolated"], bool)
    assert rendered[0]["network_isolated"] == probe_result["network_isolated"]


async def test_invalid_media_ends_the_asset_and_is_never_retried(
    rig: Rig, media_cache: MediaCache
) -> None:
    html = media_cache.get("html", html_error_page).read_bytes()
    asset_id = await rig.quarantine(html)
    job_id = await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM job_history WHERE id = $1", job_id)
    asset = await rig.asset(asset_id)
    assert asset["status"] == "INVALID_MEDIA"
    assert asset["last_error_class"] == "invalid_media"
    assert asset["probe"]["reasons"] == ["unsupported_container:html"]
    job = await rig.pool.fetchrow("SELECT * FROM job_history WHERE id = $1", job_id)
    assert job["attempts"] == 1 and job["status"] == "succeeded"
    assert await rig.pool.fetchval("SELECT count(*) FROM asset_revisions") == 0


async def test_a_source_that_changed_in_quarantine_is_not_processed(rig: Rig, source: Path) -> None:
    asset_id = await rig.quarantine(source.read_bytes(), sha256="0" * 64)
    job_id = await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait("SELECT 1 FROM job_history WHERE id = $1", job_id)
    job = await rig.pool.fetchrow("SELECT * FROM job_history WHERE id = $1", job_id)
    assert job["status"] == "dead"
    assert job["last_error_class"] == "checksum_mismatch"
    # Out of retries, the asset does not wait in PROBING: it failed, and says why.
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING_FAILED"
    assert asset["last_error_class"] == "checksum_mismatch"


async def test_a_failing_optional_output_never_blocks_the_required_set(
    rig: Rig, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RenderError("sprite sheet could not be verified")

    monkeypatch.setattr(dag.MediaRun, "_finalize_sprite", broken)
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_jobs_done(asset_id)
    variants = await rig.variants(asset_id)
    assert variants["sprite"]["status"] == "FAILED"
    assert "could not be verified" in variants["sprite"]["extra"]["error"]
    assert {n: v["status"] for n, v in variants.items() if n != "sprite"} == dict.fromkeys(
        ["playback", "poster", "hls", "proxy", "waveform", "keyframes"], "SUCCEEDED"
    )
    revision = await rig.pool.fetchrow("SELECT status FROM asset_revisions")
    assert revision["status"] == "BUILDING"  # the required set is complete: publishable
    assert (await rig.asset(asset_id))["status"] == "PROCESSING"
    sprite_job = await rig.pool.fetchrow(
        "SELECT * FROM job_history WHERE payload->>'variant_type' = 'sprite'"
    )
    # Retried alone a few times (render failures are LIMITED), then dead and FAILED.
    assert sprite_job["status"] == "dead" and sprite_job["attempts"] == 3
    assert sprite_job["last_error_class"] == "render_failed"


async def test_a_failing_required_output_fails_the_revision_and_the_asset(
    rig: Rig, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = dag.MediaRun._finalize

    async def finalize(self: dag.MediaRun, node: str, *args: Any) -> Any:
        if node == "poster":
            raise RenderError("poster is not a JPEG")
        return await original(self, node, *args)

    monkeypatch.setattr(dag.MediaRun, "_finalize", finalize)
    asset_id = await rig.quarantine(source.read_bytes())
    await rig.enqueue_probe(asset_id)
    async with running_worker(rig):
        await rig.wait_jobs_done(asset_id)
    variants = await rig.variants(asset_id)
    assert variants["poster"]["status"] == "FAILED"
    assert variants["playback"]["status"] == "SUCCEEDED"
    revision = await rig.pool.fetchrow("SELECT status FROM asset_revisions")
    assert revision["status"] == "FAILED"
    asset = await rig.asset(asset_id)
    assert asset["status"] == "PROCESSING_FAILED"
    assert asset["last_error_class"] == "render_failed"


def _job(payload: dict[str, Any], kind: str = "render", attempts: int = 1) -> Job:
    return Job(
        id=1, kind=kind, lane="media", tenant_id=1, payload=payload, attempts=attempts,
        max_attempts=4, lease_token=1, timeout_seconds=600, expires_at=None,
        idempotency_key="test", created_at=datetime.now(UTC),
    )  # fmt: skip


async def test_a_render_defers_while_another_holds_the_revision(rig: Rig, source: Path) -> None:
    asset_id = await rig.quarantine(source.read_bytes())
    async with open_media_stage(rig.config, rig.pool, Queue(rig.pool), rig.store) as stage:
        assert isinstance(stage, MediaStage)
        result = await stage.probe(_job({"asset_id": str(asset_id)}, kind="probe"))
        assert result["outcome"] == "processing"
        # A second run of the probe job (at-least-once delivery) changes nothing.
        again = await stage.probe(_job({"asset_id": str(asset_id)}, kind="probe"))
        assert again == {"outcome": "already_probed", "status": "PROCESSING"}
        assert await rig.pool.fetchval("SELECT count(*) FROM asset_revisions") == 1
        payload = {"asset_id": str(asset_id), "revision": 1, "variant_type": "playback"}
        async with stage._revision_lock(asset_id, 1) as held:
            assert held
            with pytest.raises(DeferredError):
                await stage.render(_job(payload))
        result = await stage.render(_job(payload))
        assert result["outcome"] == "rendered"
        # Delivered again after success: nothing is rendered twice.
        assert (await stage.render(_job(payload)))["outcome"] == "already_succeeded"
