"""Resumable uploads (tus 1.0 on /v1/uploads) over real HTTP on loopback, real PostgreSQL and
both stores: the local one (an append file) and S3 (SeaweedFS and moto: parts of a multipart
upload). The protocol's rules and an attacker's games are refused as tus says; an upload
survives a dropped connection (with tuspy, a real tus client) and an API restart; the last
byte hands the file to the pipeline exactly once, through the same intake as complete."""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import pytest
from tusclient import client as tus_client
from tusclient.exceptions import TusCommunicationError
from tusclient.uploader import Uploader

from aivedio.api.app import run_app
from aivedio.api.context import ApiContext
from aivedio.config.load import Config
from aivedio.store.database import Pool
from aivedio.store.objects.base import MIB
from aivedio.store.objects.opening import open_object_store
from aivedio.store.queue import Queue
from aivedio.store.uploads import reap_expired_uploads, session_prefix
from tests.support.api_rig import Api, open_api
from tests.support.cutting_proxy import CuttingProxy, cutting_proxy
from tests.support.edge_client import raw_post
from tests.support.s3_server import s3_config

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

TUS = {"Tus-Resumable": "1.0.0"}
OCTETS = {"Content-Type": "application/offset+octet-stream"}
PART = 5 * MIB  # the smallest part S3 takes: files of a few MiB cross part boundaries


def b64(value: str | bytes) -> str:
    raw = value.encode() if isinstance(value, str) else value
    return base64.b64encode(raw).decode()


def sha256_b64(data: bytes) -> str:
    return b64(hashlib.sha256(data).digest())


STORES = ("local", "seaweedfs", "moto")


@asynccontextmanager
async def serve(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind: str,
    **api: Any,
) -> AsyncIterator[Api]:
    storage = None
    if kind != "local":
        endpoint: str = request.getfixturevalue(f"{kind}_endpoint")
        storage = s3_config(endpoint, f"tus-{uuid.uuid4().hex[:8]}")
    settings: dict[str, Any] = {"resumable_part_size_bytes": PART, **api}
    async with open_api(config, pool, tmp_path, storage=storage, **settings) as served:
        yield served


@pytest.fixture(params=STORES)
async def api(
    config: Config, pool: Pool, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Api]:
    async with serve(config, pool, tmp_path, request, request.param) as served:
        yield served


@pytest.fixture(params=("local", "seaweedfs"))
async def api2(
    config: Config, pool: Pool, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Api]:
    """Both stores, one S3 engine: for the tests whose S3 side is the engine's any way."""
    async with serve(config, pool, tmp_path, request, request.param) as served:
        yield served


async def call(
    api: Api,
    method: str,
    url: str,
    *,
    data: bytes | None = None,
    auth: dict[str, str] | None = None,
    **headers: str,
) -> tuple[int, dict[str, str], bytes]:
    sent = {**TUS, **(api.auth() if auth is None else auth), **headers}
    target = url if url.startswith("http") else api.base + url
    body = io.BytesIO(data) if data is not None else None  # large bytes warn
    async with api.http.request(method, target, data=body, headers=sent) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def create(
    api: Api, length: int, *, auth: dict[str, str] | None = None, **headers: str
) -> str:
    status, answer, body = await call(
        api, "POST", "/v1/uploads", auth=auth, **{"Upload-Length": str(length), **headers}
    )
    assert status == 201, (status, body[:300])
    return answer["Location"]


async def patch(
    api: Api, url: str, offset: int, data: bytes, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    return await call(
        api, "PATCH", url, data=data, **{**OCTETS, "Upload-Offset": str(offset), **headers}
    )


async def offset_of(api: Api, url: str, **kw: Any) -> int:
    status, headers, _ = await call(api, "HEAD", url, **kw)
    assert status == 200, status
    return int(headers["Upload-Offset"])


async def asset_row(pool: Pool, video_id: str) -> Any:
    return await pool.fetchrow(
        "SELECT a.status, a.source_size_bytes, a.source_sha256, a.source_object_key,"
        " (SELECT count(*) FROM jobs j WHERE j.payload->>'asset_id' = a.id::text) AS jobs"
        " FROM assets a WHERE a.id = $1",
        uuid.UUID(video_id),
    )


def video_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


# -- the protocol --------------------------------------------------------------------------------


async def test_an_upload_in_pieces_across_parts_becomes_one_asset_once(api: Api) -> None:
    data = os.urandom(2 * PART + 1234)
    meta = f"filename {b64('clip.mp4')},filetype {b64('video/mp4')},passthrough {b64('my-7')}"
    url = await create(api, len(data), **{"Upload-Metadata": meta})
    assert url.startswith(api.base + "/v1/uploads/")
    assert await offset_of(api, url) == 0
    # Pieces that straddle S3's part boundaries, one with its checksum.
    cuts = [0, 3 * MIB, 3 * MIB + 1, PART + 7, len(data)]
    for start, end in itertools.pairwise(cuts):
        piece = data[start:end]
        extra = {"Upload-Checksum": f"sha256 {sha256_b64(piece)}"} if start == PART + 7 else {}
        status, headers, body = await patch(api, url, start, piece, **extra)
        assert status == 204, (status, body[:300])
        assert int(headers["Upload-Offset"]) == end
        assert headers["Tus-Resumable"] == "1.0.0"
    row = await asset_row(api.rig.pool, video_of(url))
    assert row["status"] == "QUARANTINED" and row["jobs"] == 1
    assert row["source_sha256"] == hashlib.sha256(data).hexdigest()
    assert await api.rig.store.get_bytes(row["source_object_key"], max_bytes=len(data)) == data
    # The final PATCH again (its answer was lost): the same answer, no second intake.
    status, headers, _ = await patch(api, url, cuts[-2], data[cuts[-2] :])
    assert (status, headers["Upload-Offset"]) == (204, str(len(data)))
    assert await offset_of(api, url) == len(data)
    assert (await asset_row(api.rig.pool, video_of(url)))["jobs"] == 1
    status_doc = await api.json("GET", f"/v1/videos/{video_of(url)}/status")
    assert status_doc["passthrough"] == "my-7"
    assert status_doc["upload"]["sha256"] == hashlib.sha256(data).hexdigest()
    # Nothing of the upload's scratch is left in quarantine but the source.
    prefix = session_prefix(api.rig.tenant_id, uuid.UUID(video_of(url)))
    keys = [info.key async for info in api.rig.store.list(prefix)]
    assert keys == [row["source_object_key"]]
    assert await api.rig.store.list_multipart_uploads(prefix) == []


async def test_creation_with_upload_and_discovery(api2: Api) -> None:
    status, headers, _ = await call(api2, "OPTIONS", "/v1/uploads", auth={})
    assert status == 204
    assert headers["Tus-Version"] == "1.0.0"
    assert set(headers["Tus-Extension"].split(",")) == {
        "creation",
        "creation-with-upload",
        "termination",
        "expiration",
        "checksum",
    }
    assert headers["Tus-Checksum-Algorithm"] == "sha256"
    assert "Upload-Offset" in headers["Access-Control-Expose-Headers"]
    data = os.urandom(100_000)
    status, headers, _ = await call(
        api2, "POST", "/v1/uploads", data=data[:60_000], **OCTETS, **{"Upload-Length": "100000"}
    )
    assert status == 201 and headers["Upload-Offset"] == "60000"
    assert "GMT" in headers["Upload-Expires"]
    status, _, _ = await patch(api2, headers["Location"], 60_000, data[60_000:])
    assert status == 204
    row = await asset_row(api2.rig.pool, video_of(headers["Location"]))
    assert row["source_sha256"] == hashlib.sha256(data).hexdigest()


async def test_the_protocol_refuses_what_it_must(api2: Api) -> None:
    url = await create(api2, 1000)
    # The version: 412 naming the one spoken.
    status, headers, _ = await call(api2, "HEAD", url, **{"Tus-Resumable": "0.2.2"})
    assert status == 412 and headers["Tus-Version"] == "1.0.0"
    # Offset games: not the stored offset, not a number, negative, a sign, past the length.
    status, headers, _ = await patch(api2, url, 10, b"x")
    assert status == 409 and headers["Upload-Offset"] == "0"
    for bad in ("-1", "+0", "0x0", "0_0", "1e3", "99999999999999999999", ""):
        status, _, _ = await call(api2, "PATCH", url, data=b"x", **OCTETS, **{"Upload-Offset": bad})
        assert status == 400, bad
    status, _, _ = await patch(api2, url, 0, b"x" * 1001)
    assert status == 413
    status, _, _ = await call(
        api2, "PATCH", url, data=b"x", **{"Upload-Offset": "0", "Content-Type": "text/plain"}
    )
    assert status == 415
    # Checksums: another algorithm is 400, a wrong digest 460, and nothing is kept.
    status, _, _ = await patch(
        api2, url, 0, b"abc", **{"Upload-Checksum": f"sha1 {b64(b'x' * 20)}"}
    )
    assert status == 400
    status, headers, _ = await patch(
        api2, url, 0, b"abc", **{"Upload-Checksum": f"sha256 {sha256_b64(b'abd')}"}
    )
    assert status == 460 and headers["Tus-Resumable"] == "1.0.0"
    assert await offset_of(api2, url) == 0
    # Lengths: negative, zero, huge, over the limit; deferring is not supported.
    for bad, want in (("-5", 400), ("0", 400), ("1" * 30, 400), (str(2**63), 400)):
        status, _, _ = await call(api2, "POST", "/v1/uploads", **{"Upload-Length": bad})
        assert status == want, bad
    limit = api2.ctx.config.api.upload_max_bytes
    status, headers, _ = await call(
        api2, "POST", "/v1/uploads", **{"Upload-Length": str(limit + 1)}
    )
    assert status == 413 and headers["Tus-Max-Size"] == str(limit)
    status, _, _ = await call(api2, "POST", "/v1/uploads", **{"Upload-Defer-Length": "1"})
    assert status == 400
    # Metadata abuse: too long, not base64, duplicated, not text, a type we do not take.
    for meta in (
        "k " + "A" * 5000,
        "filename not*base64",
        f"a {b64('1')},a {b64('2')}",
        f"filename {b64(bytes([0xFF, 0xFE]))}",
        f"filename {b64('tab' + chr(9))}",
        f"filetype {b64('text/html')}",
        "QQ= x",
        f"k {b64('x')} more",
    ):
        status, _, body = await call(
            api2, "POST", "/v1/uploads", **{"Upload-Length": "10", "Upload-Metadata": meta}
        )
        assert status == 400, (meta[:30], body[:200])
    # Unknown ids, and a video that is not a resumable upload, are missing uploads.
    for path in (f"/v1/uploads/{uuid.uuid4()}", "/v1/uploads/not-a-uuid"):
        status, _, _ = await call(api2, "HEAD", path)
        assert status == 404


async def test_one_writer_at_a_time(api2: Api) -> None:
    url = await create(api2, 4 * MIB)
    release = anyio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b"a" * MIB
        await release.wait()
        yield b"b" * MIB

    async def first() -> None:
        async with api2.http.patch(
            url,
            data=slow_body(),
            headers={**TUS, **OCTETS, **api2.auth(), "Upload-Offset": "0"},
        ) as resp:
            assert resp.status == 204
            assert resp.headers["Upload-Offset"] == str(2 * MIB)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await writer_held(api2, video_of(url))  # the first PATCH holds the upload now
        # A second writer meanwhile is refused 423 (tus clients retry it).
        status, headers, _ = await patch(api2, url, 0, b"c" * 10)
        assert status == 423 and headers["Retry-After"] == "1"
        release.set()
    assert await offset_of(api2, url) == 2 * MIB


async def test_termination_removes_everything_and_refuses_more(api2: Api) -> None:
    url = await create(api2, 7 * MIB)
    status, _, _ = await patch(api2, url, 0, os.urandom(6 * MIB))
    assert status == 204
    status, _, _ = await call(api2, "DELETE", url)
    assert status == 204
    for method in ("HEAD", "PATCH", "DELETE"):
        status, _, _ = await call(
            api2,
            method,
            url,
            **({"Upload-Offset": str(6 * MIB), **OCTETS} if method == "PATCH" else {}),
        )
        assert status == 410, method
    prefix = session_prefix(api2.rig.tenant_id, uuid.UUID(video_of(url)))
    assert [info.key async for info in api2.rig.store.list(prefix)] == []
    assert await api2.rig.store.list_multipart_uploads(prefix) == []


async def test_an_idle_upload_expires_and_the_reaper_removes_it(api2: Api) -> None:
    url = await create(api2, 7 * MIB)
    status, _, _ = await patch(api2, url, 0, os.urandom(6 * MIB))
    assert status == 204
    video = uuid.UUID(video_of(url))
    await api2.rig.pool.execute(
        "UPDATE upload_sessions SET expires_at = now() - interval '1 second' WHERE id = $1", video
    )
    status, _, _ = await patch(api2, url, 6 * MIB, b"x")
    assert status == 410
    reaped = await reap_expired_uploads(api2.rig.pool, api2.rig.store)
    assert [r.video_id for r in reaped] == [video]
    prefix = session_prefix(api2.rig.tenant_id, video)
    assert [info.key async for info in api2.rig.store.list(prefix)] == []
    assert await api2.rig.store.list_multipart_uploads(prefix) == []


@pytest.mark.parametrize("kind", ["local", "seaweedfs"])
async def test_a_patch_whose_body_stalls_keeps_what_arrived_unless_checksummed(
    config: Config, pool: Pool, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """A PATCH that stops sending midway (its connection still open) is ended by the body's
    idle watchdog after ``body_read_timeout_seconds``: what arrived is kept and answered as
    the offset (tus resumes from there), unless the PATCH carried a checksum, which a cut
    body cannot meet (400, nothing kept). Then the rest completes the upload whole."""
    data = os.urandom(PART + 3 * MIB)
    arrived = PART + 1 * MIB  # a whole part and a tail on S3
    async with serve(config, pool, tmp_path, request, kind, body_read_timeout_seconds=1.0) as api:
        url = await create(api, len(data))
        path = urlsplit(url).path
        head = {**TUS, **api.auth(), **OCTETS, "Upload-Offset": "0"}
        checksummed = {**head, "Upload-Checksum": f"sha256 {sha256_b64(data)}"}
        pieces = [data[:arrived]]
        answer = await raw_post(
            api.base, path, checksummed, pieces, content_length=len(data), method="PATCH"
        )
        assert answer.status == 400, answer
        assert answer.json()["error"]["code"] == "incomplete_body"  # type: ignore[index]
        await writer_gone(api, video_of(url))
        assert await offset_of(api, url) == 0
        answer = await raw_post(
            api.base, path, head, pieces, content_length=len(data), method="PATCH"
        )
        assert answer.status == 204, answer
        assert int(answer.headers["upload-offset"]) == arrived
        await writer_gone(api, video_of(url))
        assert await offset_of(api, url) == arrived
        status, headers, _ = await patch(api, url, arrived, data[arrived:])
        assert (status, headers["Upload-Offset"]) == (204, str(len(data)))
        row = await asset_row(api.rig.pool, video_of(url))
        assert row["source_sha256"] == hashlib.sha256(data).hexdigest() and row["jobs"] == 1


# -- credentials ---------------------------------------------------------------------------------


async def test_a_one_time_upload_token_opens_its_upload_only(api2: Api) -> None:
    data = os.urandom(300_000)
    created = await api2.json(
        "POST",
        "/v1/videos",
        expect=201,
        json={"size_bytes": len(data), "resumable": True, "filename": "a.mp4"},
    )
    upload = created["upload"]
    assert upload["method"] == "TUS" and upload["credentials"] == "upload_token"
    token = upload["headers"]["Authorization"]
    assert token.startswith("Bearer avu_")
    browser = {"Authorization": token}
    other = await create(api2, 10)
    # Not another upload, not another route, not another tenant's key's business.
    assert (await call(api2, "HEAD", other, auth=browser))[0] == 404
    assert (await call(api2, "GET", f"/v1/videos/{created['video_id']}/status", auth=browser))[
        0
    ] == 401
    # Creation with the token answers its own upload (clients that always create).
    status, headers, _ = await call(
        api2, "POST", "/v1/uploads", auth=browser, **{"Upload-Length": str(len(data))}
    )
    assert status == 201 and headers["Location"] == upload["url"]
    status, _, _ = await call(
        api2, "PATCH", upload["url"], data=data, auth=browser, **OCTETS, **{"Upload-Offset": "0"}
    )
    assert status == 204
    row = await asset_row(api2.rig.pool, created["video_id"])
    assert row["source_sha256"] == hashlib.sha256(data).hexdigest()
    # Spent: the upload is complete, the token opens nothing any more.
    assert (await call(api2, "HEAD", upload["url"], auth=browser))[0] == 401


async def test_a_declared_sha256_that_does_not_match_fails_the_upload(api2: Api) -> None:
    data = os.urandom(50_000)
    meta = f"sha256 {b64(hashlib.sha256(b'other').hexdigest())}"
    url = await create(api2, len(data), **{"Upload-Metadata": meta})
    status, _, body = await patch(api2, url, 0, data)
    assert status == 422 and b"checksum_mismatch" in body
    assert await asset_row(api2.rig.pool, video_of(url)) is None
    assert (await call(api2, "HEAD", url))[0] == 410


# -- surviving failures --------------------------------------------------------------------------


async def test_an_api_restart_in_the_middle_resumes_with_the_same_digest(
    api2: Api, tmp_path: Path
) -> None:
    data = os.urandom(2 * PART + 99)
    url = await create(api2, len(data))
    first = PART + 3 * MIB  # a whole part and a tail object on S3
    assert (await patch(api2, url, 0, data[:first]))[0] == 204
    # Another API process: nothing of the first one's memory (hashes, buffers) is there.
    cfg = api2.ctx.config
    async with open_object_store(cfg.storage) as store, anyio.create_task_group() as tg:
        ctx = ApiContext(
            config=cfg,
            pool=api2.rig.pool,
            store=store,
            queue=Queue(api2.rig.pool),
            cipher=api2.ctx.cipher,
            signer=api2.ctx.signer,
        )
        port = await tg.start(run_app, ctx, "127.0.0.1", 0)
        other = url.replace(api2.base, f"http://127.0.0.1:{port}")
        assert await offset_of(api2, other) == first
        status, headers, _ = await patch(api2, other, first, data[first:])
        assert (status, headers["Upload-Offset"]) == (204, str(len(data)))
        tg.cancel_scope.cancel()
    row = await asset_row(api2.rig.pool, video_of(url))
    assert row["source_sha256"] == hashlib.sha256(data).hexdigest()
    assert await api2.rig.store.get_bytes(row["source_object_key"], max_bytes=len(data)) == data


class Sha256Uploader(Uploader):  # type: ignore[misc]
    """tuspy's uploader with the checksum algorithm the server takes (its default is sha1)."""

    CHECKSUM_ALGORITHM_PAIR = ("sha256", hashlib.sha256)


@pytest.mark.parametrize(("kind", "checksum"), [("local", False), ("seaweedfs", True)])
async def test_tuspy_resumes_after_a_dropped_connection(
    config: Config,
    pool: Pool,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind: str,
    checksum: bool,
) -> None:
    data = os.urandom(PART + 3 * MIB)
    source = tmp_path / "clip.mp4"
    source.write_bytes(data)
    chunk = 2 * MIB
    async with (
        cutting_proxy(cut_after_bytes=3 * MIB) as proxy,
        serve(
            config, pool, tmp_path, request, kind, public_base_url=f"http://127.0.0.1:{proxy.port}"
        ) as api,
    ):
        proxy.target_port = int(api.base.rsplit(":", 1)[1])
        url = await anyio.to_thread.run_sync(first_attempt, api, proxy, source, chunk, checksum)
        assert proxy.cuts == 1
        if checksum:
            await writer_gone(api, video_of(url))  # the cut PATCH's handler has finished
            # A checksummed PATCH cut short counts for nothing.
            assert await offset_of(api, url) == chunk
        else:
            # What arrived of the cut PATCH is kept, once its handler has seen the cut.
            with anyio.fail_after(10):
                while (stored := await offset_of(api, url)) == chunk:
                    await anyio.sleep(0.02)
            assert chunk < stored < 3 * MIB
        await anyio.to_thread.run_sync(resume, api, url, source, chunk, checksum)
        row = await asset_row(api.rig.pool, video_of(url))
        assert row["source_sha256"] == hashlib.sha256(data).hexdigest()
        assert row["jobs"] == 1


async def writer_held(api: Api, video_id: str) -> None:
    """Wait until a PATCH holds the upload's writer lease."""
    with anyio.fail_after(10):
        while not await api.rig.pool.fetchval(
            "SELECT writer_id IS NOT NULL FROM upload_sessions WHERE id = $1",
            uuid.UUID(video_id),
        ):
            await anyio.sleep(0.01)


async def writer_gone(api: Api, video_id: str) -> None:
    """Wait until no PATCH holds the upload (the server saw the cut and recorded or refused
    what arrived): its writer lease is released then."""
    with anyio.fail_after(10):
        while await api.rig.pool.fetchval(
            "SELECT writer_id IS NOT NULL FROM upload_sessions WHERE id = $1",
            uuid.UUID(video_id),
        ):
            await anyio.sleep(0.02)


def first_attempt(api: Api, proxy: CuttingProxy, source: Path, chunk: int, checksum: bool) -> str:
    tus = tus_client.TusClient(f"http://127.0.0.1:{proxy.port}/v1/uploads", headers=api.auth())
    with source.open("rb") as stream:
        uploader = Sha256Uploader(
            file_stream=stream,
            client=tus,
            chunk_size=chunk,
            metadata={"filename": "clip.mp4"},
            upload_checksum=checksum,
        )
        with pytest.raises(TusCommunicationError):
            uploader.upload()
    assert uploader.url is not None
    return str(uploader.url)


def resume(api: Api, url: str, source: Path, chunk: int, checksum: bool) -> None:
    tus = tus_client.TusClient(url, headers=api.auth())
    with source.open("rb") as stream:
        uploader = Sha256Uploader(
            file_stream=stream,
            client=tus,
            url=url,
            chunk_size=chunk,
            upload_checksum=checksum,
            retries=20,
            retry_delay=0.2,  # type: ignore[arg-type]
        )
        uploader.upload()
