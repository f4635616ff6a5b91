"""``GET /v1/assets``, ``/v1/videos``, ``/v1/generation-tasks``: pages that hold still while
rows are added, cursors that cannot be forged across lists, filters, tenant scope."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api, published

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def walk(api: Api, path: str, *, key: str | None = None, **params: Any) -> list[Any]:
    """Every page of ``path``; the items in order."""
    items: list[Any] = []
    cursor = None
    for _ in range(100):
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = await api.json("GET", path, key=key, params=query)
        items += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("never reached the last page")


async def asset(api: Api, status: str, *, at: datetime, tenant_id: int | None = None) -> uuid.UUID:
    asset_id = uuid.uuid4()
    await api.rig.pool.execute(
        "INSERT INTO assets (id, tenant_id, source_type, status, source_object_key, created_at)"
        " VALUES ($1, $2, 'UPLOAD', $3, 'quarantine/x', $4)",
        asset_id,
        tenant_id or api.rig.tenant_id,
        status,
        at,
    )
    return asset_id


async def test_pages_walk_every_asset_once_newest_first_while_rows_are_added(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        base = datetime(2026, 1, 1, tzinfo=UTC)
        # Ten share one created_at: the id breaks the tie, so none is skipped or repeated.
        made = [await asset(api, "PLAYABLE", at=base) for _ in range(10)]
        made += [await asset(api, "ENRICHED", at=base + timedelta(seconds=i)) for i in range(7)]
        first = await api.json("GET", "/v1/assets", params={"limit": "5"})
        assert len(first["data"]) == 5 and first["next_cursor"]
        # Rows added while the client pages are newer: they never shift a later page.
        for _ in range(3):
            await asset(api, "PLAYABLE", at=datetime.now(UTC))
        rest = await walk(api, "/v1/assets", limit="5", cursor=first["next_cursor"])
        seen = [item["asset_id"] for item in first["data"] + rest]
        assert sorted(seen) == sorted(str(a) for a in made) and len(seen) == len(set(seen))
        order = [(item["created_at"], item["asset_id"]) for item in first["data"] + rest]
        assert order == sorted(order, reverse=True)


async def test_filters_and_the_deleted_rows(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        now = datetime.now(UTC)
        old = await asset(api, "PLAYABLE", at=now - timedelta(days=2))
        new = await asset(api, "REJECTED", at=now - timedelta(hours=1))
        gone = await asset(api, "DELETED", at=now - timedelta(hours=1))
        ids = {item["asset_id"] for item in await walk(api, "/v1/assets")}
        assert ids == {str(old), str(new)}  # DELETED only when asked for
        only = await walk(api, "/v1/assets", state="DELETED")
        assert [item["asset_id"] for item in only] == [str(gone)]
        after = (now - timedelta(days=1)).isoformat()
        recent = await walk(api, "/v1/assets", created_after=after)
        assert [item["asset_id"] for item in recent] == [str(new)]
        page = await api.json(
            "GET", "/v1/assets", params=[("state", "PLAYABLE"), ("state", "REJECTED")]
        )
        assert {item["asset_id"] for item in page["data"]} == {str(old), str(new)}
        assert await walk(api, "/v1/assets", source_type="PROVIDER_OUTPUT") == []


async def test_videos_are_assets_and_the_uploads_not_completed(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        playable = await published(api)
        body = {"size_bytes": 10, "sha256": "b" * 64, "content_type": "video/mp4"}
        waiting = (await api.json("POST", "/v1/videos", json=body, expect=201))["video_id"]
        videos = {item["video_id"]: item["state"] for item in await walk(api, "/v1/videos")}
        assert videos == {str(playable): "PLAYABLE", waiting: "AWAITING_UPLOAD"}
        awaiting = await walk(api, "/v1/videos", state="AWAITING_UPLOAD")
        assert [item["video_id"] for item in awaiting] == [waiting]
        # The state each shows is the one its status route shows.
        status = await api.json("GET", f"/v1/videos/{waiting}/status")
        assert status["state"] == "AWAITING_UPLOAD"


async def test_generation_tasks_are_listed_with_their_filters(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        for provider, status in (("runway", "PROVIDER_RUNNING"), ("fal", "PROVIDER_SUCCEEDED")):
            await pool.execute(
                "INSERT INTO generation_tasks (id, tenant_id, provider, provider_task_id,"
                " provider_status) VALUES ($1, $2, $3, $4, $5)",
                uuid.uuid4(),
                api.rig.tenant_id,
                provider,
                f"task-{provider}",
                status,
            )
        tasks = await walk(api, "/v1/generation-tasks")
        assert {t["provider"] for t in tasks} == {"runway", "fal"}
        fal = await walk(api, "/v1/generation-tasks", provider="fal")
        assert [(t["provider_task_id"], t["status"]) for t in fal] == [
            ("task-fal", "PROVIDER_SUCCEEDED")
        ]
        running = await walk(api, "/v1/generation-tasks", state="PROVIDER_RUNNING")
        assert [t["provider"] for t in running] == ["runway"]


async def test_lists_are_the_tenants_own(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        theirs_id, theirs = await api.tenant("globex")
        mine = await asset(api, "PLAYABLE", at=datetime.now(UTC))
        other = await asset(api, "PLAYABLE", at=datetime.now(UTC), tenant_id=theirs_id)
        assert [i["asset_id"] for i in await walk(api, "/v1/assets")] == [str(mine)]
        assert [i["asset_id"] for i in await walk(api, "/v1/assets", key=theirs)] == [str(other)]
        # Their cursor on my list pages my rows only (the cursor is a place, not a right).
        for _ in range(2):
            await asset(api, "PLAYABLE", at=datetime.now(UTC), tenant_id=theirs_id)
        page = await api.json("GET", "/v1/assets", key=theirs, params={"limit": "1"})
        mine_after = await walk(api, "/v1/assets", cursor=page["next_cursor"])
        assert [i["asset_id"] for i in mine_after] == [str(mine)]


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/assets", {"limit": "0"}, "limit"),
        ("/v1/assets", {"limit": "101"}, "limit"),
        ("/v1/assets", {"limit": "ten"}, "limit"),
        ("/v1/assets", {"limit": "\u00b2"}, "limit"),  # a digit to str.isdigit, not to int()
        ("/v1/assets", {"limit": "9" * 5000}, "limit"),
        ("/v1/assets", {"cursor": "not-a-cursor"}, "cursor"),
        ("/v1/assets", {"cursor": "x" * 300}, "cursor"),
        ("/v1/assets", {"state": "SPLENDID"}, "state"),
        ("/v1/assets", {"created_after": "yesterday"}, "created_after"),
        ("/v1/assets", {"created_after": "2026-01-01T00:00:00"}, "created_after"),
        ("/v1/assets", {"created_before": "0001-01-01T00:00:00Z"}, "created_before"),
        ("/v1/assets", {"source_type": "CAMERA"}, "source_type"),
        ("/v1/generation-tasks", {"state": "PLAYABLE"}, "state"),
    ],
)
async def test_bad_parameters_are_refused_naming_them(
    config: Config, pool: Pool, tmp_path: Path, path: str, params: dict[str, str], field: str
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        answer = await api.json("GET", path, params=params, expect=400)
        assert answer["error"]["field"] == field


async def test_a_cursor_of_one_list_is_refused_by_another(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        for _ in range(2):
            await asset(api, "PLAYABLE", at=datetime.now(UTC))
        cursor = (await api.json("GET", "/v1/assets", params={"limit": "1"}))["next_cursor"]
        answer = await api.json("GET", "/v1/videos", params={"cursor": cursor}, expect=400)
        assert answer["error"]["field"] == "cursor"


async def test_an_upload_completed_mid_walk_keeps_its_place(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        clip = b"0123456789"
        body = {"size_bytes": 10, "sha256": hashlib.sha256(clip).hexdigest()}
        made = [await api.json("POST", "/v1/videos", json=body, expect=201) for _ in range(3)]
        first = await api.json("GET", "/v1/videos", params={"limit": "1"})
        # The middle one completes: its asset keeps the video's creation time.
        middle = made[1]
        headers = {**api.auth(), **middle["upload"]["headers"]}
        async with api.http.put(middle["upload"]["url"], data=clip, headers=headers) as resp:
            assert resp.status == 200
        await api.json("POST", f"/v1/videos/{middle['video_id']}/complete", expect=202)
        rest = await walk(api, "/v1/videos", limit="1", cursor=first["next_cursor"])
        seen = [v["video_id"] for v in first["data"] + rest]
        assert sorted(seen) == sorted(m["video_id"] for m in made)
        assert {v["video_id"]: v["state"] for v in rest}[middle["video_id"]] == "QUARANTINED"
