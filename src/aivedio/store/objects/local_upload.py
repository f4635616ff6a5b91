"""An upload into the local store: bytes gathered in memory, written to ``.tmp/<id>.part`` in
worker threads, published by the store's ``_commit`` (fsync, then one atomic rename).

A thread hop is not abandoned on cancellation, so the file state always matches what the
upload believes. ``abort`` is shielded and bounded, and leaves no temp file behind.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import BinaryIO, Protocol

import anyio

from aivedio.errors import AivedioError
from aivedio.logs import get_logger
from aivedio.store.objects.base import ABORT_TIMEOUT_SECONDS, ObjectInfo, UploadContextMixin
from aivedio.store.objects.local_disk import in_thread, moving_bytes

log = get_logger("aivedio.store.objects.base")

# Bytes gathered in memory before one thread hop writes them to the temp file.
LOCAL_WRITE_BATCH_BYTES = 1024 * 1024


class CommittingStore(Protocol):
    """What a ``LocalUpload`` needs of the store that made it (``LocalObjectStore``)."""

    _live_uploads: weakref.WeakSet[LocalUpload]

    def _commit(
        self,
        upload_id: str,
        file: BinaryIO,
        key: str,
        content_type: str,
        tail: bytes | bytearray = b"",
        dirs: set[Path] | None = None,
    ) -> ObjectInfo: ...

    def _discard(self, upload_id: str, file: BinaryIO) -> None: ...


class LocalUpload(UploadContextMixin):
    """An upload into ``.tmp/<id>.part``; published by ``complete`` with one rename."""

    def __init__(
        self,
        store: CommittingStore,
        key: str,
        content_type: str,
        upload_id: str,
        file: BinaryIO,
    ) -> None:
        self._store = store
        self._key = key
        self._content_type = content_type
        self._upload_id = upload_id
        self._file = file
        self._buffer = bytearray()
        self._bytes_written = 0
        self._max_buffered_bytes = 0
        self._state = "open"  # open -> completing -> completed | aborted; broken on interrupt
        store._live_uploads.add(self)

    @property
    def key(self) -> str:
        return self._key

    @property
    def upload_id(self) -> str:
        return self._upload_id

    @property
    def bytes_written(self) -> int:
        return self._bytes_written

    @property
    def max_buffered_bytes(self) -> int:
        return self._max_buffered_bytes

    def _require_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"upload of {self._key!r} is {self._state}; only abort() is valid")

    async def write(self, chunk: bytes) -> None:
        self._require_open()
        try:
            self._buffer += chunk
            self._bytes_written += len(chunk)
            self._max_buffered_bytes = max(self._max_buffered_bytes, len(self._buffer))
            if len(self._buffer) >= LOCAL_WRITE_BATCH_BYTES:
                await self._flush()
        except BaseException:
            self._state = "broken"
            raise

    async def _flush(self) -> None:
        data, self._buffer = self._buffer, bytearray()  # hand over, no copy
        await moving_bytes(f"writing {self._key!r}", self._file.write, data)

    async def complete(self) -> ObjectInfo:
        self._require_open()
        self._state = "completing"
        try:
            # The buffered tail is written by the commit's own thread call: one hop fewer.
            tail, self._buffer = self._buffer, bytearray()
            info = await moving_bytes(
                f"publishing {self._key!r}",
                self._store._commit,
                self._upload_id,
                self._file,
                self._key,
                self._content_type,
                tail,
            )
        except BaseException:
            await self.abort()
            raise
        self._state = "completed"
        self._store._live_uploads.discard(self)
        return info

    async def abort(self) -> None:
        if self._state in {"completed", "aborted"}:
            return
        self._state = "aborted"
        self._store._live_uploads.discard(self)
        self._buffer = bytearray()
        with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
            try:
                await in_thread(
                    f"aborting {self._key!r}", self._store._discard, self._upload_id, self._file
                )
            except AivedioError as exc:
                log.warning("object_upload_abort_failed", key=self._key, error=exc.detail)
