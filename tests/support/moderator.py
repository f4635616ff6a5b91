"""A moderation service on loopback for tests: scripted answers, every request recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from aiohttp import web


@asynccontextmanager
async def moderator_server(
    answers: list[Any], *, delay_seconds: float = 0.0
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A moderation service on loopback: each request pops an answer (a status, or a JSON
    decision) and is recorded, then answered after ``delay_seconds`` (a moderator slower
    than the client's timeout)."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(await request.json())
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if delay_seconds:
            await anyio.sleep(delay_seconds)
        if isinstance(answer, int):
            return web.Response(status=answer)
        return web.json_response(answer)

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/moderate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/moderate", seen
    finally:
        await runner.cleanup()
