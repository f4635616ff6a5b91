"""Each vendor adapter against its simulator on loopback HTTPS, with the API and a worker.

``open_vendor`` starts the vendor's simulator (``aivedio.sim.vendors``) under the name
``api.vendor.test`` (a second name, ``cdn.vendor.test``, serves cross-host redirects), a
``[providers.<vendor>]`` section for its adapter, the API (``tests/support/api_rig.py``) and, on
demand, a worker with the fetch stage and the poller.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec

from aivedio.config.load import Config, NetConfig, ProviderConfig
from aivedio.pipeline.services import make_fetcher, open_fetch_stage
from aivedio.providers import build_adapter
from aivedio.sim.vendors import SIMS, VendorSim
from aivedio.sim.vendors.fal import APP_ID
from aivedio.sim.vendors.kling import ACCESS_KEY
from aivedio.store.database import Pool
from aivedio.store.queue import Queue
from aivedio.worker.daemon import Worker
from aivedio.worker.kinds import default_registry
from tests.support.api_rig import Api, open_api

API_HOST = "api.vendor.test"
CDN_HOST = "cdn.vendor.test"
API_KEY = "sk-sim-0123456789abcdef-secret"
VENDORS = sorted(SIMS)
MULTI_OUTPUT = {"runway", "veo_gemini", "veo_vertex", "replicate", "fal", "kling", "openrouter"}
REGISTRY = default_registry()


def provider_config(vendor: str, sim: VendorSim, **overrides: Any) -> ProviderConfig:
    settings: dict[str, Any] = {
        "adapter": vendor,
        "api_base_url": sim.base_url,
        "tenant": "acme",
        "api_key": API_KEY,
        "poll_interval_seconds": 0.1,
        "poll_jitter_seconds": 0.02,
        "poll_requests_per_second": 100.0,
    }
    if vendor == "kling":
        settings.update(access_key=ACCESS_KEY, secret_key=API_KEY, api_key="")
    if vendor in ("veo_gemini", "veo_vertex"):
        settings["download_base_url"] = sim.base_url
    if vendor == "fal":
        settings.update(app_id=APP_ID, jwks_url=f"{sim.base_url}/.well-known/jwks.json")
    webhook_secret = getattr(sim, "webhook_secret", "")
    if webhook_secret:
        settings["webhook_secret"] = webhook_secret
    dynamic_secret = getattr(sim, "dynamic_webhook_secret", "")
    if dynamic_secret:  # Gemini: a per-request webhook's own secret
        settings["extra_webhook_secrets"] = [dynamic_secret]
    settings.update(overrides)
    return ProviderConfig(**settings)


@dataclass
class VendorRig:
    vendor: str
    sim: VendorSim
    api: Api
    pool: Pool

    @property
    def config(self) -> Config:
        return self.api.rig.config

    def task_id(self, name: str) -> str:
        """The id the vendor gives a task (Google's are operation names)."""
        namer = getattr(self.sim, "operation_name", None)
        return str(namer(name)) if namer else name

    async def watch(self, task_id: str, *, expect: int = 201) -> dict[str, Any]:
        body = {"provider": self.vendor, "task_id": task_id}
        answer: dict[str, Any] = await self.api.json(
            "POST", "/v1/generation-tasks", json=body, expect=expect
        )
        return answer

    async def callback(self, headers: dict[str, str], body: bytes, expect: int) -> Any:
        url = f"{self.api.base}/v1/providers/{self.vendor}/callbacks"
        async with self.api.http.post(url, data=body, headers=headers) as resp:
            payload = await resp.read()
            assert resp.status == expect, (resp.status, payload[:400])
            return msgspec.json.decode(payload) if payload else None

    async def outputs(self) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            "SELECT o.*, a.source_object_key FROM provider_outputs o"
            " LEFT JOIN assets a ON a.source_provider_output_id = o.id"
            " ORDER BY o.provider_task_id, o.output_index"
        )
        return [dict(r.items()) for r in rows]

    async def wait_outputs(
        self, count: int, states: tuple[str, ...] = ("STORED",), timeout: float = 30
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = await self.outputs()
            if len(rows) == count and all(r["fetch_status"] in states for r in rows):
                return rows
            await anyio.sleep(0.05)
        raise AssertionError(f"outputs never reached {states}: {await self.outputs()}")

    async def record_now(self, name: str) -> None:
        """Read the task with the adapter and record its outputs, as the poller would."""
        from aivedio.pipeline.intake import record_task_outputs

        fetcher = make_fetcher(self.config.net, self.config.providers[self.vendor])
        adapter = build_adapter(self.vendor, self.config.providers[self.vendor], fetcher)
        assert adapter is not None
        try:
            task = await adapter.get_task(self.task_id(name))
        finally:
            await fetcher.aclose()
        async with self.pool.acquire() as conn, conn.transaction():
            await record_task_outputs(
                conn,
                queue=Queue(self.pool),
                cipher=self.api.ctx.cipher,
                config=self.config,
                provider=self.vendor,
                task=task,
                tenant_id=self.api.rig.tenant_id,
            )

    @asynccontextmanager
    async def worker(self) -> AsyncIterator[Worker]:
        queue = Queue(self.pool)
        async with (
            open_fetch_stage(self.config, self.pool, queue) as stage,
            anyio.create_task_group() as tg,
        ):
            w = Worker(self.config, self.pool, REGISTRY, services={"fetch": stage})
            tg.start_soon(lambda: w.run(install_signal_handlers=False))
            yield w
            w.request_drain(force=True)


@asynccontextmanager
async def open_vendor(
    vendor: str,
    config: Config,
    pool: Pool,
    tmp_path: Path,
    ca: tuple[ssl.SSLContext, Path],
    nameserver: str,
    **overrides: Any,
) -> AsyncIterator[VendorRig]:
    server_ctx, pem = ca
    sim = SIMS[vendor](ssl_context=server_ctx, public_host=API_HOST, api_key=API_KEY)
    if vendor == "kling":
        sim.api_key = API_KEY  # the JWT's HMAC key
    await sim.start()
    try:
        net = NetConfig(
            allowed_ports=[sim.port],
            allow_cidrs=["127.0.0.0/8"],
            nameservers=[nameserver],
            ca_file=str(pem),
            max_bytes=16 << 20,
            idle_read_timeout_seconds=5,
        )
        cfg = msgspec.structs.replace(
            config,
            net=net,
            providers={vendor: provider_config(vendor, sim, **overrides)},
        )
        async with open_api(cfg, pool, tmp_path) as api:
            yield VendorRig(vendor, sim, api, pool)
    finally:
        await sim.aclose()
