"""Appending to one object across requests and processes: the seam of resumable uploads.

A tus upload (``api/tus.py``) arrives as any number of ``PATCH`` requests, possibly through
different API processes, with restarts and dropped connections between them. ``Upload``
(``base.py``) cannot carry it: it lives in one process and aborts on exit. Here the state of
an object being appended to is a small value, ``AppendMark``, that the caller records in
the database after every request; any process can open an ``Appender`` at a mark, write
more bytes, and either ``checkpoint`` (everything written is stored for good: a new mark)
or ``finish`` (publish the object under its key).

Rules both stores keep:

* **The mark is the truth.** Bytes written after it and never checkpointed do not count: the
  next ``open_append`` at that mark ignores them (the local store truncates its file back to
  the mark; on S3, parts numbered after the mark are overwritten and never named in the
  completion). So a request refused midway (a checksum mismatch, a lost writer lease) needs
  no cleanup: its caller simply does not record the new mark.
* **Memory is bounded**: the local store holds at most ``LOCAL_WRITE_BATCH_BYTES`` plus one
  write's chunks; S3 at most ``part_size_bytes x (parts_in_flight + 1)`` per appender,
  whatever the body's size.
* **Hashes ride along with the bytes.** ``write`` feeds the chunks to the caller's hashers
  (the upload's SHA-256, a ``PATCH``'s checksum) in the order written, in the pass that
  stores them where the store can (the local store: one worker-thread call hashes and
  writes a batch), and they have seen every chunk once ``write`` returns.
* **S3 parts are exactly ``part_size_bytes``** except the last (S3's 5 MiB minimum holds for
  every part but the last): bytes that do not fill a part when a request ends are stored as
  a tail object (``AppendMark.tail_key``, under the ``scratch_prefix`` the caller gives) and
  read back by the next appender, at most one part's worth, to start its first part.
* **One appender per object at a time.** The stores do not lock; the caller does (a writer
  lease in the database).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

import anyio
import anyio.to_thread
import msgspec

from aivedio.store.objects.base import DEFAULT_CONTENT_TYPE, ObjectInfo


class AppendMark(msgspec.Struct, frozen=True, kw_only=True):
    """How far an appended object got, as recorded after a request.

    ``offset``: bytes stored for good. S3 only: ``parts`` (ETag and base64 SHA-256 of parts
    1..n, each ``part_size_bytes``) hold the first ``n x part_size_bytes`` of them,
    ``tail_key`` the rest (None when none). The parts are kept rather than listed from S3
    when the upload completes: an upload started with a checksum algorithm is completed
    with each part's checksum, which not every engine lists (SeaweedFS does not)."""

    offset: int = 0
    parts: tuple[tuple[str, str], ...] = ()
    tail_key: str | None = None


class Hasher(Protocol):
    """What ``write`` feeds (``hashlib``'s objects)."""

    def update(self, data: bytes, /) -> None: ...


# Chunks at least this big in all are hashed in a worker thread (hashlib releases the GIL),
# so a large body does not hold the event loop for a millisecond and more per write.
THREAD_FEED_BYTES = 256 * 1024


def feed(hashers: Sequence[Hasher], chunks: Sequence[bytes]) -> None:
    """Each chunk to each hasher, in order."""
    for chunk in chunks:
        for hasher in hashers:
            hasher.update(chunk)


async def feed_aside(hashers: Sequence[Hasher], chunks: Sequence[bytes]) -> None:
    """``feed``, in a worker thread when the chunks are big."""
    if not hashers:
        return
    if sum(len(chunk) for chunk in chunks) >= THREAD_FEED_BYTES:
        await anyio.to_thread.run_sync(feed, hashers, chunks)
    else:
        feed(hashers, chunks)


class Appender(Protocol):
    """Bytes appended at a mark; use from one task, inside ``open_append``'s block."""

    @property
    def offset(self) -> int:
        """The mark's offset plus every byte written since."""
        ...

    @property
    def max_buffered_bytes(self) -> int:
        """High-water mark of bytes held in memory (tests and the benchmark prove it flat)."""
        ...

    async def write(self, *chunks: bytes, hashers: Sequence[Hasher] = ()) -> None:
        """Append ``chunks`` in order, each fed to every one of ``hashers`` too; returns once
        the hashers have seen them and the store has room (backpressure). A ``bytes`` chunk
        may be held, not copied, until a batch is written; a mutable buffer is copied."""
        ...

    async def checkpoint(self) -> AppendMark:
        """Store everything written for good; the mark to record. The appender stays open."""
        ...

    async def finish(self) -> ObjectInfo:
        """Publish everything written (and checkpointed before) as the object. After a
        crash between a finish and its caller's record of it, a second finish at the same
        mark answers the object that the first one published."""
        ...


@runtime_checkable
class AppendingStore(Protocol):
    """What a store offers for resumable uploads (both stores do)."""

    async def begin_append(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> str:
        """Start an object to append to; the id to open it by (and to abort it with
        ``abort_multipart_upload``, which is also how the reaper removes an abandoned one)."""
        ...

    def open_append(
        self,
        key: str,
        append_id: str,
        mark: AppendMark,
        *,
        part_size_bytes: int,
        scratch_prefix: str,
        content_type: str = DEFAULT_CONTENT_TYPE,
    ) -> AbstractAsyncContextManager[Appender]:
        """An appender at ``mark``. Leaving the block without ``checkpoint``/``finish``
        drops what was written since (the mark still holds). ``NotFoundError`` when the
        append id is gone (aborted, or finished: then ``head(key)`` has the object)."""
        ...
