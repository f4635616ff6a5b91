"""Who gets the AV1 ladder, through the worker: the probe plans it for a listed tenant or
from the pipeline version on, and the published master says so (or does not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aivedio.config.load import Config
from aivedio.config.media import AV1Config
from aivedio.store.database import Pool
from tests.support.api_rig import open_api
from tests.support.media_fixtures import h264_faststart

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def published_master(
    config: Config, pool: Pool, tmp_path: Path, av1: AV1Config
) -> tuple[str, dict[str, object]]:
    """The master playlist and the recorded plan of a clip published for tenant acme."""
    async with open_api(config, pool, tmp_path, av1=av1) as api:
        asset_id = await api.publish(h264_faststart(tmp_path / "clip", seconds=2), timeout=120)
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        async with api.http.get(play["master_playlist"]) as resp:
            assert resp.status == 200
            master = (await resp.read()).decode()
        plan = await pool.fetchval(
            "SELECT plan FROM asset_revisions WHERE asset_id = $1 ORDER BY revision DESC LIMIT 1",
            asset_id,
        )
    return master, plan


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("av1", "expected"),
    [
        (AV1Config(tenants=["acme"]), True),
        (AV1Config(tenants=["someone-else"]), False),
        (AV1Config(from_pipeline_version=1), True),  # [media] pipeline_version is 1
        (AV1Config(from_pipeline_version=2), False),
    ],
)
async def test_the_av1_ladder_goes_to_listed_tenants_and_pipeline_versions(
    config: Config, pool: Pool, tmp_path: Path, av1: AV1Config, expected: bool
) -> None:
    master, plan = await published_master(config, pool, tmp_path, av1)
    assert ('CODECS="av01.' in master) is expected, master
    assert 'CODECS="avc1.' in master  # the H.264 fallback either way
    assert isinstance(plan, dict)
    assert bool(plan.get("av1_rungs")) is expected, plan
