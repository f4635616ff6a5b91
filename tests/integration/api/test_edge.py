"""The API's edge over real HTTP: bodies read whole however they arrive, and hostile but
signed bodies refused 400 naming the field, never 5xx (each case one that was found)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest

from aivedio.config.load import Config
from aivedio.store.database import Pool
from tests.support.api_rig import Api, open_api
from tests.support.edge_client import (
    SIGNERS,
    raw_post,
    signed_generic,
    signed_replicate,
    split,
    with_edge_providers,
)

pytestmark = pytest.mark.anyio

CALLBACK = "/v1/providers/{}/callbacks"


def generic_body(event_id: str = "evt-1", task_id: str = "task-1", **output: Any) -> bytes:
    out = {"index": 0, "url": "https://cdn.provider.example/out.mp4?sig=abc", **output}
    doc = {"event_id": event_id, "task_id": task_id, "status": "SUCCEEDED", "outputs": [out]}
    return msgspec.json.encode(doc)


def generic_body_status(status: str) -> bytes:
    doc = msgspec.json.decode(generic_body())
    return msgspec.json.encode({**doc, "status": status})


def replicate_body(prediction_id: str = "p-1", **changes: Any) -> bytes:
    doc = {
        "id": prediction_id,
        "status": "succeeded",
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60)),
        "output": ["https://replicate.delivery/x/out.mp4"],
        **changes,
    }
    return msgspec.json.encode(doc)


async def post(api: Api, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    async with api.http.post(api.base + path, data=body, headers=headers) as resp:
        raw = await resp.read()
        return resp.status, msgspec.json.decode(raw) if raw else None


async def recorded(pool: Pool) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM provider_outputs) AS outputs,"
        " (SELECT count(*) FROM callback_receipts) AS receipts"
    )
    assert row is not None
    return row["outputs"], row["receipts"]


# -- item 0: the whole body, however it arrives -------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_signed_callback_arriving_in_delayed_pieces_is_verified_whole(
    config: Config, pool: Pool, tmp_path: Path, chunked: bool
) -> None:
    # Two segments 0.3 s apart were answered 401 bad_signature: the signature was checked
    # over the first one only.
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        body = generic_body()
        answer = await raw_post(
            api.base, CALLBACK.format("sim"), signed_generic(body), split(body, 4), chunked=chunked
        )
        assert answer.status == 202, answer
        assert await recorded(pool) == (1, 1)


async def test_a_vendor_webhook_in_pieces_is_verified_whole(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        body = replicate_body()
        answer = await raw_post(
            api.base, CALLBACK.format("replicate"), signed_replicate(body), split(body, 3)
        )
        assert answer.status == 202, answer
        assert await recorded(pool) == (1, 1)


@pytest.mark.parametrize(
    "path",
    [CALLBACK.format("sim"), CALLBACK.format("replicate"), "/v1/generation-tasks", "/v1/videos"],
)
async def test_a_body_shorter_than_its_content_length_is_408_never_half_verified(
    config: Config, pool: Pool, tmp_path: Path, path: str
) -> None:
    async with open_api(
        with_edge_providers(config), pool, tmp_path, body_read_timeout_seconds=1.0
    ) as api:
        body = generic_body() if "sim" in path else replicate_body()
        headers = {**SIGNERS["sim" if "sim" in path else "replicate"](body), **api.auth()}
        answer = await raw_post(
            api.base,
            path,
            headers,
            split(body, 2),
            content_length=len(body) + 100,
            timeout_seconds=10,
        )
        assert answer.status == 408, answer
        assert 0.5 < answer.seconds < 5.0, answer.seconds
        assert answer.headers.get("connection") == "close"
        error = answer.json()["error"]  # type: ignore[index]
        assert error["code"] == "body_timeout", error
        assert await recorded(pool) == (0, 0)


async def test_an_upload_that_stops_sending_is_408_and_leaves_the_session_open(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    """A large upload may take hours, but one that sends nothing for the read timeout must
    not hold its handler (and an open upload in the store) for ever."""
    async with open_api(config, pool, tmp_path, body_read_timeout_seconds=1.0) as api:
        body = b"x" * 4096
        created = await api.json(
            "POST",
            "/v1/videos",
            json={"size_bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()},
            expect=201,
        )
        path = urlsplit(created["upload"]["url"]).path
        headers = {**api.auth(), "Content-Type": "application/octet-stream"}
        answer = await raw_post(
            api.base,
            path,
            headers,
            [body[:1000]],
            content_length=len(body),
            method="PUT",
            timeout_seconds=10,
        )
        assert answer.status == 408, answer
        assert 0.5 < answer.seconds < 5.0, answer.seconds
        assert answer.json()["error"]["code"] == "body_timeout"  # type: ignore[index]
        status = await api.json("GET", f"/v1/videos/{created['video_id']}/status")
        assert status["state"] == "AWAITING_UPLOAD", status
        left = [
            p
            for p in (tmp_path / "objects").rglob("*")
            if p.is_file() and (".tmp" in p.parts or "put-" in p.name)
        ]
        assert left == [], "the upload was not aborted"


async def test_every_json_route_reads_a_body_in_pieces_whole(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        watch = msgspec.json.encode({"provider": "luma", "task_id": "gen-1"})
        answer = await raw_post(
            api.base,
            "/v1/generation-tasks",
            {**api.auth(), "Content-Type": "application/json"},
            split(watch, 3),
            gap_seconds=0.2,
        )
        assert answer.status == 201, answer
        video = msgspec.json.encode({"size_bytes": 10, "sha256": "ab" * 32})
        answer = await raw_post(
            api.base,
            "/v1/videos",
            {**api.auth(), "Content-Type": "application/json"},
            split(video, 3),
            gap_seconds=0.2,
            chunked=True,
        )
        assert answer.status == 201, answer


async def test_length_and_chunked_together_and_a_chunked_body_over_the_limit_are_refused(
    config: Config, pool: Pool, tmp_path: Path
) -> None:
    async with open_api(
        with_edge_providers(config), pool, tmp_path, max_callback_bytes=2048
    ) as api:
        body = generic_body()
        smuggled = await raw_post(
            api.base,
            CALLBACK.format("sim"),
            signed_generic(body),
            [body],
            chunked=True,
            content_length=len(body),
        )
        assert smuggled.status == 400, smuggled
        big = generic_body(url="https://cdn.provider.example/" + "x" * 4000)
        over = await raw_post(
            api.base,
            CALLBACK.format("sim"),
            signed_generic(big),
            split(big, 3),
            gap_seconds=0.05,
            chunked=True,
        )
        assert over.status == 413, over
        assert await recorded(pool) == (0, 0)


# -- item 2: hostile but signed bodies ------------------------------------------------------------


def deep(levels: int) -> bytes:
    return b'{"event_id": "e", "task_id": "t", "status": "RUNNING", "x": ' + (
        b"[" * levels + b"]" * levels + b"}"
    )


NUL = "a\x00b"
GENERIC_CASES = [
    # (name, body, the field named)
    ("deep nesting", deep(1000), "$"),
    ("size 2^62", generic_body(size=2**62), "$.outputs[0].size"),
    ("size past 64 bits", generic_body(size=2**64), "$.outputs[0].size"),
    ("NUL in task_id", generic_body(task_id=NUL), "$.task_id"),
    ("NUL in event_id", generic_body(event_id=NUL), "$.event_id"),
    ("NUL in content_type", generic_body(content_type="mp4" + NUL), "$.outputs[0].content_type"),
    ("NUL in a key", generic_body(**{"x\x00": 1}), "$.outputs[0]['x\\x00']"),
    ("year 1", generic_body(expires_at="0001-01-01T00:00:00Z"), "$.outputs[0].expires_at"),
    ("year 9999", generic_body(expires_at="9999-12-31T23:59:59Z"), "$.outputs[0].expires_at"),
    ("past 9999", generic_body(expires_at="9999-12-31T23:59:59-01:00"), "$.outputs[0].expires_at"),
    ("infinity", generic_body(expires_at="infinity"), "$.outputs[0].expires_at"),
    ("no offset", generic_body(expires_at="2026-01-01T00:00:00"), "$.outputs[0].expires_at"),
    # Python's "$" matches before a final newline: "succeeded\n" passed ^…$ and was recorded
    # as progress (the task FAILED); a sha256 with a newline could never match the bytes.
    ("newline after the status", generic_body_status("succeeded\n"), "$.status"),
    ("newline after sha256", generic_body(sha256="ab" * 32 + "\n"), "$.outputs[0].sha256"),
]


@pytest.mark.parametrize(
    ("name", "body", "field"), GENERIC_CASES, ids=[c[0] for c in GENERIC_CASES]
)
async def test_a_hostile_signed_callback_is_400_naming_the_field(
    config: Config, pool: Pool, tmp_path: Path, name: str, body: bytes, field: str
) -> None:
    # Deep nesting and 2^62 were 500s, a NUL 503 (a retry forever), year 1 and 9999 202s
    # (stored as -infinity, which then stopped the fetch and the sweeper).
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        status, answer = await post(api, CALLBACK.format("sim"), body, signed_generic(body))
        assert status == 400, (name, answer)
        assert answer["error"]["code"] == "malformed", answer
        assert answer["error"]["field"] == field, answer
        assert await recorded(pool) == (0, 0)


@pytest.mark.parametrize("stamp", ["{now}.123", "{now}.0", "+{now}", "{now}e0"])
async def test_a_signature_timestamp_that_is_not_whole_seconds_is_refused(
    config: Config, pool: Pool, tmp_path: Path, stamp: str
) -> None:
    # 1764652834.123 was accepted: the header is an integer count of seconds.
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        body = generic_body()
        timestamp = stamp.format(now=int(time.time()))
        status, answer = await post(
            api, CALLBACK.format("sim"), body, signed_generic(body, timestamp)
        )
        assert (status, answer["error"]["code"]) == (401, "bad_signature"), answer
        assert await recorded(pool) == (0, 0)


VENDOR_CASES = [
    ("replicate", replicate_body(prediction_id=NUL), "$.id"),
    ("replicate", replicate_body(extra=msgspec.Raw(b"[" * 1000 + b"]" * 1000)), "$"),
    ("replicate", replicate_body(completed_at="0001-01-01T00:00:00Z"), "completed_at"),
    ("replicate", replicate_body(completed_at=2**62), "completed_at"),
    ("replicate", replicate_body(output=["https://x/" + NUL]), "$.output[0]"),
    (
        "fal",
        msgspec.json.encode(
            {
                "request_id": "req-1",
                "status": "OK",
                "payload": {"video": {"url": "https://fal.media/x.mp4", "file_size": 2**62}},
            }
        ),
        "outputs[0].size",
    ),
    (
        "fal",
        msgspec.json.encode(
            {
                "request_id": "req-1",
                "status": "OK",
                "payload": {"video": {"url": "https://fal.media/x.mp4", "content_type": {"a": 1}}},
            }
        ),
        "outputs[0].content_type",
    ),
    ("luma", msgspec.json.encode({"id": "g" * 5000, "state": "completed"}), "task_id"),
    ("luma", deep(5000), "$"),
]


@pytest.mark.parametrize(("vendor", "body", "field"), VENDOR_CASES)
async def test_a_hostile_vendor_webhook_is_400_naming_the_field(
    config: Config, pool: Pool, tmp_path: Path, vendor: str, body: bytes, field: str
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        status, answer = await post(api, CALLBACK.format(vendor), body, SIGNERS[vendor](body))
        assert status == 400, answer
        assert (answer["error"]["code"], answer["error"].get("field")) == ("malformed", field)
        assert await recorded(pool) == (0, 0)


API_CASES = [
    (
        "/v1/videos",
        b'{"size_bytes": 1, "sha256": "'
        + b"a" * 64
        + b'", "x": '
        + b"[" * 1000
        + b"]" * 1000
        + b"}",
        400,
        "$",
    ),
    (
        "/v1/videos",
        msgspec.json.encode({"size_bytes": 1, "sha256": "a" * 64, "filename": NUL}),
        400,
        "$.filename",
    ),
    (
        "/v1/videos",
        msgspec.json.encode({"size_bytes": 2**64, "sha256": "a" * 64}),
        400,
        "$.size_bytes",
    ),
    (
        "/v1/generation-tasks",
        b'{"provider": "luma", "task_id": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        400,
        "$",
    ),
    (
        "/v1/generation-tasks",
        msgspec.json.encode({"provider": "luma", "task_id": NUL}),
        400,
        "$.task_id",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), API_CASES)
async def test_a_hostile_api_body_is_400_naming_the_field(
    config: Config, pool: Pool, tmp_path: Path, path: str, body: bytes, status: int, field: str
) -> None:
    async with open_api(with_edge_providers(config), pool, tmp_path) as api:
        headers = {**api.auth(), "Content-Type": "application/json"}
        got, answer = await post(api, path, body, headers)
        assert got == status, answer
        assert answer["error"]["field"] == field, answer
