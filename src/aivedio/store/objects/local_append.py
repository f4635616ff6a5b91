"""Appending on the local store (``append.py`` has the contract): an append file.

The object being appended to is a pending upload of the local store, in its usual layout
(``.tmp/<id>.upload`` names the key, ``.tmp/<id>.part`` holds the bytes), so everything that
lists and aborts pending uploads (the reaper of expired sessions, the stale upload scan)
handles it unchanged. Each appender opens the file, truncates it to its mark (bytes written
after the mark by a request that was refused or cut off do not count), and writes in batches
of at least ``LOCAL_WRITE_BATCH_BYTES``: the chunks are held as they came (no copy) and one
worker-thread call feeds the caller's hashers and writes them, so a batch costs one thread
hop and the event loop reads on meanwhile. At a checkpoint the file is fsynced: a mark is
recorded only after its bytes are on disk. ``finish`` publishes the file as the object with
the store's own commit (fsync, one atomic rename).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

from aivedio.errors import NotFoundError, TransientError
from aivedio.store.objects.append import AppendMark, Hasher, feed, feed_aside
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
        self._held: list[bytes] = []  # written, not yet handed to the file
        self._held_bytes = 0
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

    async def write(self, *chunks: bytes, hashers: Sequence[Hasher] = ()) -> None:
        # Held until a batch is full: bytes only (a caller's bytearray could change meanwhile).
        taken = [chunk if type(chunk) is bytes else bytes(chunk) for chunk in chunks]
        size = sum(len(chunk) for chunk in taken)
        self._offset += size
        self._held += taken
        self._held_bytes += size
        self._max_buffered_bytes = max(self._max_buffered_bytes, self._held_bytes)
        if self._held_bytes < LOCAL_WRITE_BATCH_BYTES:
            await feed_aside(hashers, taken)
            return
        held, self._held, self._held_bytes = self._held, [], 0
        await moving_bytes(
            f"appending to {self._key!r}", self._hash_and_write, hashers, taken, held
        )

    def _hash_and_write(
        self, hashers: Sequence[Hasher], chunks: list[bytes], held: list[bytes]
    ) -> None:
        """One thread call: the new chunks into the hashers, every held one into the file."""
        feed(hashers, chunks)
        assert self.file is not None
        self.file.writelines(held)

    async def checkpoint(self) -> AppendMark:
        held, self._held, self._held_bytes = self._held, [], 0
        await moving_bytes(f"syncing the append of {self._key!r}", self._sync, held)
        return AppendMark(offset=self._offset)

    def _sync(self, held: list[bytes]) -> None:
        assert self.file is not None
        self.file.writelines(held)
        self.file.flush()
        os.fsync(self.file.fileno())

    async def finish(self) -> ObjectInfo:
        file, self.file = self.file, None
        assert file is not None
        tail = b"".join(self._held)  # less than a batch: the commit's own thread call writes it
        self._held, self._held_bytes = [], 0
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
