"""Every absolute URL the API hands out starts with ``[api] public_base_url`` (or, unset, the
address it listens on), whatever ``Host``, ``X-Forwarded-Host``, ``X-Forwarded-Proto`` or
``Forwarded`` a client sends: the playback response, the watch URL, the upload instructions
of ``POST /v1/videos`` and every ``Location`` header. Real HTTP on loopback, real
PostgreSQL, the local store and S3 (moto)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from aivedio.api.app import run_app
from aivedio.config.load import Config
from aivedio.errors import ConfigError
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api, published
from tests.support.s3_server import s3_config

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

EVIL = "evil.example"
FORGED: dict[str, dict[str, str]] = {
    "host": {"Host": EVIL},
    "x_forwarded_host": {"X-Forwarded-Host": EVIL},
    "x_forwarded_proto": {"X-Forwarded-Proto": "https"},
    "forwarded": {"Forwarded": f'for=192.0.2.1;host={EVIL};proto=https, host="{EVIL}:443"'},
    "all_at_once": {
        "Host": EVIL,
        "X-Forwarded-Host": EVIL,
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Port": "443",
        "Forwarded": f"host={EVIL};proto=https",
    },
}
PUBLIC = "https://video.example.com"
BODY = b"not really a video, but the API only counts and hashes it"


def absolute_urls(doc: Any) -> list[str]:
    """Every string in a JSON document that looks like an absolute URL."""
    if isinstance(doc, dict):
        return [u for v in doc.values() for u in absolute_urls(v)]
    if isinstance(doc, list):
        return [u for v in doc for u in absolute_urls(v)]
    return [doc] if isinstance(doc, str) and "://" in doc else []


def declare(body: bytes) -> dict[str, Any]:
    return {
        "size_bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "video/mp4",
    }


async def call(
    api: Api, method: str, path: str, forged: dict[str, str], expect: int, **kw: Any
) -> tuple[Any, str | None]:
    """The JSON body and the Location header of a call with the forged headers."""
    headers = {**api.auth(), **forged}
    async with api.http.request(
        method, api.base + path, headers=headers, allow_redirects=False, **kw
    ) as resp:
        body = await resp.json() if resp.content_type == "application/json" else None
        assert resp.status == expect, (resp.status, body)
        return body, resp.headers.get("Location")


def assert_ours(urls: list[str], base: str) -> None:
    assert urls, "no URL to check"
    for url in urls:
        assert url.startswith(base + "/"), (url, base)
        assert EVIL not in url, url


def assert_relative(location: str | None) -> None:
    assert location is not None and location.startswith("/v1/") and EVIL not in location


async def check_every_url(api: Api, base: str, forged: dict[str, str]) -> None:
    asset_id = await published(api)
    play, _ = await call(api, "GET", f"/v1/videos/{asset_id}/playback", forged, 200)
    assert play["watch_url"] == f"{base}/watch/{asset_id}?token={play['token']}"
    assert play["master_playlist"] and play["mp4"]
    assert_ours(absolute_urls(play), base)
    # The watch page the URL opens links only relative URLs (this origin, whichever it is).
    async with api.http.get(
        api.base + play["watch_url"].removeprefix(base), headers=forged
    ) as resp:
        page = await resp.text()
        assert resp.status == 200 and EVIL not in page and "://" not in page.split("<body")[1]
    created, location = await call(api, "POST", "/v1/videos", forged, 201, json=declare(BODY))
    assert created["upload"]["url"] == f"{base}/v1/videos/{created['video_id']}/upload"
    assert_ours(absolute_urls(created), base)
    assert_relative(location)
    # The upload URL handed out works (through the listen address: base may be public).
    upload_path = created["upload"]["url"].removeprefix(base)
    async with api.http.put(
        api.base + upload_path,
        data=BODY,
        headers={**api.auth(), **forged, "Content-Type": "application/octet-stream"},
    ) as resp:
        assert resp.status == 200, await resp.text()
    done, location = await call(
        api, "POST", f"/v1/videos/{created['video_id']}/complete", forged, 202
    )
    assert EVIL not in str(done)
    assert_relative(location)
    doc, _ = await call(api, "GET", "/openapi.json", forged, 200)
    assert EVIL not in str(doc["servers"])


@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
async def test_forged_headers_never_reach_urls_built_on_the_listen_address(
    config: Config, pool: Pool, tmp_path: Path, forged: dict[str, str]
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        assert api.ctx.listen_base_url == api.base  # http://127.0.0.1:{the bound port}
        await check_every_url(api, api.base, forged)


@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
async def test_forged_headers_never_reach_urls_built_on_public_base_url(
    config: Config, pool: Pool, tmp_path: Path, forged: dict[str, str]
) -> None:
    async with open_api(config, pool, tmp_path, public_base_url=PUBLIC + "/") as api:
        await check_every_url(api, PUBLIC, forged)


async def test_presigned_upload_and_media_redirects_are_the_stores_own_urls(
    config: Config, pool: Pool, tmp_path: Path, s3_endpoint: str
) -> None:
    storage = s3_config(s3_endpoint, f"urls-{uuid.uuid4().hex[:8]}")
    async with open_api(
        config, pool, tmp_path, storage=storage, media_redirect=True, public_base_url=PUBLIC
    ) as api:
        forged = FORGED["all_at_once"]
        created, location = await call(api, "POST", "/v1/videos", forged, 201, json=declare(BODY))
        assert created["upload"]["url"].startswith(s3_endpoint + "/")
        assert_relative(location)
        asset_id = await published(api)
        play, _ = await call(api, "GET", f"/v1/videos/{asset_id}/playback", forged, 200)
        assert_ours(absolute_urls(play), PUBLIC)
        segment = play["master_playlist"].replace("master.m3u8", "v0/seg_1.m4s")
        _, location = await call(api, "GET", segment.removeprefix(PUBLIC), forged, 302)
        assert location is not None and location.startswith(s3_endpoint + "/")


async def test_serving_a_non_loopback_host_without_public_base_url_is_refused(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        # A documentation address: not this machine's, so nothing could bind it even if the
        # check were missing (that would fail with OSError, and listen on no interface).
        with pytest.raises(ConfigError, match=r"api\.public_base_url: required"):
            await run_app(api.ctx, "192.0.2.10", 0)
