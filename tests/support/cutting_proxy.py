"""A TCP proxy on loopback that drops one connection in the middle of a request body.

A client talks to the proxy as to the server; the connection carrying the client-to-server
byte that passes ``cut_after_bytes`` (counted over every connection: clients open one per
request) is closed on both sides at that point (the server sees a body end early, the
client a connection reset), once. Every other connection is passed through
untouched. What a dropped mobile connection does to an upload, on demand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import SocketAttribute, SocketStream


class CuttingProxy:
    def __init__(self, cut_after_bytes: int) -> None:
        self.cut_after_bytes = cut_after_bytes
        self.target_port = 0  # set once the server listens
        self.port = 0
        self.cuts = 0
        self.forwarded_bytes = 0

    async def _serve(self, client: SocketStream) -> None:
        server = await anyio.connect_tcp("127.0.0.1", self.target_port)
        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(self._back, server, client)
            try:
                async for data in client:
                    sent = self.forwarded_bytes
                    if self.cuts == 0 and sent + len(data) > self.cut_after_bytes:
                        await server.send(data[: self.cut_after_bytes - sent])
                        self.cuts += 1
                        break
                    self.forwarded_bytes += len(data)
                    await server.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            tg.cancel_scope.cancel()

    async def _back(self, server: SocketStream, client: SocketStream) -> None:
        try:
            async for data in server:
                await client.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass


@asynccontextmanager
async def cutting_proxy(cut_after_bytes: int) -> AsyncIterator[CuttingProxy]:
    proxy = CuttingProxy(cut_after_bytes)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy.port = listener.extra(SocketAttribute.local_port)  # noqa: S610
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, proxy._serve)
        yield proxy
        tg.cancel_scope.cancel()
