"""The API served for real on loopback, over real PostgreSQL and a real object store.

``open_api`` builds the same ``ApiContext`` that ``aivedio api`` builds and serves it with
``run_app`` on an ephemeral port; tests talk to it over HTTP with aiohttp. ``publish`` runs
the real worker stages (tests/support/pipeline_rig.py) on a small generated clip, so playback tests
play what the pipeline really produced.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec

from aivedio.api.app import run_app
from aivedio.api.context import ApiContext
from aivedio.api.tokens import TokenSigner, signer_from
from aivedio.config.load import Config, StorageConfig
from aivedio.config.media import AV1Config
from aivedio.pipeline.services import url_cipher
from aivedio.store.api_keys import create_key
from aivedio.store.database import Pool
from aivedio.store.objects import keys
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Queue
from tests.support.pipeline_rig import Rig, rig_config, running_worker

TOKEN_KEY = b"p" * 32
PLAYLIST = b"#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-STREAM-INF:BANDWIDTH=1000\nv0/index.m3u8\n"
SEGMENT = bytes(range(256)) * 4  # 1024 bytes


@dataclass
class Api:
    rig: Rig
    ctx: ApiContext
    base: str
    http: aiohttp.ClientSession
    key: str  # an API key of rig.tenant_id ("acme")

    async def tenant(self, name: str) -> tuple[int, str]:
        """Another tenant and an API key for it."""
        tenant_id = int(
            await self.rig.pool.fetchval(
                "INSERT INTO tenants (name) VALUES ($1) RETURNING id", name
            )
        )
        async with self.rig.pool.acquire() as conn:
            created = await create_key(conn, tenant_id)
        return tenant_id, created.key

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    async def json(
        self, method: str, path: str, *, key: str | None = None, expect: int = 200, **kw: Any
    ) -> Any:
        """Call with the API key; assert the status; the decoded JSON body (None if empty)."""
        headers = {**self.auth(key), **kw.pop("headers", {})}
        async with self.http.request(method, self.base + path, headers=headers, **kw) as resp:
            body = await resp.read()
            assert resp.status == expect, (resp.status, body[:500])
            return msgspec.json.decode(body) if body else None

    async def publish(self, clip: Path, *, timeout: float = 90) -> uuid.UUID:
        """Run the real pipeline on ``clip`` (an upload in quarantine) until it is PLAYABLE."""
        asset_id = await self.rig.quarantine(clip.read_bytes())
        await self.rig.enqueue_probe(asset_id)
        async with running_worker(self.rig):
            await self.wait_state(asset_id, ("PLAYABLE", "ENRICHED"), timeout=timeout)
            await self.rig.wait_idle(asset_id, timeout=timeout)
        return asset_id

    async def wait_state(
        self, asset_id: uuid.UUID, states: tuple[str, ...], *, timeout: float = 90
    ) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = await self.rig.pool.fetchval(
                "SELECT status FROM assets WHERE id = $1", asset_id
            )
            if state in states:
                return str(state)
            await anyio.sleep(0.1)
        raise AssertionError(f"asset {asset_id} never reached {states}")


@asynccontextmanager
async def open_api(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    *,
    storage: StorageConfig | None = None,
    av1: AV1Config | None = None,
    **api: Any,
) -> AsyncIterator[Api]:
    """Serve the API on 127.0.0.1; ``api`` overrides [api] settings, ``av1`` the
    [media.av1] ones."""
    cfg = rig_config(config, tmp_path)
    if av1 is not None:
        cfg = msgspec.structs.replace(cfg, media=msgspec.structs.replace(cfg.media, av1=av1))
    if storage is not None:
        cfg = msgspec.structs.replace(cfg, storage=storage)
    cfg = msgspec.structs.replace(cfg, api=msgspec.structs.replace(cfg.api, **api))
    tenant_id = int(await pool.fetchval("INSERT INTO tenants (name) VALUES ('acme') RETURNING id"))
    async with pool.acquire() as conn:
        key = (await create_key(conn, tenant_id)).key
    async with (
        open_object_store(cfg.storage) as store,
        aiohttp.ClientSession() as http,
        anyio.create_task_group() as tg,
    ):
        ctx = ApiContext(
            config=cfg,
            pool=pool,
            store=store,
            queue=Queue(pool),
            cipher=url_cipher(cfg),
            # [[api.playback_keys]] when a test lists them, else the one HS256 key.
            signer=signer_from(cfg.api) if cfg.api.playback_keys else TokenSigner.hs256(TOKEN_KEY),
        )
        port = await tg.start(run_app, ctx, "127.0.0.1", 0)
        yield Api(Rig(cfg, pool, store, tenant_id), ctx, f"http://127.0.0.1:{port}", http, key)
        tg.cancel_scope.cancel()


async def published(
    api: Api, *, tenant_id: int | None = None, revision: int = 1, playback: bytes = SEGMENT
) -> uuid.UUID:
    """An asset whose revision was released, with a playlist, a segment and an MP4 under
    its revision prefix (rows and objects as the publish stage leaves them). ``playback``:
    the MP4's bytes (a real video where a test decodes it)."""
    tenant = tenant_id or api.rig.tenant_id
    asset_id = uuid.uuid4()
    prefix = keys.revision_prefix(tenant, asset_id, revision)
    files = {"hls/master.m3u8": PLAYLIST, "hls/v0/seg_1.m4s": SEGMENT, "playback.mp4": playback}
    for path, body in files.items():
        await api.rig.store.put_bytes(f"{prefix}/{path}", body)
    pool = api.rig.pool
    await pool.execute(
        "INSERT INTO assets (id, tenant_id, source_type, status, current_revision,"
        " source_object_key) VALUES ($1, $2, 'UPLOAD', 'PLAYABLE', $3, 'quarantine/x')",
        asset_id,
        tenant,
        revision,
    )
    await pool.execute(
        "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status,"
        " published_outputs) VALUES ($1, $2, 1, 'READY', ARRAY['hls', 'playback'])",
        asset_id,
        revision,
    )
    for variant, path in (("hls", "hls/master.m3u8"), ("playback", "playback.mp4")):
        await pool.execute(
            "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
            " mime_type, size_bytes, checksum_alg, checksum, status)"
            " VALUES ($1, $2, $3, $4, $5, 'x', $6, 'sha256', $7, 'SUCCEEDED')",
            uuid.uuid4(),
            asset_id,
            revision,
            variant,
            f"{prefix}/{path}",
            len(files[path]),
            hashlib.sha256(files[path]).hexdigest(),
        )
    await pool.execute(
        "INSERT INTO releases (asset_id, revision, outputs) VALUES ($1, $2, ARRAY['hls'])",
        asset_id,
        revision,
    )
    return asset_id
