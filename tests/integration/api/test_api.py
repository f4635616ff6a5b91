"""The API over real HTTP on loopback, real PostgreSQL and the local object store: keys,
provider callbacks, tenant isolation, playback tokens and the playback gateway."""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from multidict import CIMultiDict
from yarl import URL

from aivedio.api.app import make_app
from aivedio.api.tokens import TokenSigner
from aivedio.config.load import Config, ProviderConfig
from aivedio.providers.hmac_callbacks import sign
from aivedio.store.api_keys import revoke_key
from aivedio.store.database import Pool
from tests.support.api_rig import PLAYLIST, SEGMENT, TOKEN_KEY, Api, open_api, published
from tests.support.s3_server import s3_config

pytestmark = pytest.mark.anyio

SECRET = "cb-secret-for-tests"


def with_providers(config: Config) -> Config:
    providers = {
        "sim": ProviderConfig(callback_secret=SECRET, tenant="acme"),
        "orphan": ProviderConfig(callback_secret=SECRET),  # names no tenant
    }
    return msgspec.structs.replace(config, providers=providers)


async def get(api: Api, url: str, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    """GET exactly this URL (dot segments are sent as they are, not resolved)."""
    target = URL(url, encoded=True)
    async with api.http.get(target, headers=headers, allow_redirects=False) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


def signed(body: bytes, *, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    return {
        "X-Aivedio-Timestamp": timestamp,
        "X-Aivedio-Signature": "sha256=" + sign(secret.encode(), timestamp, body),
        "Content-Type": "application/json",
    }


def callback_body(event_id: str, task_id: str = "task-1", **output: Any) -> bytes:
    out = {"index": 0, "url": "https://cdn.provider.example/out.mp4?sig=abc", **output}
    doc = {"event_id": event_id, "task_id": task_id, "status": "SUCCEEDED", "outputs": [out]}
    return msgspec.json.encode(doc)


async def post_callback(
    api: Api, body: bytes, headers: dict[str, str], provider: str = "sim"
) -> tuple[int, Any]:
    url = f"{api.base}/v1/providers/{provider}/callbacks"
    async with api.http.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def counts(pool: Pool) -> tuple[int, int, int]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM provider_outputs) AS outputs,"
        " (SELECT count(*) FROM callback_receipts) AS receipts,"
        " (SELECT count(*) FROM jobs WHERE kind = 'fetch') AS fetches"
    )
    assert row is not None
    return row["outputs"], row["receipts"], row["fetches"]


async def test_v1_needs_a_live_key(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        missing = f"/v1/assets/{uuid.uuid4()}"
        async with api.http.get(api.base + missing) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await resp.json())["error"]["code"] == "unauthorized"
        await api.json("GET", missing, key="av_live_00000000_" + "x" * 43, expect=401)
        await api.json("GET", missing, key="not-a-key", expect=401)
        await api.json("GET", missing, expect=404)  # the key works: the asset is missing
        prefix = api.key[: len("av_live_") + 8]
        async with pool.acquire() as conn:
            assert await revoke_key(conn, prefix) is True
            assert await revoke_key(conn, prefix) is False
        await api.json("GET", missing, expect=401)  # revoked: at once
        stored = await pool.fetchval("SELECT key_hash FROM api_keys WHERE prefix = $1", prefix)
        assert bytes(stored) == hashlib.sha256(api.key.encode()).digest()
        assert api.key.encode() not in bytes(stored)


async def test_callback_records_the_output_and_enqueues_its_fetch(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(with_providers(config), pool, tmp_path) as api:
        body = callback_body("evt-1", size=1234, sha256="ab" * 32)
        started = time.monotonic()
        status, answer = await post_callback(api, body, signed(body))
        elapsed = time.monotonic() - started
        assert status == 202, answer
        assert elapsed < 2.0
        [output] = answer["outputs"]
        assert output["fetch_status"] == "FETCH_PENDING" and output["created"] is True
        assert await counts(pool) == (1, 1, 1)
        job = await pool.fetchrow("SELECT payload FROM jobs WHERE kind = 'fetch'")
        assert job is not None
        assert job["payload"] == {"provider_output_id": output["provider_output_id"]}
        stored = await pool.fetchrow("SELECT * FROM provider_outputs")
        assert stored is not None and stored["tenant_id"] == api.rig.tenant_id
        assert b"cdn.provider.example" not in bytes(stored["source_url_ciphertext"])
        task = await api.json("GET", f"/v1/generation-tasks/{answer['generation_task_id']}")
        assert task["status"] == "PROVIDER_SUCCEEDED"
        assert task["outputs"][0]["fetch_status"] == "FETCH_PENDING"
        # Another tenant cannot see the task.
        _, other = await api.tenant("globex")
        path = f"/v1/generation-tasks/{answer['generation_task_id']}"
        await api.json("GET", path, key=other, expect=404)


async def test_callback_rejections_record_nothing(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(with_providers(config), pool, tmp_path, max_callback_bytes=2048) as api:
        body = callback_body("evt-bad")
        cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
            ("wrong secret", body, signed(body, secret="other"), 401, "bad_signature"),
            ("stale", body, signed(body, at=time.time() - 330), 401, "bad_signature"),
            ("future", body, signed(body, at=time.time() + 330), 401, "bad_signature"),
            ("unsigned", body, {"Content-Type": "application/json"}, 401, "unsigned"),
            ("body changed", body + b" ", signed(body), 401, "bad_signature"),
            ("too large", b"x" * 4096, signed(b"x" * 4096), 413, "too_large"),
            ("not json", b"{nope", signed(b"{nope"), 400, "malformed"),
        ]
        bad_fields = callback_body("evt-2", sha256="zz")
        cases.append(("bad sha256", bad_fields, signed(bad_fields), 400, "malformed"))
        no_outputs = b'{"event_id":"e3","task_id":"t","status":"SUCCEEDED","outputs":[]}'
        cases.append(("no outputs", no_outputs, signed(no_outputs), 422, "malformed"))
        for name, data, headers, expected, code in cases:
            status, answer = await post_callback(api, data, headers)
            assert (status, answer["error"]["code"]) == (expected, code), name
            assert answer["error"]["detail"], name
        orphan = callback_body("evt-4", task_id="never-seen")
        status, answer = await post_callback(api, orphan, signed(orphan), provider="orphan")
        assert (status, answer["error"]["code"]) == (422, "unknown_task")
        status, _ = await post_callback(api, body, signed(body), provider="nobody")
        assert status == 404
        assert await counts(pool) == (0, 0, 0)
        assert await pool.fetchval("SELECT count(*) FROM generation_tasks") == 0


async def test_replays_are_refused_and_duplicates_are_safe(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(with_providers(config), pool, tmp_path) as api:
        body = callback_body("evt-1")
        headers = signed(body)
        assert (await post_callback(api, body, headers))[0] == 202
        status, answer = await post_callback(api, body, headers)  # the captured request again
        assert (status, answer["error"]["code"]) == (409, "replayed_event")
        assert await counts(pool) == (1, 1, 1)
        # The provider sends the same outcome under a new event id: one output, one job.
        again = callback_body("evt-2")
        status, answer = await post_callback(api, again, signed(again))
        assert status == 202 and answer["outputs"][0]["created"] is False
        assert await counts(pool) == (1, 2, 1)


async def test_gateway_serves_the_revision_with_ranges_types_and_caching(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path, playback_token_ttl_seconds=600) as api:
        asset_id = await published(api)
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        assert play["revision"] == 1 and play["state"] == "PLAYABLE"
        assert play["master_playlist"].endswith("/hls/master.m3u8")
        assert play["watch_url"] == f"{api.base}/watch/{asset_id}?token={play['token']}"
        status, headers, body = await get(api, play["master_playlist"])
        assert (status, body) == (200, PLAYLIST)
        assert headers["Content-Type"] == "application/vnd.apple.mpegurl"
        assert headers["Cache-Control"] == "public, max-age=60"
        segment = play["master_playlist"].replace("master.m3u8", "v0/seg_1.m4s")
        status, headers, body = await get(api, segment)
        assert (status, body) == (200, SEGMENT)
        assert headers["Content-Type"] == "video/iso.segment"
        max_age = int(headers["Cache-Control"].split("max-age=")[1].split(",")[0])
        assert "immutable" in headers["Cache-Control"] and 590 <= max_age <= 600
        status, headers, body = await get(api, segment, Range="bytes=10-19")
        assert (status, body) == (206, SEGMENT[10:20])
        assert headers["Content-Range"] == "bytes 10-19/1024"
        status, _, body = await get(api, segment, Range="bytes=-5")
        assert (status, body) == (206, SEGMENT[-5:])
        status, _, body = await get(api, segment, Range="bytes=1000-")
        assert (status, body) == (206, SEGMENT[1000:])
        status, headers, _ = await get(api, segment, Range="bytes=2000-")
        assert (status, headers["Content-Range"]) == (416, "bytes */1024")
        status, headers, _ = await get(api, segment, **{"If-None-Match": headers["ETag"]})
        assert status == 304
        async with api.http.head(segment) as resp:
            assert resp.status == 200 and resp.headers["Content-Length"] == "1024"
            assert await resp.read() == b""
        status, headers, _ = await get(api, play["mp4"])
        assert (status, headers["Content-Type"]) == (200, "video/mp4")
        media = f"{api.base}/media/{play['token']}/"
        for path in ("../2/hls/master.m3u8", "hls/../../x", "hls/missing.m4s", ".tmp/x"):
            assert (await get(api, media + path))[0] == 404, path


async def test_a_token_opens_only_its_own_revision(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        first = await published(api)
        second = await published(api)
        play = await api.json("GET", f"/v1/videos/{first}/playback")
        token = play["token"]
        signer = TokenSigner.hs256(TOKEN_KEY)
        claims = signer.verify(token)
        # The same path under the other asset's token works; under this token it cannot reach
        # the other asset: paths are relative to the token's own prefix.
        other = (await api.json("GET", f"/v1/videos/{second}/playback"))["token"]
        assert (await get(api, f"{api.base}/media/{other}/hls/master.m3u8"))[0] == 200
        escape = f"{api.base}/media/{token}/../../{second}/rev/1/hls/master.m3u8"
        assert (await get(api, escape))[0] == 404
        # A revision that was never released is not served, even with a valid token.
        unreleased, _ = signer.issue(claims.tenant_id, first, 2, 60)
        assert (await get(api, f"{api.base}/media/{unreleased}/hls/master.m3u8"))[0] == 404
        header, body, mac = token.split(".")
        # The other asset's claims under this token's signature.
        payload = msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        payload["sub"] = str(second)
        payload["pfx"] = payload["pfx"].replace(str(first), str(second))
        forged_body = base64.urlsafe_b64encode(msgspec.json.encode(payload)).rstrip(b"=")
        forged = f"{header}.{forged_body.decode()}.{mac}"
        expired, _ = signer.issue(claims.tenant_id, first, 1, -1)
        foreign, _ = TokenSigner.hs256(b"q" * 32).issue(claims.tenant_id, first, 1, 60)
        tampered = f"{header}.{body}.{mac[:-2]}AA"
        for bad in (forged, expired, foreign, tampered, "garbage", "a.b", "a.b.c"):
            status, _, answer = await get(api, f"{api.base}/media/{bad}/hls/master.m3u8")
            assert status == 403, bad
            assert msgspec.json.decode(answer)["error"]["code"] == "token_rejected"


async def test_tenants_are_isolated(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        mine = await published(api)
        theirs_id, theirs = await api.tenant("globex")
        for path in (
            f"/v1/assets/{mine}",
            f"/v1/videos/{mine}/playback",
            f"/v1/videos/{mine}/status",
            f"/v1/assets/{mine}/events",
        ):
            answer = await api.json("GET", path, key=theirs, expect=404)
            assert answer["error"]["code"] == "not_found", path
        await api.json("DELETE", f"/v1/assets/{mine}", key=theirs, expect=404)
        assert (await api.json("GET", f"/v1/assets/{mine}"))["state"] == "PLAYABLE"
        # Their own asset's token does not open ours, and ours is not theirs to delete.
        their_asset = await published(api, tenant_id=theirs_id)
        play = await api.json("GET", f"/v1/videos/{their_asset}/playback", key=theirs)
        assert play["video_id"] == str(their_asset)
        await api.json("GET", f"/v1/videos/{their_asset}/playback", expect=404)
        asset = await api.json("GET", f"/v1/assets/{mine}")
        assert [o["variant_type"] for o in asset["outputs"]] == ["hls", "playback"]


async def test_delete_closes_playback_at_once(config: Config, pool: Pool, tmp_path: Path) -> None:
    async with open_api(config, pool, tmp_path) as api:
        asset_id = await published(api)
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        assert (await get(api, play["master_playlist"]))[0] == 200
        deleted = await api.json("DELETE", f"/v1/assets/{asset_id}")
        assert deleted == {"asset_id": str(asset_id), "state": "DELETED", "deleted_now": True}
        assert (await get(api, play["master_playlist"]))[0] == 404
        assert (await api.json("DELETE", f"/v1/assets/{asset_id}"))["deleted_now"] is False
        assert (await api.json("GET", f"/v1/assets/{asset_id}"))["state"] == "DELETED"
        await api.json("GET", f"/v1/videos/{asset_id}/playback", expect=404)


async def test_playback_waits_for_a_published_revision(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        asset_id = await api.rig.quarantine(b"not yet processed")
        answer = await api.json("GET", f"/v1/videos/{asset_id}/playback", expect=409)
        assert answer["error"]["code"] == "not_published"
        await api.json("GET", "/v1/videos/not-a-uuid/playback", expect=404)


async def test_operations_endpoints_and_document(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        assert (await get(api, api.base + "/healthz"))[0] == 200
        status, _, body = await get(api, api.base + "/readyz")
        assert (status, msgspec.json.decode(body)) == (200, {"status": "ready"})
        api.ctx.draining = True
        status, _, body = await get(api, api.base + "/readyz")
        assert status == 503 and "draining" in msgspec.json.decode(body)["reasons"]
        api.ctx.draining = False
        status, _, body = await get(api, api.base + "/metrics")
        assert status == 200 and b'aivedio_api_requests_total{route="/readyz",status="503"}' in body
        status, _, body = await get(api, api.base + "/openapi.json")
        doc = msgspec.json.decode(body)
        assert doc["openapi"] == "3.1.0"
        for path in (
            "/v1/providers/{provider}/callbacks",
            "/v1/videos/{video_id}/playback",
            "/v1/assets/{asset_id}",
            "/media/{token}/{path}",
            "/v1/generation-tasks/{task_id}",
        ):
            assert path in doc["paths"], path
        # Every route the app serves is described (and nothing described is not served).
        app = make_app(api.ctx)
        served = {
            (route.resource.canonical, route.method.lower())
            for route in app.router.routes()
            if route.resource is not None and route.method not in ("*", "HEAD")
        }
        described = {(path, method) for path, item in doc["paths"].items() for method in item} - {
            (path, "head") for path in doc["paths"]
        }
        assert served == described


async def test_redirect_mode_sends_presigned_store_urls(
    config: Config, pool: Pool, tmp_path: Path, s3_endpoint: str
) -> None:
    storage = s3_config(s3_endpoint, f"redirect-{uuid.uuid4().hex[:8]}")
    async with open_api(config, pool, tmp_path, storage=storage, media_redirect=True) as api:
        asset_id = await published(api)
        play = await api.json("GET", f"/v1/videos/{asset_id}/playback")
        segment = play["master_playlist"].replace("master.m3u8", "v0/seg_1.m4s")
        status, headers, _ = await get(api, segment)
        assert status == 302 and headers["Cache-Control"] == "no-store"
        location = headers["Location"]
        assert location.startswith(s3_endpoint) and "X-Amz-Signature=" in location
        async with api.http.get(location, headers={"Range": "bytes=0-9"}) as resp:
            assert resp.status == 206 and await resp.read() == SEGMENT[:10]
        async with api.http.get(location) as resp:
            assert resp.headers["Content-Type"] == "video/iso.segment"
        # The checks still come first: a deleted asset gets no redirect.
        await api.json("DELETE", f"/v1/assets/{asset_id}")
        assert (await get(api, segment))[0] == 404
