"""``make_runner`` on a bare application (as the worker's health port uses it): a malformed
request is one warning and a fixed JSON 400, whether the parser or a handler meets it."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import anyio
import pytest
from aiohttp import web

from aivedio import logs
from aivedio.http_server import MALFORMED_EVENT, make_runner

pytestmark = pytest.mark.anyio

KEY = "av_live_074ccae1_w7xWYJXs-4ddWXQAqDIaTaI0h8zXHLsE1VE5MaBIO44"


async def read_body(request: web.Request) -> web.Response:
    return web.Response(text=f"{len(await request.read())} bytes")


async def crash(request: web.Request) -> web.Response:
    raise RuntimeError(f"a bug that holds {KEY}")


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, io.StringIO]]:
    stream = io.StringIO()
    logs.configure("info", "json", stream=stream)
    app = web.Application()
    app.router.add_post("/read", read_body)
    app.router.add_get("/crash", crash)
    runner = make_runner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], stream
    finally:
        await runner.cleanup()
        logs.reset()


async def exchange(port: int, data: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as sock:
        await sock.send(data)
        answer = b""
        with anyio.move_on_after(3):
            try:
                while True:
                    answer += await sock.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return answer


def events(stream: io.StringIO) -> list[dict[str, object]]:
    """All but asyncio's own (the tests run its debug mode, which reports every server)."""
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [e for e in lines if e.get("logger") != "asyncio"]


async def test_a_parse_error_is_one_warning_and_a_body_that_echoes_nothing(
    served: tuple[int, io.StringIO],
) -> None:
    port, stream = served
    answer = await exchange(
        port, b"GET /x HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\x01\r\n\r\n"
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400"
    assert json.loads(body) == {
        "error": {"code": "bad_request", "detail": "malformed HTTP request"}
    }
    (event,) = events(stream)
    assert event == {
        "event": MALFORMED_EVENT,
        "level": "warning",
        "error_class": "BadHttpMessage",
        "reason": "Invalid header value char",
        "status": 400,
        "remote": "127.0.0.1",
        "timestamp": event["timestamp"],
    }


async def test_a_body_a_handler_cannot_decode_is_one_warning_not_a_traceback(
    served: tuple[int, io.StringIO],
) -> None:
    port, stream = served
    garbage = (KEY * 2).encode()[:64]
    answer = await exchange(
        port,
        b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 64\r\n\r\n"
        + garbage,
    )
    assert answer.split(b" ")[1] == b"400", answer
    await anyio.sleep(0.2)  # aiohttp drains the body after the answer and meets the error again
    (event,) = events(stream)
    assert (event["event"], event["error_class"]) == (MALFORMED_EVENT, "RequestPayloadError")
    assert event["reason"] == "Can not decode content-encoding: gzip"


async def test_our_own_bugs_keep_their_traceback_but_lose_the_secret(
    served: tuple[int, io.StringIO],
) -> None:
    port, stream = served
    answer = await exchange(port, b"GET /crash HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.split(b" ")[1] == b"500", answer
    assert KEY.encode() not in answer
    (event,) = events(stream)
    assert (event["event"], event["logger"], event["level"]) == (
        "stdlib_log",
        "aiohttp.server",
        "error",
    )
    assert "RuntimeError: a bug that holds av_***" in str(event["exception"])
    assert "w7xWYJXs" not in stream.getvalue()
