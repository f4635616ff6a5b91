"""SeaweedFS killed and started again on its data: what the chaos harness relies on.

``scripts/chaos`` SIGKILLs the S3 server mid-run and starts it again on its data directory
and ports. That is a restart only if what the server acknowledged survives the kill: an
object whose upload completed is there, whole, and a multipart upload left open is still
listed, so the sweeper can abort it.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from scripts.lib import seaweedfs

from aivedio.errors import TransientError
from aivedio.store.objects.base import MIB, ObjectStore
from aivedio.store.objects.opening import open_object_store
from tests.support.s3_server import BUCKET, s3_config

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


class Server:
    """One ``weed server`` of this test's own, started and SIGKILLed at will."""

    def __init__(self, directory: Path) -> None:
        self.engine = seaweedfs.Engine.create(directory)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.engine.directory / "server.log", "ab")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(
            self.engine.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        self.engine.wait_until_ready(self.proc, seaweedfs.START_TIMEOUT_SECONDS)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def discard(self) -> None:
        if self.proc is not None:
            seaweedfs.discard(self.proc)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path / "seaweedfs")
    server.start()
    server.engine.ensure_bucket(BUCKET)
    try:
        yield server
    finally:
        server.discard()


async def read_when_back(store: ObjectStore, key: str) -> bytes:
    deadline = time.monotonic() + seaweedfs.START_TIMEOUT_SECONDS
    while True:
        try:
            return await store.get_bytes(key)
        except TransientError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.2)


async def test_what_was_acknowledged_before_a_sigkill_is_there_after_the_restart(
    server: Server,
) -> None:
    small, large = b"small object", bytes(range(256)) * (48 * 1024)  # 12 MiB: 2 parts
    storage = s3_config(server.engine.endpoint, "restart")
    async with open_object_store(storage, part_size_bytes=8 * MIB) as store:
        await store.put_bytes("a/small", small, content_type="text/plain")
        await store.put_bytes("a/large.bin", large)
        left_open = await store.start_upload("a/open.bin")
        await left_open.write(b"x" * (8 * MIB))  # a full part: the upload exists
        server.kill()
        server.start()  # the same data directory and ports
        # The S3 gateway answers before the volume server has registered its volumes with
        # the master again: until then a read is an InternalError, a TransientError here
        # (the job that made it would retry). What was acknowledged must be there once the
        # engine serves reads again, within the same bounded wait a start has.
        assert await read_when_back(store, "a/small") == small
        stored = await store.get_bytes("a/large.bin")
        assert hashlib.sha256(stored).digest() == hashlib.sha256(large).digest()
        (pending,) = await store.list_multipart_uploads("a/")
        assert pending.key == "a/open.bin"
        await store.abort_multipart_upload(pending.key, pending.upload_id)
        assert await store.list_multipart_uploads("a/") == []
        await left_open.abort()
