"""A provider's API answers are outside input too: what the poller and the refreshes read
through the guarded fetcher, from a real HTTP server on loopback, is decoded at the edge's
bounds and held to what we store, so a hostile answer is a failed poll (MalformedInputError
naming the field), never a crash of the poll job or a value stored. The moderator's
answers likewise: one that does not decode within bounds is no decision (fail-closed)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import web

from aivedio.config.load import ProviderConfig
from aivedio.config.moderation import ModerationConfig
from aivedio.errors import MalformedInputError
from aivedio.net.fetch import Fetcher, FetchLimits
from aivedio.net.policy import FetchPolicy
from aivedio.pipeline.moderation import HttpModerator, ModeratorUnavailableError, Request
from aivedio.providers import VENDORS
from aivedio.providers.seam import GenericAdapter, check_reported

pytestmark = pytest.mark.anyio


@pytest.fixture
async def answering() -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """A server answering each path with the bytes a test puts under it."""
    answers: dict[str, bytes] = {}

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=answers[request.path], content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    app.router.add_post("/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", answers
    finally:
        await runner.cleanup()


def fetcher(base: str) -> Fetcher:
    port = int(base.rsplit(":", 1)[1])
    policy = FetchPolicy(
        allowed_schemes=frozenset({"http"}),
        allowed_ports=frozenset({port}),
        allow_cidrs=("127.0.0.0/8",),
    )
    return Fetcher(policy, FetchLimits(connect_timeout_seconds=2))


def task(**output: Any) -> bytes:
    doc = {
        "id": "t1",
        "status": "SUCCEEDED",
        "outputs": [{"index": 0, "url": "https://cdn.example/t1.mp4", **output}],
    }
    return msgspec.json.encode(doc)


async def read_as_the_poller_does(adapter: GenericAdapter, task_id: str) -> None:
    got = await adapter.get_task(task_id)
    check_reported(got.provider_task_id, got.outputs)


GENERIC = [
    (b'{"id": "t1", "status": "RUNNING", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}", "$"),
    (msgspec.json.encode({"id": "t\x001", "status": "RUNNING"}), "$.id"),
    (task(expires_at="0001-01-01T00:00:00Z"), "expires_at"),
    (task(expires_at="9999-12-31T23:59:59-01:00"), "expires_at"),
    (task(size=2**62), "outputs[0].size"),
    (task(size=2**64), "outputs[0].size"),  # past uint64 too: refused where it is read
    (task(content_type=["video/mp4"]), "outputs[0].content_type"),
]


@pytest.mark.parametrize(("body", "field"), GENERIC)
async def test_a_hostile_task_answer_is_malformed_naming_the_field(
    answering: tuple[str, dict[str, bytes]], body: bytes, field: str
) -> None:
    base, answers = answering
    answers["/v1/tasks/t1"] = body
    f = fetcher(base)
    adapter = GenericAdapter("acme", ProviderConfig(api_base_url=base), f)
    try:
        with pytest.raises(MalformedInputError) as info:
            await read_as_the_poller_does(adapter, "t1")
    finally:
        await f.aclose()
    assert info.value.field == field, info.value


@pytest.mark.parametrize(
    ("completed_at", "field"),
    [(2**62, "completed_at"), ("0001-01-01T00:00:00Z", "completed_at"), (1e300, "completed_at")],
)
async def test_a_vendors_hostile_time_is_a_failed_read_not_a_crash(
    answering: tuple[str, dict[str, bytes]], completed_at: object, field: str
) -> None:
    # Unix seconds of 2^62 raised OverflowError out of the adapter (a crashed poll job).
    base, answers = answering
    answers["/v1/predictions/p1"] = msgspec.json.encode(
        {
            "id": "p1",
            "status": "succeeded",
            "completed_at": completed_at,
            "output": ["https://replicate.delivery/p1.mp4"],
        }
    )
    f = fetcher(base)
    config = ProviderConfig(adapter="replicate", api_key="k", api_base_url=base)
    adapter = VENDORS["replicate"]("replicate", config, f)
    try:
        with pytest.raises(MalformedInputError) as info:
            await adapter.get_task("p1")
    finally:
        await f.aclose()
    assert info.value.field == field


@pytest.mark.parametrize(
    "body",
    [
        b'{"decision": "allow", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"decision": "allow", "reasons": "not a list"}',
        b'{"decision": "allow", "reasons": ["a\\u0000b"]}',
    ],
)
async def test_a_hostile_moderator_answer_is_no_decision(
    answering: tuple[str, dict[str, bytes]], body: bytes
) -> None:
    # A deep answer raised RecursionError out of the job (msgspec recurses into fields it
    # skips), and a NUL in a reason reached the verdict's row.
    base, answers = answering
    answers["/moderate"] = body
    config = ModerationConfig(backend="http", url=base + "/moderate", attempts=1)
    moderator = HttpModerator(config)
    request = Request(asset_id=uuid.uuid4(), revision=1, media={}, provider_labels=[], frames=[])
    try:
        with pytest.raises(ModeratorUnavailableError, match="did not decode"):
            await moderator.check(request)
    finally:
        await moderator.aclose()
