"""Registering a watched task: ``POST /v1/generation-tasks`` and ``aivedio watch``.

Idempotent per (provider, task id); the tenant is the API key's (or ``--tenant``); another
tenant's task is refused; a provider without an API to poll is refused.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from aivedio.config.load import Config, ProviderConfig
from aivedio.store.database import Pool
from tests.conftest import TEST_KEY
from tests.support.api_rig import open_api

pytestmark = pytest.mark.anyio

PROVIDERS = {
    "runway": ProviderConfig(adapter="runway", api_key="sk-never-used"),
    "plain": ProviderConfig(callback_secret="s"),  # generic, no API to ask
    "gemini": ProviderConfig(adapter="veo_gemini", api_key="sk-never-used"),
    "vertex": ProviderConfig(adapter="veo_vertex", api_key="sk-never-used"),
    # acme's own account: its tasks and its key are acme's alone.
    "acme_luma": ProviderConfig(adapter="luma", api_key="sk-never-used", tenant="acme"),
}


async def test_the_api_registers_once_per_task_and_keeps_tenants_apart(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    cfg = msgspec.structs.replace(config, providers=PROVIDERS)
    async with open_api(cfg, pool, tmp_path) as api:
        body = {"provider": "runway", "task_id": "task-1"}
        first = await api.json("POST", "/v1/generation-tasks", json=body, expect=201)
        again = await api.json("POST", "/v1/generation-tasks", json=body, expect=200)
        assert again == first | {"created": False}
        assert first["watch_status"] == "WATCHING"
        _other, other_key = await api.tenant("globex")
        await api.json("POST", "/v1/generation-tasks", json=body, key=other_key, expect=409)
        for wrong in (
            {"provider": "plain", "task_id": "t"},
            {"provider": "nobody", "task_id": "t"},
        ):
            await api.json("POST", "/v1/generation-tasks", json=wrong, expect=422)
        await api.json("POST", "/v1/generation-tasks", json={"provider": "runway"}, expect=400)
        await api.json(
            "POST", "/v1/generation-tasks", json=body, headers={"Authorization": ""}, expect=401
        )
        jobs = await pool.fetch("SELECT kind, lane, payload FROM jobs")
        assert [(j["kind"], j["lane"]) for j in jobs] == [("provider.poll", "control")]
        assert jobs[0]["payload"] == {"generation_task_id": first["generation_task_id"]}
        # A watch that gave up is registered again: a new round with its own poll job.
        await pool.execute("UPDATE task_watches SET status = 'GAVE_UP'")
        await pool.execute("DELETE FROM jobs")
        revived = await api.json("POST", "/v1/generation-tasks", json=body, expect=200)
        assert revived["watch_status"] == "WATCHING"
        keys = await pool.fetch("SELECT idempotency_key FROM jobs")
        assert [k["idempotency_key"] for k in keys] == [f"poll:{first['generation_task_id']}:r2"]
        task = await pool.fetchrow("SELECT tenant_id, provider_status, watch FROM generation_tasks")
        assert task is not None
        assert (task["tenant_id"], task["provider_status"], task["watch"]) == (
            api.rig.tenant_id,
            "SUBMITTED",
            True,
        )


async def test_aivedio_watch_registers_once(database: str, pool: Pool, tmp_path: Path) -> None:
    await pool.execute("INSERT INTO tenants (name) VALUES ('acme')")
    path = tmp_path / "aivedio.toml"
    path.write_text('[providers.runway]\nadapter = "runway"\napi_key = "sk-never-used"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(AIVEDIO_DATABASE_URL=database, AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY)
    argv = [
        sys.executable,
        "-m",
        "aivedio",
        "watch",
        "--config",
        str(path),
        "--provider",
        "runway",
        "--task-id",
        "T-9",
        "--tenant",
        "acme",
    ]
    outputs = []
    for _ in range(2):
        with anyio.fail_after(60):
            proc = await anyio.run_process(argv, check=False, env=env)
        assert proc.returncode == 0, proc.stderr.decode()
        outputs.append(msgspec.json.decode(proc.stdout.splitlines()[-1]))
    assert [o["created"] for o in outputs] == [True, False]
    assert outputs[0]["generation_task_id"] == outputs[1]["generation_task_id"]
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE kind = 'provider.poll'") == 1
    assert "sk-never-used" not in proc.stdout.decode() + proc.stderr.decode()


async def test_a_task_id_that_would_leave_the_tasks_url_is_refused_before_it_is_watched(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    # The id goes into a URL sent with the provider's key: "../" (resolved by URL parsers,
    # also when written %2e%2e), "/", "?" or "#" would point that key at another endpoint.
    cfg = msgspec.structs.replace(config, providers=PROVIDERS)
    refused = {
        "runway": ["../../v1/organization", "..", "a/b", "t?limit=1", "t#x", "%2e%2e"],
        "gemini": ["models/../../v1beta/files/operations/x", "v1/operations/x", "models/m"],
        "vertex": ["projects/../../v1/x/operations/y", "projects/p/operations/../x"],
    }
    async with open_api(cfg, pool, tmp_path) as api:
        for provider, ids in refused.items():
            for task_id in ids:
                body = {"provider": provider, "task_id": task_id}
                answer = await api.json("POST", "/v1/generation-tasks", json=body, expect=422)
                assert answer["error"]["code"] == "invalid_task_id", (provider, task_id)
        assert await pool.fetchval("SELECT count(*) FROM generation_tasks") == 0
        assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
        for provider, task_id in (
            ("runway", "17f20503-6c24-4c16-946b-35dbbce2af2f"),
            ("gemini", "models/veo-3.0-generate-001/operations/abc123"),
            (
                "vertex",
                "projects/p/locations/us-central1/publishers/google/models/veo/operations/9",
            ),
        ):
            body = {"provider": provider, "task_id": task_id}
            await api.json("POST", "/v1/generation-tasks", json=body, expect=201)


async def test_a_provider_account_named_for_a_tenant_is_watched_for_that_tenant_only(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    cfg = msgspec.structs.replace(config, providers=PROVIDERS)
    async with open_api(cfg, pool, tmp_path) as api:
        body = {"provider": "acme_luma", "task_id": "gen-1"}
        _other, other_key = await api.tenant("globex")
        # globex may not poll acme's account with acme's key, nor squat acme's task id (a
        # later callback for it would then be recorded for globex).
        answer = await api.json(
            "POST", "/v1/generation-tasks", json=body, key=other_key, expect=422
        )
        assert answer["error"]["code"] == "provider_of_another_tenant"
        assert await pool.fetchval("SELECT count(*) FROM generation_tasks") == 0
        mine = await api.json("POST", "/v1/generation-tasks", json=body, expect=201)
        assert mine["watch_status"] == "WATCHING"
