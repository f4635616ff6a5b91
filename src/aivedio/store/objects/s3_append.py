"""Appending on S3 (``append.py`` has the contract): parts of one multipart upload.

An appender fills a part-sized buffer (starting with the tail object of its mark, if any)
and, each time it is full, sends it as the next part from a task of its own, while the
request's body keeps arriving: at most ``parts_in_flight`` parts are in flight, and a writer
waits for a slot (backpressure), so memory stays near ``part_size_bytes x (parts_in_flight +
1)``. Each part carries its SHA-256 (``ChecksumSHA256``; ``part_checksums.py`` says why not
the CRC32 of ``S3Upload``'s), and is sent from its buffer without a copy (``_PartBody``).

``checkpoint`` waits for the parts in flight and stores the bytes that do not fill a part
as a tail object named for the offset it ends at (a new key each time, so a checkpoint that
is never recorded cannot spoil the recorded one); its mark names every part sent (ETag and
SHA-256). ``finish`` sends what is left as the last part (S3 allows the last part to be
small) and completes the upload with exactly the parts of the mark and its own: a part
numbered past the mark by a refused request is not part of the object. A finish whose
upload is gone, because a previous finish completed it before its caller could record that,
answers the object when its size is the expected one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from aivedio.errors import NotFoundError, TooLargeError, TransientError
from aivedio.store.objects.append import AppendMark, Hasher, feed_aside
from aivedio.store.objects.base import ObjectInfo, UploadedPart
from aivedio.store.objects.part_checksums import sha256_b64
from aivedio.store.objects.s3_upload import MAX_PARTS, _PartBody
from aivedio.transfer_cpu import measuring


class PartStore(Protocol):
    """What an ``S3Appender`` needs of ``S3ObjectStore``."""

    parts_in_flight: int

    async def put_part(
        self, key: str, upload_id: str, number: int, body: Any, checksum: str
    ) -> str: ...

    async def get_bytes(
        self, key: str, *, start: int | None = None, end: int | None = None, max_bytes: int = ...
    ) -> bytes: ...

    async def put_bytes(self, key: str, data: bytes, *, content_type: str = ...) -> ObjectInfo: ...

    async def complete_multipart(
        self, key: str, upload_id: str, parts: list[UploadedPart]
    ) -> ObjectInfo: ...

    async def head(self, key: str) -> ObjectInfo | None: ...


class S3Appender:
    def __init__(
        self,
        store: PartStore,
        key: str,
        upload_id: str,
        mark: AppendMark,
        part_size_bytes: int,
        scratch_prefix: str,
        group: TaskGroup,
    ) -> None:
        self._store = store
        self._key = key
        self._upload_id = upload_id
        self._mark = mark
        self._part_size = part_size_bytes
        self._scratch = scratch_prefix
        self._group = group
        self._slots = anyio.Semaphore(store.parts_in_flight)
        self._pool: list[bytearray] = []
        self._part: bytearray | None = None
        self._filled = 0
        self._parts: dict[int, tuple[str, str]] = dict(enumerate(mark.parts, start=1))
        self._next = len(mark.parts) + 1
        self._offset = mark.offset
        self._held = 0  # bytes in buffers: filling, or in flight
        self._max_buffered_bytes = 0
        self._failure: Exception | None = None

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def max_buffered_bytes(self) -> int:
        return self._max_buffered_bytes

    def _account(self, delta: int) -> None:
        self._held += delta
        self._max_buffered_bytes = max(self._max_buffered_bytes, self._held)

    async def load_tail(self) -> None:
        """Start the first part with the mark's tail object."""
        expected = self._mark.offset - len(self._mark.parts) * self._part_size
        if not 0 <= expected < self._part_size or (expected > 0) != bool(self._mark.tail_key):
            raise TransientError(f"append of {self._key!r}: an inconsistent mark {self._mark}")
        if self._mark.tail_key is None:
            return
        tail = await self._store.get_bytes(self._mark.tail_key, max_bytes=self._part_size)
        if len(tail) != expected:
            raise TransientError(
                f"append of {self._key!r}: its tail holds {len(tail)} bytes, {expected} recorded"
            )
        self._offset -= len(tail)  # write() counts them again
        await self.write(tail)

    async def write(self, *chunks: bytes, hashers: Sequence[Hasher] = ()) -> None:
        self._raise_failure()
        await feed_aside(hashers, chunks)
        for chunk in chunks:
            await self._fill(chunk)

    async def _fill(self, chunk: bytes) -> None:
        """Copy ``chunk`` into part buffers, submitting each one filled."""
        self._offset += len(chunk)
        self._account(len(chunk))
        view = memoryview(chunk).cast("B")
        while view:
            if self._part is None:
                self._part = self._pool.pop() if self._pool else bytearray(self._part_size)
            taken = min(len(view), self._part_size - self._filled)
            memoryview(self._part)[self._filled : self._filled + taken] = view[:taken]
            self._filled += taken
            view = view[taken:]
            if self._filled == self._part_size:
                await self._submit()

    async def _submit(self) -> None:
        if self._next > MAX_PARTS:
            raise TooLargeError(f"append of {self._key!r}: more than {MAX_PARTS} parts")
        await self._slots.acquire()
        if self._failure is not None:
            self._slots.release()
            self._raise_failure()
        part, filled = self._part or bytearray(), self._filled
        self._part, self._filled = None, 0
        self._group.start_soon(self._send, self._next, part, filled)
        self._next += 1

    async def _send(self, number: int, buffer: bytearray, size: int) -> None:
        try:
            checksum = await anyio.to_thread.run_sync(
                measuring("store", sha256_b64), memoryview(buffer)[:size]
            )
            etag = await self._store.put_part(
                self._key, self._upload_id, number, _PartBody(buffer, size), checksum
            )
            self._parts[number] = (etag, checksum)
            self._pool.append(buffer)
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
        finally:
            self._account(-size)
            self._slots.release()

    async def _drain(self) -> None:
        """Wait for every part in flight; raise the first failure."""
        count = self._store.parts_in_flight
        for _ in range(count):
            await self._slots.acquire()
        for _ in range(count):
            self._slots.release()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def checkpoint(self) -> AppendMark:
        await self._drain()
        tail_key = None
        if self._filled:
            assert self._part is not None
            tail_key = f"{self._scratch}tail-{self._offset}.bin"
            await self._store.put_bytes(tail_key, bytes(memoryview(self._part)[: self._filled]))
        sent = tuple(self._parts[number] for number in range(1, self._next))
        self._mark = AppendMark(offset=self._offset, parts=sent, tail_key=tail_key)
        return self._mark

    async def finish(self) -> ObjectInfo:
        try:
            if self._filled or self._next == 1:
                await self._submit()
            await self._drain()
            parts = [
                UploadedPart(number, etag, checksum_sha256=checksum)
                for number, (etag, checksum) in sorted(self._parts.items())
                if number < self._next
            ]
            if len(parts) != self._next - 1:
                raise TransientError(f"append of {self._key!r}: a part was lost before completion")
            return await self._store.complete_multipart(self._key, self._upload_id, parts)
        except (NotFoundError, TransientError):
            # The upload is gone: a previous finish completed it (S3 answers NoSuchUpload;
            # moto a 500 to a part of a completed upload). Its object, when it is whole.
            info = await self._store.head(self._key)
            if info is None or info.size != self._offset:
                raise
            return info


@asynccontextmanager
async def open_s3_append(
    store: PartStore,
    key: str,
    upload_id: str,
    mark: AppendMark,
    *,
    part_size_bytes: int,
    scratch_prefix: str,
) -> AsyncIterator[S3Appender]:
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        appender = S3Appender(store, key, upload_id, mark, part_size_bytes, scratch_prefix, group)
        try:
            await appender.load_tail()
            yield appender
        except Exception as exc:
            failure = exc  # raised as itself below, not inside the task group's exception group
        finally:
            # Parts of a request that neither checkpointed nor finished: not needed (their
            # numbers are past the mark), so not waited for.
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
