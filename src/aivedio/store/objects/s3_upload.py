"""The multipart upload of the S3 object store (``S3Upload``, made by ``S3ObjectStore``).

* **Bounded memory and concurrency.** ``write`` copies each byte once, into a part-sized
  buffer; a full part waits for one of ``parts_in_flight`` slots, so a slow store blocks the
  writer. At most ``parts_in_flight + 1`` buffers exist, reused for the whole upload (one goes
  back to the pool once its part is acknowledged): memory stays near ``part_size_bytes x
  (parts_in_flight + 1)``, with no page faults of a fresh buffer a part (``aivedio.memory``).
* **A part is sent from its buffer, not copied** (``_PartBody``): botocore gets it as a
  file-like object, aiohttp as an async iterable of ``memoryview`` slices. Being file-like, it
  goes with ``Expect: 100-continue``: the store can refuse it before its bytes are on the wire.
* **Parts run in a task group owned by the upload**, inside a driver task started in the
  store's task group: never inside the caller's cancel scopes, never outliving the store, no
  bare ``create_task``. The first failing part wins: it cancels its siblings, the driver aborts
  the multipart upload (shielded), and the writer's next ``write`` or ``complete`` raises it.
* **Every part carries its checksum** (SHA-256, or CRC32 when ``[storage] s3_part_checksum``
  says so: ``part_checksums.py``), so S3 rejects a part corrupted on the way; a store that
  echoes a different checksum raises ``ChecksumMismatchError`` too. An object smaller than
  one part is one ``PutObject`` with the same checksum, and nothing is sent before a full
  part exists: an abandoned small upload costs no request. The object's own SHA-256 is its
  writer's to compute and check (the fetch hashes the body as it streams).
* **Control requests are shielded and bounded** (``CreateMultipartUpload``, the final
  ``PutObject`` or ``CompleteMultipartUpload``, ``AbortMultipartUpload``): cancelled midway,
  they would leave an upload whose id we never learnt, or an object in an unknown state.

This module does not import ``s3`` (which imports it): the upload reaches the client, the task
group and the error translation through its store, typed ``UploadingStore``.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from aivedio.errors import AivedioError, ChecksumMismatchError, TooLargeError, TransientError
from aivedio.logs import get_logger
from aivedio.store.objects.base import ABORT_TIMEOUT_SECONDS, ObjectInfo, UploadContextMixin
from aivedio.store.objects.part_checksums import PartChecksum, check_echoed
from aivedio.transfer_cpu import measuring

log = get_logger("aivedio.store.objects.base")

MAX_PARTS = 10_000  # S3's maximum part number
MIN_PART_SIZE_BYTES = 5 * 1024 * 1024  # S3's minimum for every part but the last
# Deadline of a shielded control request (create, final put/complete); past it we give up.
CONTROL_REQUEST_TIMEOUT_SECONDS = 120.0
# What each part (and a single put) carries, for the store to verify.


SEND_PIECE_BYTES = 1024 * 1024  # a part goes to aiohttp in slices of this size


class _PartBody:
    """A part's bytes, read in place from its buffer (see the module docstring).

    botocore takes it as a file-like blob (``read``; ``__len__`` is its Content-Length;
    ``seek`` rewinds it before a retry); aiohttp sends it as an async iterable. ``read``
    copies, as a file's would, and exists for botocore, which does not call it for a part
    whose checksum we supply and whose payload is not signed.
    """

    def __init__(self, buffer: bytearray, size: int) -> None:
        self._view = memoryview(buffer)[:size]
        self._position = 0

    def __len__(self) -> int:
        return len(self._view)

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(len(self._view), self._position + size)
        data = bytes(self._view[self._position : end])
        self._position = max(self._position, end)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: len(self._view)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def __aiter__(self) -> AsyncIterator[memoryview]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[memoryview]:
        for start in range(0, len(self._view), SEND_PIECE_BYTES):
            yield self._view[start : start + SEND_PIECE_BYTES]


def validate_part_size(part_size_bytes: int) -> None:
    if part_size_bytes < MIN_PART_SIZE_BYTES:
        raise ValueError(f"part_size_bytes must be >= {MIN_PART_SIZE_BYTES} (S3's minimum)")


def _etag(value: Any) -> str | None:
    return str(value).strip('"') if value else None


class UploadingStore(Protocol):
    """What an ``S3Upload`` needs of the store that made it (``S3ObjectStore``)."""

    bucket: str
    part_size_bytes: int
    parts_in_flight: int
    part_checksum: PartChecksum
    _client: Any
    _live_uploads: weakref.WeakSet[S3Upload]

    def _map_errors(self, action: str) -> AbstractContextManager[None]: ...

    def _task_group(self) -> TaskGroup: ...

    def _full_key(self, key: str) -> str: ...

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None: ...


class S3Upload(UploadContextMixin):
    """A multipart (or, when small, single-request) upload. See the module docstring."""

    def __init__(self, store: UploadingStore, key: str, content_type: str) -> None:
        self._store = store
        self._key = key
        self._full_key = store._full_key(key)
        self._content_type = content_type
        self._part_size_bytes = store.part_size_bytes
        self._slots = anyio.Semaphore(store.parts_in_flight)
        self._part: bytearray | None = None  # the part being filled, from the pool
        self._filled = 0  # bytes of it filled
        self._pool: list[bytearray] = []  # part-sized buffers whose parts were acknowledged
        self._bytes_written = 0
        self._buffered_bytes = 0  # accepted by write, not yet acknowledged by the store
        self._max_buffered_bytes = 0
        self._state = "open"  # open -> completing -> completed | aborted; broken on interrupt
        self._upload_id: str | None = None
        self._next_part_number = 1
        self._parts: dict[int, dict[str, Any]] = {}
        self._failure: Exception | None = None
        self._parts_group: TaskGroup | None = None
        self._no_more_parts = anyio.Event()
        self._driver_done = anyio.Event()
        self._remote_closed = False
        store._live_uploads.add(self)

    @property
    def key(self) -> str:
        return self._key

    @property
    def upload_id(self) -> str | None:
        """The multipart upload id, once the first part was sent."""
        return self._upload_id

    @property
    def bytes_written(self) -> int:
        return self._bytes_written

    @property
    def max_buffered_bytes(self) -> int:
        return self._max_buffered_bytes

    def _account(self, delta_bytes: int) -> None:
        self._buffered_bytes += delta_bytes
        self._max_buffered_bytes = max(self._max_buffered_bytes, self._buffered_bytes)

    def _require_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"upload of {self._key!r} is {self._state}; only abort() is valid")

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # -- writing -------------------------------------------------------------------------

    async def write(self, chunk: bytes) -> None:
        self._require_open()
        try:
            self._raise_failure()
            self._bytes_written += len(chunk)
            self._account(len(chunk))
            view = memoryview(chunk).cast("B")
            while view:
                if self._part is None:
                    self._part = (
                        self._pool.pop() if self._pool else bytearray(self._part_size_bytes)
                    )
                taken = min(len(view), self._part_size_bytes - self._filled)
                # Through a memoryview: a bytearray's own slice assignment first copies any
                # value that is not a bytearray into a temporary one (twice the copying).
                memoryview(self._part)[self._filled : self._filled + taken] = view[:taken]
                self._filled += taken
                view = view[taken:]
                if self._filled == self._part_size_bytes:
                    await self._submit_part()
        except BaseException:
            self._state = "broken"
            raise

    def _take_part(self) -> tuple[bytearray, int]:
        """The buffer filled so far and how much of it is filled, removed from the upload."""
        part, filled = self._part or bytearray(), self._filled
        self._part, self._filled = None, 0
        return part, filled

    async def _submit_part(self) -> None:
        """Hand the part filled so far to a part task once a slot is free."""
        if self._next_part_number > MAX_PARTS:
            raise TooLargeError(f"object {self._key!r}: more than {MAX_PARTS} parts")
        if self._upload_id is None:
            await self._create()
        await self._slots.acquire()  # backpressure: wait while parts_in_flight are running
        if self._failure is not None or self._driver_done.is_set() or self._parts_group is None:
            self._slots.release()
            self._raise_failure()
            raise TransientError(f"upload of {self._key!r}: the object store was closed")
        number = self._next_part_number
        self._next_part_number += 1
        self._parts_group.start_soon(self._upload_part, number, *self._take_part())

    async def _create(self) -> None:
        client, group = self._store._client, self._store._task_group()
        with (
            self._store._map_errors(f"starting upload of {self._key!r}"),
            anyio.CancelScope(shield=True),
            anyio.fail_after(CONTROL_REQUEST_TIMEOUT_SECONDS),
        ):
            response = await client.create_multipart_upload(
                Bucket=self._store.bucket,
                Key=self._full_key,
                ContentType=self._content_type,
                ChecksumAlgorithm=self._store.part_checksum.algorithm,
            )
            self._upload_id = str(response["UploadId"])
            await group.start(self._drive)

    async def _drive(self, *, task_status: TaskStatus[None]) -> None:
        """Own the parts' task group until ``complete`` or ``abort``; abort on a failure."""
        try:
            async with anyio.create_task_group() as group:
                self._parts_group = group
                task_status.started()
                await self._no_more_parts.wait()
        except Exception:
            await self._abort_remote()  # the failure itself was recorded by the part task
        except BaseException:
            await self._abort_remote()  # the store is closing: leave no pending upload
            raise
        finally:
            self._driver_done.set()

    async def _upload_part(self, number: int, buffer: bytearray, size: int) -> None:
        try:
            checksum = await anyio.to_thread.run_sync(
                measuring("store", self._store.part_checksum.compute), memoryview(buffer)[:size]
            )
            with self._store._map_errors(f"uploading part {number} of {self._key!r}"):
                response = await self._store._client.upload_part(
                    Bucket=self._store.bucket,
                    Key=self._full_key,
                    UploadId=self._upload_id,
                    PartNumber=number,
                    Body=_PartBody(buffer, size),
                    ChecksumAlgorithm=self._store.part_checksum.algorithm,
                    **{self._store.part_checksum.field: checksum},
                )
            self._check_echo(response, checksum, f"part {number}")
            self._parts[number] = {
                "PartNumber": number,
                "ETag": response["ETag"],
                self._store.part_checksum.field: checksum,
            }
            # Acknowledged, so the store has every byte and nothing reads the buffer any
            # more: it can be refilled. (After a failure, nothing is written any more.)
            self._pool.append(buffer)
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
            raise
        finally:
            self._account(-size)
            self._slots.release()

    def _check_echo(self, response: Any, checksum: str, what: str) -> None:
        check_echoed(response, self._store.part_checksum, checksum, f"{what} of {self._key!r}")

    # -- completing ----------------------------------------------------------------------

    async def complete(self) -> ObjectInfo:
        self._require_open()
        self._state = "completing"
        try:
            self._raise_failure()
            if self._upload_id is None:
                info = await self._put_single()
            else:
                if self._filled:
                    await self._submit_part()
                self._no_more_parts.set()
                await self._driver_done.wait()
                self._raise_failure()
                info = await self._complete_multipart()
        except BaseException:
            await self.abort()
            raise
        self._state = "completed"
        self._store._live_uploads.discard(self)
        return info

    async def _put_single(self) -> ObjectInfo:
        buffer, size = self._take_part()
        data = bytes(memoryview(buffer)[:size])  # smaller than a part: one copy is cheap
        del buffer
        checksum = await anyio.to_thread.run_sync(
            measuring("store", self._store.part_checksum.compute), data
        )
        with (
            self._store._map_errors(f"putting {self._key!r}"),
            anyio.CancelScope(shield=True),
            anyio.fail_after(CONTROL_REQUEST_TIMEOUT_SECONDS),
        ):
            response = await self._store._client.put_object(
                Bucket=self._store.bucket,
                Key=self._full_key,
                Body=data,
                ContentType=self._content_type,
                ChecksumAlgorithm=self._store.part_checksum.algorithm,
                **{self._store.part_checksum.field: checksum},
            )
            self._account(-len(data))
            try:
                self._check_echo(response, checksum, "object")
            except ChecksumMismatchError:
                await self._store._client.delete_object(
                    Bucket=self._store.bucket, Key=self._full_key
                )
                raise
        return self._info(response)

    async def _complete_multipart(self) -> ObjectInfo:
        parts = [self._parts[number] for number in sorted(self._parts)]
        if len(parts) != self._next_part_number - 1:
            raise TransientError(f"upload of {self._key!r}: a part was lost before completion")
        with (
            self._store._map_errors(f"completing upload of {self._key!r}"),
            anyio.CancelScope(shield=True),
            anyio.fail_after(CONTROL_REQUEST_TIMEOUT_SECONDS),
        ):
            response = await self._store._client.complete_multipart_upload(
                Bucket=self._store.bucket,
                Key=self._full_key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},
            )
            self._remote_closed = True  # completed: nothing left to abort
        return self._info(response)

    def _info(self, response: Any) -> ObjectInfo:
        return ObjectInfo(
            key=self._key,
            size=self._bytes_written,
            etag=_etag(response.get("ETag")),
            content_type=self._content_type,
        )

    # -- aborting ------------------------------------------------------------------------

    async def abort(self) -> None:
        if self._state in {"completed", "aborted"}:
            return
        self._state = "aborted"
        self._store._live_uploads.discard(self)
        self._part, self._filled, self._pool = None, 0, []
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
            if self._parts_group is not None and not self._driver_done.is_set():
                self._parts_group.cancel_scope.cancel()
                await self._driver_done.wait()
        await self._abort_remote()

    async def _abort_remote(self) -> None:
        if self._upload_id is None or self._remote_closed:
            return
        self._remote_closed = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS) as scope:
            try:
                await self._store.abort_multipart_upload(self._key, self._upload_id)
            except AivedioError as exc:
                log.warning("object_upload_abort_failed", key=self._key, error=exc.detail)
        if scope.cancelled_caught:
            log.warning("object_upload_abort_timed_out", key=self._key, upload_id=self._upload_id)
