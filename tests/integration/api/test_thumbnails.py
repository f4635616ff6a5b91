"""``GET /media/{token}/thumbnail.{jpg,webp}?time=&width=``: stills of the published
playback on demand, rendered once then kept, bounded in time, width and rate, cacheable."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest
from multidict import CIMultiDict

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api
from tests.support.media_fixtures import h264_720p

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def picture(data: bytes, tmp_path: Path) -> tuple[str, int, int]:
    """(codec, width, height) of an image, as ffprobe reads it."""
    path = tmp_path / "still.bin"
    path.write_bytes(data)
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,width,height",
            "-of",
            "csv=p=0",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    codec, width, height = out.split(",")
    return codec, int(width), int(height)


async def fetch(api: Api, url: str, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    async with api.http.get(url, headers=headers) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


async def test_a_still_is_rendered_once_at_the_time_and_width_asked_then_kept(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(config, pool, tmp_path) as api:
        video = await api.publish(h264_720p(tmp_path, seconds=2))
        play = await api.json("GET", f"/v1/videos/{video}/playback")
        base = f"{api.base}/media/{play['token']}"
        status, headers, body = await fetch(api, f"{base}/thumbnail.jpg?time=1.03&width=321")
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        assert picture(body, tmp_path) == ("mjpeg", 320, 180)  # an even width, the aspect kept
        assert "immutable" in headers["Cache-Control"] and headers["ETag"]
        # Kept under the revision's prefix (time rounded to 0.1 s): the next one is read back.
        stills = [o.key async for o in api.rig.store.list() if "/thumbnails/" in o.key]
        assert [k.rsplit("/", 1)[1] for k in stills] == ["t00001000_w320.jpg"]
        again = await fetch(api, f"{base}/thumbnail.jpg?time=1.0&width=320")
        assert again[2] == body
        assert (
            await fetch(
                api, f"{base}/thumbnail.jpg?time=1&width=320", **{"If-None-Match": headers["ETag"]}
            )
        )[0] == 304
        # WebP, and the defaults: the middle, the playback's own width.
        status, headers, body = await fetch(api, f"{base}/thumbnail.webp")
        assert status == 200 and headers["Content-Type"] == "image/webp"
        assert picture(body, tmp_path)[1:] == (1280, 720)


# Each query out of bounds and the field its refusal names.
OUT_OF_BOUNDS = [
    ("time=-1", "time"),
    ("time=99", "time"),
    ("time=nan", "time"),
    ("time=soon", "time"),
    ("width=8", "width"),
    ("width=1281", "width"),  # never upscaled past the playback
    ("width=12.5", "width"),
]


async def test_a_still_out_of_bounds_is_refused_naming_why(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    # One video published (the real pipeline, seconds of work) for every query: each is
    # asked of it in turn, and every refusal that is not as expected is reported.
    async with open_api(config, pool, tmp_path) as api:
        video = await api.publish(h264_720p(tmp_path, seconds=1))
        token = (await api.json("GET", f"/v1/videos/{video}/playback"))["token"]
        wrong = []
        for query, field in OUT_OF_BOUNDS:
            status, _, body = await fetch(api, f"{api.base}/media/{token}/thumbnail.jpg?{query}")
            if not (status == 400 and field.encode() in body):
                wrong.append((query, field, status, body[:300]))
        assert wrong == [], wrong


async def test_stills_are_rate_limited_per_token_and_need_a_live_token(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(
        config, pool, tmp_path, thumbnail_rate_per_second=0.01, thumbnail_burst=2
    ) as api:
        video = await api.publish(h264_720p(tmp_path, seconds=1))
        token = (await api.json("GET", f"/v1/videos/{video}/playback"))["token"]
        url = f"{api.base}/media/{token}/thumbnail.jpg?width=64"
        assert [(await fetch(api, url))[0] for _ in range(2)] == [200, 200]
        status, headers, _ = await fetch(api, url)
        assert status == 429 and int(headers["Retry-After"]) >= 1
        # Another token has its own bucket (a second later: a token of the same second is
        # the same token); a forged one is refused before any work.
        await anyio.sleep(1.1)
        other = (await api.json("GET", f"/v1/videos/{video}/playback"))["token"]
        assert (await fetch(api, f"{api.base}/media/{other}/thumbnail.jpg?width=64"))[0] == 200
        assert (await fetch(api, f"{api.base}/media/{token}x/thumbnail.jpg"))[0] == 403
        # A deleted video's stills stop at once, kept or not.
        await api.json("DELETE", f"/v1/assets/{video}")
        assert (await fetch(api, f"{api.base}/media/{other}/thumbnail.jpg?width=64"))[0] == 404
