"""Appending on the local store (``append.py`` has the contract): an append file.

The object being appended to is a pending upload of the local store, in its usual layout
(``.tmp/<id>.upload`` names the key, ``.tmp/<id>.part`` holds the bytes), so everything that
lists and aborts pending uploads (the reaper of expired sessions, the stale upload scan)
handles it unchanged. Each appender opens the file, truncates it to its mark (bytes written
after the mark by a request that was refused or cut off do not count), writes in batches of
``LOCAL_WRITE_BATCH_BYTES`` from worker threads, and at a checkpoint fsyncs it: a mark is
recorded only after its bytes are on disk. ``finish`` publishes the file as the object with
the store's own commit (fsync, one atomic rename).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

from aivedio.errors import NotFoundError, TransientError
from aivedio.store.objects.append import AppendMark
from aivedio.store.objects.base import ObjectInfo
from aivedio.store.objects.local_disk import in_thread, moving_bytes
from aivedio.store.objects.local_upload import LOCAL_WRITE_BATCH_BYTES


class AppendableStore(Protocol):
    """What a ``LocalAppender`` needs of ``LocalObjectStore``."""

    def _tmp_path(self, upload_id: str, suffix: str) -> Path: ...

    def _commit(
        self,
        upload_id: str,
        file: BinaryIO,
        key: str,
        content_type: str,
        tail: bytes | bytearray = b"",
        dirs: set[Path] | None = None,
    ) -> ObjectInfo: ...


class LocalAppender:
    def __init__(
        self, store: AppendableStore, key: str, append_id: str, offset: int, content_type: str
    ) -> None:
        self._store = store
        self._key = key
        self._append_id = append_id
        self._content_type = content_type
        self._offset = offset
        self._buffer = bytearray()
        self._max_buffered_bytes = 0
        self.file: BinaryIO | None = None

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def max_buffered_bytes(self) -> int:
        return self._max_buffered_bytes

    def open_at(self, offset: int) -> None:
        """Open the append file and cut it back to ``offset`` (thread)."""
        if not self._store._tmp_path(self._append_id, "upload").exists():
            raise NotFoundError(f"no append of {self._key!r} under that id")
        file = open(self._store._tmp_path(self._append_id, "part"), "r+b")  # noqa: SIM115
        size = os.fstat(file.fileno()).st_size
        if size < offset:
            file.close()
            # A recorded mark is fsynced first, so this is a lost disk write, not a race.
            raise TransientError(f"append of {self._key!r} holds {size} bytes, {offset} recorded")
        file.truncate(offset)
        file.seek(offset)
        self.file = file

    async def write(self, chunk: bytes) -> None:
        self._buffer += chunk
        self._offset += len(chunk)
        self._max_buffered_bytes = max(self._max_buffered_bytes, len(self._buffer))
        if len(self._buffer) >= LOCAL_WRITE_BATCH_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        data, self._buffer = self._buffer, bytearray()
        assert self.file is not None
        await moving_bytes(f"appending to {self._key!r}", self.file.write, data)

    async def checkpoint(self) -> AppendMark:
        await self._flush()
        await in_thread(f"syncing the append of {self._key!r}", self._sync)
        return AppendMark(offset=self._offset)

    def _sync(self) -> None:
        assert self.file is not None
        self.file.flush()
        os.fsync(self.file.fileno())

    async def finish(self) -> ObjectInfo:
        file, self.file = self.file, None
        assert file is not None
        tail, self._buffer = self._buffer, bytearray()
        return await moving_bytes(
            f"publishing {self._key!r}",
            self._store._commit,
            self._append_id,
            file,
            self._key,
            self._content_type,
            tail,
        )

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


@asynccontextmanager
async def open_local_append(
    store: AppendableStore, key: str, append_id: str, mark: AppendMark, content_type: str
) -> AsyncIterator[LocalAppender]:
    appender = LocalAppender(store, key, append_id, mark.offset, content_type)
    await in_thread(f"opening the append of {key!r}", appender.open_at, mark.offset)
    try:
        yield appender
    finally:
        await in_thread(f"closing the append of {key!r}", appender.close)
