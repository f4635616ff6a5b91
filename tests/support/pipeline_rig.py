"""A worker with the media, moderation and publish stages over real PostgreSQL, the local
object store and real ffmpeg, for tests that follow an asset from quarantine to READY."""

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

from aivedio.config.load import Config
from aivedio.config.media import MediaConfig, RungConfig
from aivedio.config.moderation import LocalModerationConfig, ModerationConfig
from aivedio.pipeline.jobs import Registry
from aivedio.pipeline.media.signing import Signing
from aivedio.pipeline.media_stage import open_media_stage
from aivedio.pipeline.moderation import open_moderation_stage
from aivedio.pipeline.publish import PublishStage
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.objects.base import ObjectStore
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Job, Queue
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry

REGISTRY = default_registry()
SMALL_LADDER = [RungConfig(height=240), RungConfig(height=180)]


def rig_config(config: Config, tmp_path: Path, **moderation: Any) -> Config:
    media = MediaConfig(ladder=SMALL_LADDER, segment_seconds=1.0, scratch_dir=str(tmp_path / "s"))
    settings: dict[str, Any] = {
        "backend": "local",
        "local": LocalModerationConfig(allow_all=True),
        "unavailable_retry_seconds": 0.3,
        "attempts": 1,
    }
    settings.update(moderation)
    return msgspec.structs.replace(
        config,
        media=media,
        moderation=ModerationConfig(**settings),
        storage=msgspec.structs.replace(config.storage, url=f"file://{tmp_path}/objects"),
        queue=msgspec.structs.replace(
            config.queue, backoff_base_seconds=0.05, backoff_max_seconds=0.2
        ),
    )


def without_fast_path(config: Config) -> Config:
    """The queue path alone: the probe's render, moderate and publish jobs each in turn
    (``[media] fast_path = false``), for tests of what happens between those jobs."""
    return msgspec.structs.replace(
        config, media=msgspec.structs.replace(config.media, fast_path=False)
    )


@dataclass
class Rig:
    config: Config
    pool: Pool
    store: ObjectStore
    tenant_id: int

    async def quarantine(
        self, body: bytes, *, task: tuple[str, str] | None = None, sha256: str | None = None
    ) -> uuid.UUID:
        """An asset in quarantine, as the fetch or upload stage leaves it; with ``task``
        (provider, task id) it comes from a provider output of that generation task;
        ``sha256`` records another checksum than the body's (a source changed in quarantine)."""
        asset_id = uuid.uuid4()
        key = f"quarantine/{keys.tenant_hash(self.tenant_id)}/{asset_id}/source.bin"
        await self.store.put_bytes(key, body)
        output_id = None
        if task is not None:
            output_id = await self.provider_output(*task)
        await self.pool.execute(
            "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id, status,"
            " source_object_key, source_size_bytes, source_sha256)"
            " VALUES ($1, $2, $3, $4, 'QUARANTINED', $5, $6, $7)",
            asset_id,
            self.tenant_id,
            "PROVIDER_OUTPUT" if output_id else "UPLOAD",
            output_id,
            key,
            len(body),
            sha256 or hashlib.sha256(body).hexdigest(),
        )
        return asset_id

    async def provider_output(self, provider: str, task_id: str) -> uuid.UUID:
        task = uuid.uuid4()
        output = uuid.uuid4()
        await self.pool.execute(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status) VALUES ($1, $2, $3, $4, 'PROVIDER_SUCCEEDED')",
            task,
            self.tenant_id,
            provider,
            task_id,
        )
        await self.pool.execute(
            "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
            " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
            " fetch_status) VALUES ($1, $2, $3, $4, $5, 0, '\\x00', 'k1', 'STORED')",
            output,
            self.tenant_id,
            task,
            provider,
            task_id,
        )
        return output

    async def enqueue_probe(self, asset_id: uuid.UUID) -> int:
        spec = REGISTRY.spec(
            "probe",
            f"probe:{asset_id}:v1",
            tenant_id=self.tenant_id,
            payload={"asset_id": str(asset_id)},
        )
        async with self.pool.acquire() as conn:
            return (await Queue(self.pool).enqueue_one(conn, spec)).job_id

    async def claimed_probe(self, asset_id: uuid.UUID) -> Job:
        """The asset's probe job, enqueued and claimed with a real lease: the probe's writes
        are fenced by it (a made-up job holds no lease)."""
        job_id = await self.enqueue_probe(asset_id)
        (job,) = await Queue(self.pool).claim("media", 1, "test", 600)
        assert job.id == job_id, (job.id, job_id)
        return job

    async def asset(self, asset_id: uuid.UUID) -> dict[str, Any]:
        row = await self.pool.fetchrow("SELECT * FROM assets WHERE id = $1", asset_id)
        assert row is not None
        return dict(row.items())

    async def variants(self, asset_id: uuid.UUID) -> dict[str, dict[str, Any]]:
        rows = await self.pool.fetch("SELECT * FROM asset_variants WHERE asset_id = $1", asset_id)
        return {r["variant_type"]: dict(r.items()) for r in rows}

    async def revisions(self, asset_id: uuid.UUID) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            "SELECT * FROM asset_revisions WHERE asset_id = $1 ORDER BY revision", asset_id
        )
        return [dict(r.items()) for r in rows]

    async def events(self, asset_id: uuid.UUID) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            "SELECT event_type, payload FROM outbox_events WHERE aggregate_id = $1 ORDER BY id",
            asset_id,
        )
        return [dict(r.items()) for r in rows]

    async def wait(self, sql: str, *args: object, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.pool.fetchval(sql, *args)
            if value:
                return value
            await anyio.sleep(0.1)
        raise AssertionError(f"timed out waiting for: {sql} {args}")

    async def due_now(self, kind: str) -> None:
        """Jobs of ``kind`` that a worker without it handed back are claimable at once: the
        30 s a rolling deploy waits for a worker that knows the kind is not the test's."""
        await self.pool.execute(
            "UPDATE jobs SET status = 'queued', lease_owner = NULL, lease_until = NULL,"
            " run_after = now() WHERE kind = $1 AND status <> 'running'",
            kind,
        )

    async def wait_idle(self, asset_id: uuid.UUID, timeout: float = 90) -> None:
        """Until no job for this asset is left in the live queue."""
        await self.wait(
            "SELECT count(*) = 0 FROM jobs WHERE payload->>'asset_id' = $1",
            str(asset_id),
            timeout=timeout,
        )


@asynccontextmanager
async def make_rig(
    config: Config, pool: Pool, tmp_path: Path, **moderation: Any
) -> AsyncIterator[Rig]:
    cfg = rig_config(config, tmp_path, **moderation)
    tenant_id = await pool.fetchval("INSERT INTO tenants (name) VALUES ('acme') RETURNING id")
    async with open_object_store(cfg.storage) as store:
        yield Rig(cfg, pool, store, tenant_id)


def registry_without(*kinds: str) -> Registry:
    """The default kinds minus ``kinds``: jobs of those wait (unknown kind, attempts kept)."""
    registry = Registry()
    for kind in REGISTRY:
        if kind.name not in kinds:
            registry.bind(kind.contract, kind.handler)
    return registry


@asynccontextmanager
async def running_worker(
    rig: Rig, registry: Registry | None = None, signing: Signing | None = None
) -> AsyncIterator[Worker]:
    """A worker with the media, moderation and publish stages; ``signing``: the media
    stage signs its outputs with it."""
    queue = Queue(rig.pool)
    async with (
        open_media_stage(rig.config, rig.pool, queue, rig.store, signing) as media,
        open_moderation_stage(rig.config, rig.pool, queue, rig.store) as moderation,
        anyio.create_task_group() as tg,
    ):
        registry = registry or REGISTRY
        services: dict[str, object] = {"media": media, "moderation": moderation}
        if "publish" in {kind.name for kind in registry}:
            # A worker that runs publish jobs also publishes in the job that opens the last
            # gate; one without them leaves every publish to a publish job.
            services["publish"] = PublishStage(rig.config, rig.pool, queue, rig.store)
        w = Worker(rig.config, rig.pool, registry, services=services, queue=queue)
        tg.start_soon(lambda: w.run(install_signal_handlers=False))
        yield w
        w.request_drain(force=True)


def fake_job(
    payload: dict[str, Any], kind: str, *, job_id: int = 1, token: int = 1, attempts: int = 1
) -> Job:
    return Job(
        id=job_id,
        kind=kind,
        lane="control",
        tenant_id=1,
        payload=payload,
        attempts=attempts,
        max_attempts=8,
        lease_token=token,
        timeout_seconds=600,
        expires_at=None,
        idempotency_key="test",
        created_at=datetime.now(UTC),
    )
