"""Uploads through the videos API over real HTTP on loopback, real PostgreSQL, the real worker
stages, and both stores: the local one (bytes through the API's own PUT) and S3 (moto; bytes
to presigned URLs, one PUT or multipart). Sizes and checksums are verified before anything
is enqueued, complete is idempotent, tenants are isolated, expired sessions are reaped."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from aivedio.store.objects.base import MIB, PresigningStore
from aivedio.store.objects.local import LocalObjectStore
from aivedio.store.uploads import reap_expired_uploads, session_prefix
from tests.support.api_rig import Api, open_api
from tests.support.media_fixtures import h264_720p
from tests.support.pipeline_rig import running_worker
from tests.support.s3_server import s3_config

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def declare(body: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "size_bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "video/mp4",
        **extra,
    }


async def create(api: Api, body: bytes, *, key: str | None = None, **extra: Any) -> Any:
    created = await api.json("POST", "/v1/videos", key=key, expect=201, json=declare(body, **extra))
    assert created["state"] == "AWAITING_UPLOAD"
    return created


async def put(api: Api, upload: dict[str, Any], body: bytes, **headers: str) -> tuple[int, Any]:
    """Send the bytes as the instructions say: with our key to the API, bare to S3."""
    sent = dict(upload.get("headers", {}))
    if upload["credentials"] == "api_key":
        sent.update(api.auth())
    sent.update(headers)
    data = io.BytesIO(body) if isinstance(body, bytes) else body  # large bytes warn
    async with api.http.put(upload["url"], data=data, headers=sent) as resp:
        text = await resp.read()
        return resp.status, (await resp.json() if resp.content_type == "application/json" else text)


async def counts(pool: Pool, video_id: str) -> tuple[int, int]:
    """(assets, jobs live or finished) of this video."""
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM assets WHERE id::text = $1::text) AS assets,"
        " (SELECT count(*) FROM jobs WHERE payload->>'asset_id' = $1::text)"
        " + (SELECT count(*) FROM job_history WHERE payload->>'asset_id' = $1::text) AS jobs",
        video_id,
    )
    assert row is not None
    return row["assets"], row["jobs"]


async def play_through(api: Api, video_id: str) -> dict[str, Any]:
    """Run the worker until the uploaded video is playable; its status then."""
    asset_id = uuid.UUID(video_id)
    async with running_worker(api.rig):
        await api.wait_state(asset_id, ("PLAYABLE", "ENRICHED"), timeout=60)
        await api.rig.wait_idle(asset_id, timeout=60)
    status: dict[str, Any] = await api.json("GET", f"/v1/videos/{video_id}/status")
    return status


def assert_processed(status: dict[str, Any]) -> None:
    assert status["state"] in ("PLAYABLE", "ENRICHED"), status
    assert status["published_revision"] >= 1
    stages = [entry["stage"] for entry in status["timeline"]]
    assert stages[:2] == ["upload", "upload"], stages  # session_created, then the bytes
    for expected in ("asset", "probe", "publish"):
        assert expected in stages, stages
    assert any(stage.startswith("render") for stage in stages), stages
    events = {(e["stage"], e["event"]) for e in status["timeline"]}
    assert ("upload", "completed") in events and ("publish", "released") in events, events
    times = [entry["at"] for entry in status["timeline"]]
    assert times == sorted(times)


@pytest.fixture
async def local_api(config: Config, pool: Pool, tmp_path: Path) -> AsyncIterator[Api]:
    async with open_api(config, pool, tmp_path) as api:
        yield api


@pytest.fixture
async def s3_api(
    config: Config, pool: Pool, tmp_path: Path, s3_endpoint: str
) -> AsyncIterator[Api]:
    storage = s3_config(s3_endpoint, f"videos-{uuid.uuid4().hex[:8]}")
    async with open_api(
        config, pool, tmp_path, storage=storage, upload_part_size_bytes=5 * MIB
    ) as api:
        yield api


# -- the whole flow ----------------------------------------------------------------------------


async def test_upload_through_the_api_to_playable(local_api: Api, tmp_path: Path) -> None:
    api = local_api
    clip = h264_720p(tmp_path, seconds=2).read_bytes()
    created = await create(api, clip, filename="clip.mp4")
    video_id, upload = created["video_id"], created["upload"]
    assert upload["method"] == "PUT" and upload["credentials"] == "api_key"
    assert upload["url"] == f"{api.base}/v1/videos/{video_id}/upload"
    status = await api.json("GET", f"/v1/videos/{video_id}/status")
    assert status["state"] == "AWAITING_UPLOAD" and status["upload"]["filename"] == "clip.mp4"
    code, _ = await put(api, {**upload, "credentials": "none"}, clip)
    assert code == 401  # the API's own upload URL wants our key

    code, received = await put(api, upload, clip)
    assert code == 200, received
    assert received["sha256"] == hashlib.sha256(clip).hexdigest()
    assert await counts(api.rig.pool, video_id) == (0, 0)  # nothing before complete

    accepted = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202)
    assert accepted["state"] == "QUARANTINED" and accepted["size_bytes"] == len(clip)
    asset = await api.rig.asset(uuid.UUID(video_id))
    assert asset["source_type"] == "UPLOAD" and asset["source_provider_output_id"] is None
    assert asset["source_size_bytes"] == len(clip)
    assert asset["source_sha256"] == hashlib.sha256(clip).hexdigest()
    assert await api.rig.store.get_bytes(asset["source_object_key"]) == clip
    assert await counts(api.rig.pool, video_id) == (1, 1)  # the asset and its probe

    assert_processed(await play_through(api, video_id))


async def test_upload_to_a_presigned_url_to_playable(s3_api: Api, tmp_path: Path) -> None:
    api = s3_api
    clip = h264_720p(tmp_path, seconds=2).read_bytes()
    created = await create(api, clip)
    video_id, upload = created["video_id"], created["upload"]
    assert upload["method"] == "PUT" and upload["credentials"] == "none"
    assert "X-Amz-Signature=" in upload["url"]
    assert upload["headers"]["x-amz-checksum-sha256"]
    # The API does not carry the bytes of an S3 session.
    await api.json("PUT", f"/v1/videos/{video_id}/upload", expect=409, data=io.BytesIO(clip))
    await api.json("POST", f"/v1/videos/{video_id}/complete", expect=409)  # nothing there yet

    code, text = await put(api, upload, clip)
    assert code == 200, text
    accepted = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202)
    assert accepted["state"] == "QUARANTINED"
    assert await counts(api.rig.pool, video_id) == (1, 1)

    assert_processed(await play_through(api, video_id))


async def test_a_video_declared_without_its_sha256_gets_the_one_measured(local_api: Api) -> None:
    await measured_when_not_declared(local_api)


async def test_a_presigned_video_without_its_sha256_gets_the_one_read_back(s3_api: Api) -> None:
    await measured_when_not_declared(s3_api)


async def measured_when_not_declared(api: Api) -> None:
    body = os.urandom(300_000)
    created = await api.json(
        "POST",
        "/v1/videos",
        expect=201,
        json={"size_bytes": len(body), "content_type": "video/mp4"},
    )
    video_id, upload = created["video_id"], created["upload"]
    assert "x-amz-checksum-sha256" not in upload.get("headers", {})
    code, text = await put(api, upload, body)
    assert code == 200, text
    accepted = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202)
    digest = hashlib.sha256(body).hexdigest()
    assert accepted["sha256"] == digest
    asset = await api.rig.asset(uuid.UUID(video_id))
    assert asset["source_sha256"] == digest
    status = await api.json("GET", f"/v1/videos/{video_id}/status")
    assert status["upload"]["sha256"] == digest


async def test_multipart_upload_to_presigned_part_urls(s3_api: Api) -> None:
    api = s3_api
    body = os.urandom(11 * MIB)
    for send_etags in (True, False):
        created = await create(api, body)
        video_id, upload = created["video_id"], created["upload"]
        assert upload["method"] == "MULTIPART" and upload["part_size"] == 5 * MIB
        parts = upload["parts"]
        assert [p["size_bytes"] for p in parts] == [5 * MIB, 5 * MIB, MIB]
        etags = []
        for part in parts:
            start = (part["part_number"] - 1) * upload["part_size"]
            chunk = io.BytesIO(body[start : start + part["size_bytes"]])
            async with api.http.put(part["url"], data=chunk) as r:
                assert r.status == 200, await r.text()
                etags.append({"part_number": part["part_number"], "etag": r.headers["ETag"]})
        completion = {"json": {"parts": etags}} if send_etags else {}
        accepted = await api.json(
            "POST", f"/v1/videos/{video_id}/complete", expect=202, **completion
        )
        assert accepted["size_bytes"] == len(body)
        asset = await api.rig.asset(uuid.UUID(video_id))
        assert asset["source_sha256"] == hashlib.sha256(body).hexdigest()
        info = await api.rig.store.head(asset["source_object_key"])
        assert info is not None and info.size == len(body)
        assert await counts(api.rig.pool, video_id) == (1, 1)
    assert await api.rig.store.list_multipart_uploads("") == []


async def test_multipart_complete_before_every_part_arrived_is_refused(s3_api: Api) -> None:
    api = s3_api
    body = os.urandom(11 * MIB)
    created = await create(api, body)
    video_id, part = created["video_id"], created["upload"]["parts"][0]
    async with api.http.put(part["url"], data=io.BytesIO(body[: part["size_bytes"]])) as resp:
        assert resp.status == 200
    refused = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=409)
    assert refused["error"]["code"] == "incomplete_upload"
    assert await counts(api.rig.pool, video_id) == (0, 0)


# -- verification ------------------------------------------------------------------------------


async def test_api_put_with_wrong_checksum_or_size_is_refused(local_api: Api) -> None:
    api = local_api
    body = os.urandom(64 * 1024)
    created = await create(api, body)
    video_id, upload = created["video_id"], created["upload"]

    code, answer = await put(api, upload, os.urandom(len(body)))  # same size, other bytes
    assert (code, answer["error"]["code"]) == (422, "checksum_mismatch"), answer
    assert "SHA-256" in answer["error"]["detail"]
    code, answer = await put(api, upload, body + b"x")  # Content-Length says too much
    assert (code, answer["error"]["code"]) == (422, "size_mismatch"), answer
    assert "Content-Length" in answer["error"]["detail"]

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
        yield body
        yield b"one byte too many"

    code, answer = await put(api, upload, chunked())  # type: ignore[arg-type]
    assert (code, answer["error"]["code"]) == (422, "size_mismatch"), answer
    assert "more bytes" in answer["error"]["detail"]

    status = await api.json("GET", f"/v1/videos/{video_id}/status")
    assert status["state"] == "AWAITING_UPLOAD" and status["error_class"] == "size_mismatch"
    refused = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=409)
    assert refused["error"]["code"] == "not_uploaded"
    assert await counts(api.rig.pool, video_id) == (0, 0)
    assert [
        i async for i in api.rig.store.list(session_prefix(api.rig.tenant_id, uuid.UUID(video_id)))
    ] == []
    assert await api.rig.store.list_multipart_uploads("") == []

    # The session stays open: the right bytes are still accepted.
    code, _ = await put(api, upload, body)
    assert code == 200
    await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202)


async def test_presigned_upload_with_wrong_checksum_or_size_fails_at_complete(
    s3_api: Api,
) -> None:
    """S3 and SeaweedFS refuse a PUT whose bytes do not match the signed checksum header
    (400 BadDigest) or length (403 SignatureDoesNotMatch); moto checks neither, as some
    S3-compatible stores do not: complete reads the object back and is the check that
    always holds."""
    api = s3_api
    body = os.urandom(100 * 1024)
    for sent, code in (
        (os.urandom(len(body)), "checksum_mismatch"),
        (body + b"x", "size_mismatch"),
    ):
        created = await create(api, body)
        video_id, upload = created["video_id"], created["upload"]
        headers = {k: v for k, v in upload["headers"].items() if k != "Content-Length"}
        status, text = await put(api, {**upload, "headers": headers}, sent)
        if status != 200:  # the engine refused the bytes itself: nothing was stored
            refusal = (400, "BadDigest") if code == "checksum_mismatch" else (403, "Signature")
            assert status == refusal[0] and refusal[1] in str(text), (status, text)
            refused = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=409)
            assert refused["error"]["code"] == "not_uploaded"
            assert await counts(api.rig.pool, video_id) == (0, 0)
            continue
        failed = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=422)
        assert failed["error"]["code"] == code, failed
        again = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=422)
        assert again["error"]["code"] == code
        status_doc = await api.json("GET", f"/v1/videos/{video_id}/status")
        assert status_doc["state"] == "UPLOAD_FAILED" and status_doc["error_class"] == code
        assert ("upload", "failed") in {(e["stage"], e["event"]) for e in status_doc["timeline"]}
        key = await api.rig.pool.fetchval(
            "SELECT object_key FROM upload_sessions WHERE id = $1", uuid.UUID(video_id)
        )
        assert await api.rig.store.head(key) is None  # the bytes are gone
        assert await counts(api.rig.pool, video_id) == (0, 0)


async def test_complete_is_idempotent(local_api: Api) -> None:
    api = local_api
    body = os.urandom(32 * 1024)
    created = await create(api, body)
    video_id = created["video_id"]
    code, _ = await put(api, created["upload"], body)
    assert code == 200
    answers: list[Any] = []

    async def complete() -> None:
        answers.append(await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(complete)
    answers.append(await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202))
    assert {a["video_id"] for a in answers} == {video_id}
    assert {a["sha256"] for a in answers} == {hashlib.sha256(body).hexdigest()}
    assert await counts(api.rig.pool, video_id) == (1, 1)
    # After completion the session takes no more bytes.
    code, answer = await put(api, created["upload"], body)
    assert (code, answer["error"]["code"]) == (409, "upload_completed")


# -- access and input --------------------------------------------------------------------------


async def test_another_tenant_sees_nothing(local_api: Api) -> None:
    api = local_api
    body = os.urandom(1024)
    created = await create(api, body)
    video_id = created["video_id"]
    _, other = await api.tenant("globex")
    await api.json("GET", f"/v1/videos/{video_id}/status", key=other, expect=404)
    await api.json("PUT", f"/v1/videos/{video_id}/upload", key=other, expect=404, data=body)
    await api.json("POST", f"/v1/videos/{video_id}/complete", key=other, expect=404)
    code, _ = await put(api, created["upload"], body)
    assert code == 200
    await api.json("POST", f"/v1/videos/{video_id}/complete", key=other, expect=404)
    await api.json("POST", f"/v1/videos/{video_id}/complete", expect=202)
    await api.json("GET", f"/v1/videos/{video_id}/status", key=other, expect=404)
    missing = await api.json("GET", f"/v1/videos/{uuid.uuid4()}/status", expect=404)
    assert missing["error"]["detail"] == "no such video"


async def test_refusals(local_api: Api) -> None:
    api = local_api
    limit = api.ctx.config.api.upload_max_bytes
    too_big = {**declare(b"x"), "size_bytes": limit + 1}
    answer = await api.json("POST", "/v1/videos", json=too_big, expect=422)
    assert str(limit) in answer["error"]["detail"]
    async with api.http.post(f"{api.base}/v1/videos", json=declare(b"x")) as resp:
        assert resp.status == 401
    for bad, code in (
        ({**declare(b"x"), "sha256": "abc"}, 422),
        ({**declare(b"x"), "size_bytes": 0}, 422),
        ({**declare(b"x"), "content_type": "text/html"}, 422),
        ({**declare(b"x"), "surprise": 1}, 422),
        ({**declare(b"x"), "filename": "a\x00b"}, 400),  # out of the edge's bounds: 400
        # Python's "$" also matches before a final newline: each is refused all the same.
        ({**declare(b"x"), "sha256": hashlib.sha256(b"x").hexdigest() + "\n"}, 422),
        ({**declare(b"x"), "filename": "clip.mp4\n"}, 422),
        ({"sha256": hashlib.sha256(b"x").hexdigest()}, 422),
    ):
        answer = await api.json("POST", "/v1/videos", json=bad, expect=code)
        assert answer["error"]["detail"].startswith("request body: "), answer
    await api.json(
        "POST",
        "/v1/videos",
        data=b"{not json",
        expect=400,
        headers={"Content-Type": "application/json"},
    )
    await api.json("POST", "/v1/videos", expect=400)
    await api.json(
        "POST",
        "/v1/videos",
        data=b"size_bytes=1",
        expect=415,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    for path in ("/v1/videos/not-a-uuid/status", "/v1/videos/123/complete"):
        method = "GET" if path.endswith("status") else "POST"
        await api.json(method, path, expect=404)
    created = await create(api, b"x")
    await api.json(
        "POST",
        f"/v1/videos/{created['video_id']}/complete",
        expect=400,
        data=b'{"parts": ',
        headers={"Content-Type": "application/json"},
    )
    await api.json(
        "POST", f"/v1/videos/{created['video_id']}/complete", expect=422, json={"parts": []}
    )


async def test_the_upload_limit_is_the_documents_and_a_field_over_it_is_named(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    limit = 3 * MIB
    async with open_api(config, pool, tmp_path, upload_max_bytes=limit) as api:
        doc = await api.json("GET", "/openapi.json")
        size = doc["components"]["schemas"]["CreateVideo"]["properties"]["size_bytes"]
        assert (size["type"], size["minimum"], size["maximum"]) == ("integer", 1, limit)
        # Over the schema's maximum is refused like any field against its schema.
        over = {**declare(b"x"), "size_bytes": limit + 1}
        answer = await api.json("POST", "/v1/videos", json=over, expect=422)
        assert (answer["error"]["code"], answer["error"]["field"]) == ("too_large", "$.size_bytes")
        await api.json(
            "POST", "/v1/videos", json={**declare(b"x"), "size_bytes": limit}, expect=201
        )


async def test_an_integral_float_is_an_integer_as_the_schema_says(local_api: Api) -> None:
    api = local_api
    body = os.urandom(10)
    created = await create(api, body, size_bytes=10.0)
    code, received = await put(api, created["upload"], body)
    assert (code, received["size_bytes"]) == (200, 10)
    parts = {"parts": [{"part_number": 1.0, "etag": '"e"'}]}  # ignored by an upload to the API
    await api.json("POST", f"/v1/videos/{created['video_id']}/complete", json=parts, expect=202)
    answer = await api.json("POST", "/v1/videos", json=declare(body, size_bytes=10.5), expect=422)
    assert answer["error"]["field"] == "$.size_bytes"
    parts = {"parts": [{"part_number": 1.5, "etag": '"e"'}]}
    answer = await api.json("POST", f"/v1/videos/{uuid.uuid4()}/complete", json=parts, expect=422)
    assert answer["error"]["field"] == "$.parts[0].part_number"


async def test_playback_of_an_upload_not_completed_is_not_published_yet(local_api: Api) -> None:
    # The video exists (its status answers); it has no asset yet, so nothing is published:
    # 409 as the document says, never the 404 of a video that does not exist.
    api = local_api
    body = os.urandom(64)
    created = await create(api, body)
    video_id = created["video_id"]
    playback = f"/v1/videos/{video_id}/playback"
    for step in ("open", "uploaded"):
        answer = await api.json("GET", playback, expect=409)
        assert answer["error"]["code"] == "not_published", (step, answer)
        assert "AWAITING_UPLOAD" in answer["error"]["detail"], (step, answer)
        status = await api.json("GET", f"/v1/videos/{video_id}/status")
        assert status["state"] == "AWAITING_UPLOAD", (step, status)
        if step == "open":
            assert (await put(api, created["upload"], body))[0] == 200
    _, other = await api.tenant("globex")  # another tenant's video is missing, as ever
    await api.json("GET", playback, key=other, expect=404)
    await expire(api, video_id)
    answer = await api.json("GET", playback, expect=409)
    assert "UPLOAD_EXPIRED" in answer["error"]["detail"]
    await api.json("GET", f"/v1/videos/{uuid.uuid4()}/playback", expect=404)


# -- expiry and the reaper ---------------------------------------------------------------------


async def expire(api: Api, video_id: str) -> None:
    await api.rig.pool.execute(
        "UPDATE upload_sessions SET expires_at = now() - interval '1 second' WHERE id = $1",
        uuid.UUID(video_id),
    )


async def test_expired_sessions_refuse_and_are_reaped(local_api: Api) -> None:
    api = local_api
    store, pool = api.rig.store, api.rig.pool
    body = os.urandom(4096)
    created = await create(api, body)
    video_id = created["video_id"]
    code, _ = await put(api, created["upload"], body)
    assert code == 200
    key = await pool.fetchval(
        "SELECT object_key FROM upload_sessions WHERE id = $1", uuid.UUID(video_id)
    )
    fresh = await create(api, body)  # not expired: the reaper leaves it alone
    await expire(api, video_id)

    gone = await api.json("POST", f"/v1/videos/{video_id}/complete", expect=410)
    assert gone["error"]["code"] == "upload_expired"
    code, answer = await put(api, created["upload"], body)
    assert (code, answer["error"]["code"]) == (410, "upload_expired")
    status = await api.json("GET", f"/v1/videos/{video_id}/status")
    assert status["state"] == "UPLOAD_EXPIRED"

    planned = await reap_expired_uploads(pool, store, dry_run=True)
    assert [(str(r.video_id), r.action) for r in planned] == [(video_id, "would_expire_and_clean")]
    assert await store.head(key) is not None
    reaped = await reap_expired_uploads(pool, store)
    assert [(str(r.video_id), r.status, r.action) for r in reaped] == [
        (video_id, "EXPIRED", "expired_and_cleaned")
    ]
    assert reaped[0].deleted_objects == [key]
    assert await store.head(key) is None
    assert await reap_expired_uploads(pool, store) == []  # idempotent
    row = await pool.fetchrow(
        "SELECT status, cleaned_at FROM upload_sessions WHERE id = $1", uuid.UUID(video_id)
    )
    assert row is not None and row["status"] == "EXPIRED" and row["cleaned_at"] is not None
    await api.json("POST", f"/v1/videos/{video_id}/complete", expect=410)
    fresh_status = await api.json("GET", f"/v1/videos/{fresh['video_id']}/status")
    assert fresh_status["state"] == "AWAITING_UPLOAD"
    assert await counts(pool, video_id) == (0, 0)


async def test_reaper_aborts_an_expired_multipart_upload(s3_api: Api) -> None:
    api = s3_api
    store, pool = api.rig.store, api.rig.pool
    body = os.urandom(6 * MIB)
    created = await create(api, body)
    video_id, part = created["video_id"], created["upload"]["parts"][0]
    async with api.http.put(part["url"], data=io.BytesIO(body[: part["size_bytes"]])) as resp:
        assert resp.status == 200
    prefix = session_prefix(api.rig.tenant_id, uuid.UUID(video_id))
    assert len(await store.list_multipart_uploads(prefix)) == 1
    await expire(api, video_id)
    later = datetime.now(UTC) + timedelta(seconds=1)
    reaped = await reap_expired_uploads(pool, store, now=later)
    assert [r.aborted_uploads for r in reaped] == [[created["upload"]["upload_id"]]]
    assert await store.list_multipart_uploads(prefix) == []
    status = await api.json("GET", f"/v1/videos/{video_id}/status")
    assert status["state"] == "UPLOAD_EXPIRED"


# -- the S3 store's presigning -----------------------------------------------------------------


async def test_presigned_urls_bind_what_they_were_made_for(s3_api: Api) -> None:
    store = s3_api.rig.store
    assert isinstance(store, PresigningStore)
    assert not issubclass(LocalObjectStore, PresigningStore)  # the API carries those bytes
    key = "assets/0123/some-asset/rev/1/playback.mp4"
    await store.put_bytes(key, b"moving pictures")
    url = await store.presign_get(
        key,
        expires_seconds=60,
        content_type="video/mp4",
        content_disposition='inline; filename="clip.mp4"',
    )
    async with s3_api.http.get(url) as resp:
        assert resp.status == 200 and await resp.read() == b"moving pictures"
        assert resp.headers["Content-Type"] == "video/mp4"
        assert resp.headers["Content-Disposition"] == 'inline; filename="clip.mp4"'
    put = await store.presign_put(
        "quarantine/x/y/source.bin",
        expires_seconds=60,
        content_length=5,
        content_type="video/webm",
        sha256_hex=hashlib.sha256(b"12345").hexdigest(),
    )
    query = parse_qs(urlsplit(put.url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    signed = set(query["X-Amz-SignedHeaders"][0].split(";"))
    assert {"content-length", "content-type", "x-amz-checksum-sha256"} <= signed
    assert put.headers["Content-Length"] == "5" and put.headers["Content-Type"] == "video/webm"
    for seconds in (0, 8 * 24 * 3600):
        with pytest.raises(ValueError, match="expires_seconds"):
            await store.presign_get(key, expires_seconds=seconds)
