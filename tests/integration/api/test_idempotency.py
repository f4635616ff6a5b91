"""``Idempotency-Key`` on the POSTs that create something (``api/idempotency.py``): the
same request again answers the first answer and creates nothing more; another request under
the key is refused; a refused or failed first request frees its key; keys are per tenant,
expire, and are swept."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.api import videos
from aivedio.config.load import Config
from aivedio.pipeline.upkeep.sweep_report import SweepReport
from aivedio.pipeline.upkeep.sweep_scans import StalledWork
from aivedio.store import idempotency_keys
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

BODY = {"size_bytes": 1000, "sha256": "a" * 64, "content_type": "video/mp4"}


async def post(
    api: Api, body: Any, key: str | None, *, api_key: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {**api.auth(api_key), "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with api.http.post(f"{api.base}/v1/videos", data=data, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def sessions(pool: Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM upload_sessions"))


async def test_the_same_request_again_answers_the_first_answer_and_creates_nothing(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        first = await post(api, BODY, "k-1")
        assert first[0] == 201 and "Idempotent-Replayed" not in first[1]
        again = await post(api, BODY, "k-1")
        assert again[0] == 201 and again[1]["Idempotent-Replayed"] == "true"
        assert again[2] == first[2] and again[1]["Location"] == first[1]["Location"]
        assert await sessions(pool) == 1
        # Without a key, or with another, each POST is a new video.
        assert (await post(api, BODY, None))[0] == 201
        other = await post(api, BODY, "k-2")
        assert json.loads(other[2])["video_id"] != json.loads(first[2])["video_id"]
        assert await sessions(pool) == 3


async def test_another_request_under_a_used_key_is_refused(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        assert (await post(api, BODY, "k"))[0] == 201
        status, _, answer = await post(api, {**BODY, "size_bytes": 1001}, "k")
        assert status == 422
        assert json.loads(answer)["error"]["code"] == "idempotency_key_reused"
        # The same JSON with other bytes is another request too: the body is compared as sent.
        spaced = json.dumps(BODY, indent=2).encode()
        assert (await post(api, spaced, "k"))[0] == 422
        assert await sessions(pool) == 1
        for bad in ("", "has space", "é", "x" * 256):
            status, _, answer = await post(api, BODY, bad)
            assert status == 400, bad
            assert json.loads(answer)["error"]["code"] == "invalid_idempotency_key"


async def test_keys_are_per_tenant(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        _, theirs = await api.tenant("globex")
        mine = await post(api, BODY, "shared")
        their = await post(api, BODY, "shared", api_key=theirs)
        assert mine[0] == their[0] == 201 and "Idempotent-Replayed" not in their[1]
        assert json.loads(mine[2])["video_id"] != json.loads(their[2])["video_id"]


async def test_a_refused_first_request_frees_its_key(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        too_big = {**BODY, "size_bytes": 10**15}
        assert (await post(api, too_big, "k"))[0] == 422
        assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0
        # The same key now carries a request that succeeds, and then only that one.
        assert (await post(api, BODY, "k"))[0] == 201
        assert (await post(api, too_big, "k"))[0] == 422


async def test_a_request_still_running_holds_its_key_until_its_lock_lapses(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path, idempotency_lock_seconds=1.0) as api:
        tenant = api.rig.tenant_id
        body = json.dumps(BODY).encode()
        # A first request that took the key and died with its process (no answer stored).
        digest = await _digest_of(api, body)
        held = await idempotency_keys.take(
            pool, tenant, "k", digest, holder=uuid.uuid4(), lock_seconds=1.0, ttl_seconds=3600
        )
        assert held is not None and held.taken
        status, headers, answer = await post(api, body, "k")
        assert status == 409 and headers["Retry-After"] == "1"
        assert json.loads(answer)["error"]["code"] == "idempotency_key_in_use"
        await anyio.sleep(1.2)
        assert (await post(api, body, "k"))[0] == 201
        assert (await post(api, body, "k"))[1]["Idempotent-Replayed"] == "true"


async def _digest_of(api: Api, body: bytes) -> bytes:
    """The digest a POST /v1/videos of ``body`` has: taken from a key the API stored."""
    status, _, _ = await post(api, body, "probe-digest")
    assert status == 201
    row = await api.rig.pool.fetchval(
        "SELECT request_sha256 FROM idempotency_keys WHERE key = 'probe-digest'"
    )
    return bytes(row)


async def test_expired_keys_answer_anew_and_are_swept(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        first = await post(api, BODY, "k")
        await pool.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 s'")
        again = await post(api, BODY, "k")
        assert again[0] == 201 and "Idempotent-Replayed" not in again[1]
        assert json.loads(again[2])["video_id"] != json.loads(first[2])["video_id"]
        await pool.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 s'")
        work = StalledWork.__new__(StalledWork)
        work.pool = pool
        report = SweepReport(dry_run=True)
        await work.expired_idempotency_keys(report, datetime.now(UTC))
        assert [f.action for f in report.expired_idempotency_keys] == ["would_delete"]
        assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 1
        report = SweepReport()
        await work.expired_idempotency_keys(report, datetime.now(UTC))
        assert report.expired_idempotency_keys[0].data == {"keys": 1}
        assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_a_generation_task_watch_takes_a_key_too(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        headers = {**api.auth(), "Idempotency-Key": "w", "Content-Type": "application/json"}
        body = {"provider": "nobody", "task_id": "t-1"}
        async with api.http.post(
            f"{api.base}/v1/generation-tasks", json=body, headers=headers
        ) as resp:
            assert resp.status == 422  # no such provider: refused, and the key freed
        assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_a_slow_first_request_keeps_its_key_past_the_lock_and_creates_one_video(
    config: Config, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A request slower than the lock renews it: a retry meanwhile is 409, never a second
    # run (which would make a second video whose answer the first client never sees).
    slow = videos._create_video

    async def slowed(request: Any, raw: bytes) -> Any:
        await anyio.sleep(1.6)
        return await slow(request, raw)

    monkeypatch.setattr(videos, "_create_video", slowed)
    async with open_api(config, pool, tmp_path, idempotency_lock_seconds=0.6) as api:
        answers: list[tuple[int, dict[str, str], bytes]] = []

        async def first() -> None:
            answers.append(await post(api, BODY, "slow"))

        async with anyio.create_task_group() as group:
            group.start_soon(first)
            await anyio.sleep(1.2)  # two lock lengths: a lapsed lock would be taken over here
            status, _, answer = await post(api, BODY, "slow")
            assert status == 409, answer
        [(status, _, body)] = answers
        assert status == 201
        monkeypatch.setattr(videos, "_create_video", slow)
        again = await post(api, BODY, "slow")
        assert again[1]["Idempotent-Replayed"] == "true" and again[2] == body
        assert await sessions(pool) == 1
