"""``passthrough``: the client's own string on a video or a generation task, echoed in the
status, the asset, the lists (and every webhook: ``test_outbox_relay.py``)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import open_api

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CLIP = b"0123456789"
BODY = {"size_bytes": 10, "sha256": hashlib.sha256(CLIP).hexdigest(), "content_type": "video/mp4"}


async def test_a_videos_passthrough_is_echoed_in_its_status_lists_and_asset(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        made = await api.json(
            "POST", "/v1/videos", json={**BODY, "passthrough": "order-7"}, expect=201
        )
        video = made["video_id"]
        status = await api.json("GET", f"/v1/videos/{video}/status")
        assert status["passthrough"] == "order-7"
        listed = await api.json("GET", "/v1/videos")
        assert [(v["video_id"], v["passthrough"]) for v in listed["data"]] == [(video, "order-7")]
        # Once the upload made its asset (the same id), the asset carries it too.
        headers = {**api.auth(), **made["upload"]["headers"]}
        async with api.http.put(made["upload"]["url"], data=CLIP, headers=headers) as resp:
            assert resp.status == 200, await resp.read()
        await api.json("POST", f"/v1/videos/{video}/complete", json={}, expect=202)
        asset = await api.json("GET", f"/v1/assets/{video}")
        assert asset["passthrough"] == "order-7"
        assets = await api.json("GET", "/v1/assets")
        assert [a["passthrough"] for a in assets["data"]] == ["order-7"]
        assert (await api.json("GET", f"/v1/videos/{video}/status"))["passthrough"] == "order-7"
        # Without one, null.
        plain = (await api.json("POST", "/v1/videos", json=BODY, expect=201))["video_id"]
        assert "passthrough" not in await api.json("GET", f"/v1/videos/{plain}/status")


@pytest.mark.parametrize(
    ("bad", "status"),
    [("", 422), ("x" * 256, 422), ("tab\there", 422), ("nul\x00", 400)],  # NUL: the edge's
)
async def test_a_passthrough_out_of_bounds_is_refused(
    config: Config, pool: Pool, tmp_path: Path, bad: str, status: int
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        body = {**BODY, "passthrough": bad}
        answer = await api.json("POST", "/v1/videos", json=body, expect=status)
        assert answer["error"]["field"] == "$.passthrough"


async def test_an_asset_fetched_for_a_task_carries_the_tasks_passthrough(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        task, output, asset = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        await pool.execute(
            "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
            " provider_status, passthrough) VALUES ($1, $2, 'sim', 't-1', 'PROVIDER_SUCCEEDED',"
            " 'campaign-9')",
            task,
            api.rig.tenant_id,
        )
        await pool.execute(
            "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
            " provider_task_id, output_index, source_url_ciphertext, source_url_key_id,"
            " fetch_status) VALUES ($1, $2, $3, 'sim', 't-1', 0, '\\x00', 'k', 'STORED')",
            output,
            api.rig.tenant_id,
            task,
        )
        await pool.execute(
            "INSERT INTO assets (id, tenant_id, source_type, source_provider_output_id, status,"
            " source_object_key) VALUES ($1, $2, 'PROVIDER_OUTPUT', $3, 'PLAYABLE', 'q/x')",
            asset,
            api.rig.tenant_id,
            output,
        )
        assert (await api.json("GET", f"/v1/generation-tasks/{task}"))[
            "passthrough"
        ] == "campaign-9"
        assert (await api.json("GET", f"/v1/assets/{asset}"))["passthrough"] == "campaign-9"
        assert (await api.json("GET", f"/v1/videos/{asset}/status"))["passthrough"] == "campaign-9"
        tasks = await api.json("GET", "/v1/generation-tasks")
        assert [t["passthrough"] for t in tasks["data"]] == ["campaign-9"]
