"""A loopback TCP proxy in front of the S3 server, so the harness can cut it off.

    python scripts/lib/chaos/proxy.py --listen-port P --target-port T

moto keeps its objects in memory: killing it would lose every object, a data-loss event
rather than a restart. The harness points the configuration at this proxy instead and
"restarts the S3 server" as an outage: SIGUSR1 drops every open connection and closes the
listening socket (new connections are refused), SIGUSR2 listens again. Logs one JSON line
per change on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time

BUFFER = 64 * 1024


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "at": time.time(), **fields}), file=sys.stderr, flush=True)


class Proxy:
    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self.handle, "127.0.0.1", self.listen_port, reuse_address=True
        )
        log("proxy_listening", port=self.listen_port, target=self.target_port)

    async def outage(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        dropped = len(self.writers)
        for writer in list(self.writers):
            with contextlib.suppress(Exception):
                transport = writer.transport
                transport.abort()
        self.writers.clear()
        log("proxy_outage", dropped_connections=dropped)

    async def resume(self) -> None:
        if self.server is None:
            await self.start()
        log("proxy_resumed")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers.update((writer, up_writer))
        try:
            await asyncio.gather(self.pipe(reader, up_writer), self.pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self.writers.discard(w)
                with contextlib.suppress(Exception):
                    w.close()

    @staticmethod
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(BUFFER):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError, RuntimeError):
            with contextlib.suppress(Exception):
                writer.transport.abort()


async def run(args: argparse.Namespace) -> None:
    proxy = Proxy(args.listen_port, args.target_port)
    await proxy.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, lambda: loop.create_task(proxy.outage()))
    loop.add_signal_handler(signal.SIGUSR2, lambda: loop.create_task(proxy.resume()))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    log("proxy_stopped", connections=proxy.connections)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--target-port", type=int, required=True)
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
