"""The embedded object store: a directory tree on a local filesystem (``file:///abs/dir``).

Uploads live in ``local_upload``, the filesystem primitives (durable writes and renames, thread
hops, ``OSError`` translation) in ``local_disk``, the listing walk in ``local_listing``.

Layout under ``root``::

    <key>                   the object's bytes, at the path its key names
    .meta/<key>             sidecar: JSON {content_type, inode}
    .tmp/<id>.upload        a pending upload: JSON {key, content_type}; its mtime = initiated
    .tmp/<id>.part          the bytes written so far
    .tmp/<id>.meta          the sidecar being prepared by ``complete``

Choices, and the failure each prevents:

* **Temp file, fsync, atomic ``os.replace``, fsync the directory.** A reader never sees a
  half-written object, and a power cut after ``complete`` returned cannot lose it or leave a
  zero-length file under the key (rename without the directory fsync can be forgotten).
* **Hidden names are the store's own.** Keys may not have segments starting with ``.``
  (``validate_key``), so ``.tmp`` and ``.meta`` can never collide with an object and
  ``list`` skips them by name alone.
* **Content type lives in a sidecar tree, not an extended attribute**, because xattrs are
  missing or limited on tmpfs, some overlay and network filesystems, and macOS. The sidecar
  records the inode of the data file it describes: a crash between the two renames of
  ``complete`` leaves a sidecar whose inode does not match, which ``head`` then ignores
  (content type ``None``) instead of reporting the previous object's type.
* **The ETag is ``inode-size-mtime_ns``** (hex): free to compute, stable while the object is
  unchanged, and different after every replacement (each upload is a new inode).
* **Disk I/O runs in worker threads** (``anyio.to_thread.run_sync``) so a slow disk never
  stalls the event loop; writes are batched to ``LOCAL_WRITE_BATCH_BYTES`` per thread hop so
  many small chunks do not cost a hop each. A thread hop is not abandoned on cancellation,
  so the file state always matches what the upload object believes.
* **Keys map to directories**, so the key ``a`` and the key ``a/b`` cannot both exist here
  (they can on S3). The platform's keys never need that; if it happens, ``complete`` raises
  ``InvalidKeyError`` naming the collision rather than corrupting either object.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import os
import shutil
import stat
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
import msgspec

from aivedio.errors import (
    ChecksumMismatchError,
    ConfigError,
    NotFoundError,
    TransientError,
)
from aivedio.store.objects.append import AppendMark
from aivedio.store.objects.base import (
    DEFAULT_CONTENT_TYPE,
    READ_CHUNK_BYTES,
    InvalidKeyError,
    LocalFile,
    ObjectInfo,
    ObjectStoreConveniences,
    PendingUpload,
    Upload,
    validate_key,
    validate_prefix,
    validate_range,
)
from aivedio.store.objects.local_append import LocalAppender, open_local_append
from aivedio.store.objects.local_disk import (
    file_etag,
    file_mtime,
    fsync_dir,
    in_thread,
    map_os_errors,
    moving_bytes,
    prune_empty_parents,
    replace_into,
    unlink_if_present,
    write_durably,
)
from aivedio.store.objects.local_listing import list_in_batches, walk_tree
from aivedio.store.objects.local_upload import LOCAL_WRITE_BATCH_BYTES as LOCAL_WRITE_BATCH_BYTES
from aivedio.store.objects.local_upload import LocalUpload as LocalUpload

# ``store_files``: files up to this size go in batches of up to BATCH_MAX_BYTES, one thread
# call a batch (a call cannot be cancelled midway, so neither may be long).
BATCH_FILE_MAX_BYTES = 8 * 1024 * 1024
BATCH_MAX_BYTES = 32 * 1024 * 1024
# ``list``: objects a thread call walks to (a store's listing visits thousands of dirs).
LIST_BATCH = 1000
TMP_DIR = ".tmp"
META_DIR = ".meta"


class _Sidecar(msgspec.Struct, frozen=True):
    content_type: str
    inode: int


class _Pending(msgspec.Struct, frozen=True):
    key: str
    content_type: str


class LocalObjectStore(ObjectStoreConveniences):
    """Objects as files under ``root`` (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"object store root must be absolute, got {root}")
        self._root = root
        self._tmp = root / TMP_DIR
        self._meta = root / META_DIR
        # Uploads neither completed nor aborted, so closing the store can abort them.
        self._live_uploads: weakref.WeakSet[LocalUpload] = weakref.WeakSet()

    async def __aenter__(self) -> LocalObjectStore:
        """Create the root and the store's own directories now, so a root that cannot be
        written fails at startup as a ``ConfigError`` rather than on the first upload."""
        try:
            await anyio.to_thread.run_sync(self._prepare)
        except OSError as exc:
            raise ConfigError(
                f"config error: storage.url: cannot use {self._root}: {exc.strerror or exc}"
            ) from exc
        return self

    def _prepare(self) -> None:
        for directory in (self._root, self._tmp, self._meta):
            directory.mkdir(parents=True, exist_ok=True)
        if not os.access(self._tmp, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable")

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Abort the uploads still open (their temp files would otherwise linger)."""
        for upload in builtins.list(self._live_uploads):
            await upload.abort()

    # -- paths ---------------------------------------------------------------------------

    def _data_path(self, key: str) -> Path:
        return self._root.joinpath(*key.split("/"))

    def _meta_path(self, key: str) -> Path:
        return self._meta.joinpath(*key.split("/"))

    def _tmp_path(self, upload_id: str, suffix: str) -> Path:
        return self._tmp / f"{upload_id}.{suffix}"

    # -- uploads -------------------------------------------------------------------------

    async def start_upload(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> Upload:
        validate_key(key)
        upload_id = uuid.uuid4().hex
        file = await in_thread(
            f"starting upload of {key!r}", self._begin, upload_id, key, content_type
        )
        return LocalUpload(self, key, content_type, upload_id, file)

    def _begin(self, upload_id: str, key: str, content_type: str) -> BinaryIO:
        self._tmp.mkdir(parents=True, exist_ok=True)
        marker = msgspec.json.encode(_Pending(key=key, content_type=content_type))
        self._tmp_path(upload_id, "upload").write_bytes(marker)
        # Closed by _commit or _discard.
        return open(self._tmp_path(upload_id, "part"), "xb")

    async def begin_append(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> str:
        """An append file (``local_append.py``): a pending upload that outlives its process."""
        validate_key(key)
        append_id = uuid.uuid4().hex
        file = await in_thread(
            f"starting an append of {key!r}", self._begin, append_id, key, content_type
        )
        await in_thread(f"starting an append of {key!r}", file.close)
        return append_id

    def open_append(
        self,
        key: str,
        append_id: str,
        mark: AppendMark,
        *,
        part_size_bytes: int,
        scratch_prefix: str,
        content_type: str = DEFAULT_CONTENT_TYPE,
    ) -> AbstractAsyncContextManager[LocalAppender]:
        """The append file at ``mark`` (parts and scratch objects are S3's business)."""
        validate_key(key)
        return open_local_append(self, key, append_id, mark, content_type)

    def _commit(
        self,
        upload_id: str,
        file: BinaryIO,
        key: str,
        content_type: str,
        tail: bytes | bytearray = b"",
        dirs: set[Path] | None = None,
    ) -> ObjectInfo:
        """Publish the upload. ``dirs``: collect the directories to fsync there instead
        of syncing them now (a batch syncs each once, before it returns)."""
        sync = fsync_dir if dirs is None else dirs.add
        if tail:
            file.write(tail)
        file.flush()
        os.fsync(file.fileno())
        st = os.fstat(file.fileno())
        file.close()
        self._check_no_collision(key)
        sidecar = self._tmp_path(upload_id, "meta")
        write_durably(sidecar, msgspec.json.encode(_Sidecar(content_type, st.st_ino)))
        data_path, meta_path = self._data_path(key), self._meta_path(key)
        part = self._tmp_path(upload_id, "part")
        if not part.exists():
            raise NotFoundError(f"upload of {key!r} was aborted before it completed")
        try:
            replace_into(sidecar, meta_path)
            replace_into(part, data_path)
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
            raise self._collision(key) from exc
        except FileNotFoundError as exc:
            raise NotFoundError(f"upload of {key!r} was aborted before it completed") from exc
        sync(meta_path.parent)
        sync(data_path.parent)
        unlink_if_present(self._tmp_path(upload_id, "upload"))
        sync(self._tmp)
        return ObjectInfo(
            key=key,
            size=st.st_size,
            etag=file_etag(st),
            last_modified=file_mtime(st),
            content_type=content_type,
        )

    async def store_files(self, files: Sequence[LocalFile]) -> None:
        """Small files a batch at a time in one thread call each (copied, published and read
        back there; every directory synced once a batch rather than once a file); a large
        one streamed as any upload is."""
        for file in files:
            validate_key(file.key)
        batch: builtins.list[LocalFile] = []
        size = 0
        for file in files:
            if file.size > BATCH_FILE_MAX_BYTES:
                await self._store_file(file)
                continue
            if batch and size + file.size > BATCH_MAX_BYTES:
                await moving_bytes("storing files", self._store_batch, batch)
                batch, size = [], 0
            batch.append(file)
            size += file.size
        if batch:
            await moving_bytes("storing files", self._store_batch, batch)

    def _store_batch(self, files: Sequence[LocalFile]) -> None:
        """Each file copied and published in turn (one open handle at a time), the
        directories synced once at the end, then each object read back."""
        dirs: set[Path] = set()
        for file in files:
            upload_id = uuid.uuid4().hex
            handle = self._begin(upload_id, file.key, file.content_type)
            try:
                with open(file.path, "rb") as source:
                    shutil.copyfileobj(source, handle, READ_CHUNK_BYTES)
                self._commit(upload_id, handle, file.key, file.content_type, dirs=dirs)
            except BaseException:
                with suppress(OSError):  # a full disk fails the close's flush too
                    handle.close()
                for suffix in ("part", "meta", "upload"):  # not published: nothing behind
                    with suppress(OSError):
                        unlink_if_present(self._tmp_path(upload_id, suffix))
                raise
        for directory in sorted(dirs):
            fsync_dir(directory)
        for file in files:
            self._read_back(file)

    def _read_back(self, file: LocalFile) -> None:
        try:
            handle, size = self._open_for_read(file.key)
        except NotFoundError:
            raise TransientError(f"{file.key}: not readable after upload") from None
        digest = hashlib.sha256()
        with handle:
            while chunk := handle.read(READ_CHUNK_BYTES):
                digest.update(chunk)
        if size != file.size:
            raise TransientError(f"{file.key}: not readable at the size written after upload")
        if digest.hexdigest() != file.sha256:
            raise ChecksumMismatchError(f"{file.key}: read back a different SHA-256")

    def _check_no_collision(self, key: str) -> None:
        path = self._data_path(key)
        if path.is_dir():
            raise self._collision(key)
        parent = path.parent
        while parent != self._root:
            if parent.exists() and not parent.is_dir():
                raise self._collision(key)
            parent = parent.parent

    @staticmethod
    def _collision(key: str) -> InvalidKeyError:
        return InvalidKeyError(
            f"object key {key!r} collides with another object: the local store maps '/' to "
            "directories, so 'a' and 'a/b' cannot both exist"
        )

    def _discard(self, upload_id: str, file: BinaryIO) -> None:
        file.close()
        for suffix in ("part", "meta", "upload"):
            unlink_if_present(self._tmp_path(upload_id, suffix))

    async def list_multipart_uploads(self, prefix: str = "") -> builtins.list[PendingUpload]:
        validate_prefix(prefix)
        return await in_thread("listing pending uploads", self._pending, prefix)

    def _pending(self, prefix: str) -> builtins.list[PendingUpload]:
        found: builtins.list[PendingUpload] = []
        try:
            entries = builtins.list(os.scandir(self._tmp))
        except FileNotFoundError:
            return found
        for entry in entries:
            upload_id, dot, suffix = entry.name.partition(".")
            if not dot or suffix != "upload":
                continue
            try:
                marker = msgspec.json.decode(Path(entry.path).read_bytes(), type=_Pending)
                initiated = file_mtime(entry.stat())
            except (FileNotFoundError, msgspec.DecodeError):
                continue  # completed or aborted while we looked, or torn by a crash
            if marker.key.startswith(prefix):
                found.append(PendingUpload(marker.key, upload_id, initiated))
        return sorted(found, key=lambda p: (p.key, p.initiated))

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        validate_key(key)
        if len(upload_id) != 32 or not all(c in "0123456789abcdef" for c in upload_id):
            return  # not one of ours: S3 would answer NoSuchUpload, which is "already gone"
        await in_thread(f"aborting upload {upload_id}", self._abort_pending, key, upload_id)

    def _abort_pending(self, key: str, upload_id: str) -> None:
        try:
            marker = self._tmp_path(upload_id, "upload").read_bytes()
        except FileNotFoundError:
            return
        try:
            if msgspec.json.decode(marker, type=_Pending).key != key:
                return
        except msgspec.DecodeError:
            pass  # a torn marker: the id matched, so clean it up
        for suffix in ("part", "meta", "upload"):
            unlink_if_present(self._tmp_path(upload_id, suffix))

    # -- reads ---------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        return await in_thread(f"head {key!r}", self._head, key)

    async def sizes(self, keys: Sequence[str]) -> dict[str, int | None]:
        """Every key's size in one thread call."""
        for key in keys:
            validate_key(key)
        return await in_thread("head", self._sizes, keys)

    def _sizes(self, keys: Sequence[str]) -> dict[str, int | None]:
        found: dict[str, int | None] = {}
        for key in keys:
            try:
                st = os.stat(self._data_path(key))
            except (FileNotFoundError, NotADirectoryError):
                found[key] = None
                continue
            found[key] = st.st_size if stat.S_ISREG(st.st_mode) else None
        return found

    def _head(self, key: str) -> ObjectInfo | None:
        try:
            st = os.stat(self._data_path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return ObjectInfo(
            key=key,
            size=st.st_size,
            etag=file_etag(st),
            last_modified=file_mtime(st),
            content_type=self._content_type(key, st.st_ino),
        )

    def _content_type(self, key: str, inode: int) -> str | None:
        try:
            sidecar = msgspec.json.decode(self._meta_path(key).read_bytes(), type=_Sidecar)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, msgspec.DecodeError):
            return None
        return sidecar.content_type if sidecar.inode == inode else None

    async def get(
        self, key: str, *, start: int | None = None, end: int | None = None
    ) -> AsyncIterator[bytes]:
        validate_key(key)
        validate_range(start, end)
        # Opened and first read in one thread call: a small object costs one hop.
        file, remaining, chunk = await moving_bytes(
            f"reading {key!r}", self._open_and_read, key, start, end
        )
        try:
            while chunk:
                remaining -= len(chunk)
                yield chunk
                if remaining <= 0:
                    return
                chunk = await moving_bytes(
                    f"reading {key!r}", file.read, min(READ_CHUNK_BYTES, remaining)
                )
        finally:
            file.close()  # a read-only descriptor: closing cannot block on I/O

    async def download_file(self, key: str, path: str) -> tuple[str, int]:
        """Copied and hashed up to BATCH_MAX_BYTES a thread call (a small object: one call;
        a call cannot be cancelled midway, so none is long)."""
        validate_key(key)
        action = f"reading {key!r}"
        digest = hashlib.sha256()
        # Opened and the first batch copied in one thread call: a small object costs one hop.
        source, target, size, done = await moving_bytes(action, self._open_copy, key, path, digest)
        try:
            while not done:
                copied, done = await moving_bytes(action, _copy_some, source, target, digest)
                size += copied
            return digest.hexdigest(), size
        finally:
            source.close()  # read-only: closing cannot block on I/O
            with map_os_errors(f"writing {path}"):
                target.close()

    def _open_copy(self, key: str, path: str, digest: Any) -> tuple[BinaryIO, BinaryIO, int, bool]:
        """Both files opened and the first batch copied (``_copy_some``)."""
        source, _ = self._open_for_read(key)
        target: BinaryIO | None = None
        try:
            target = open(path, "wb")  # noqa: SIM115 - handed to the caller, who closes it
            return source, target, *_copy_some(source, target, digest)
        except BaseException:
            source.close()
            if target is not None:
                with suppress(OSError):  # a full disk fails the close's flush too
                    target.close()
            raise

    def _open_and_read(
        self, key: str, start: int | None, end: int | None
    ) -> tuple[BinaryIO, int, bytes]:
        """Open, seek to the range and read its first chunk: the file, the bytes of the range
        and that chunk (empty when the range is)."""
        file, size = self._open_for_read(key)
        try:
            first = start or 0
            last = size - 1 if end is None else min(end, size - 1)
            if first > last:
                return file, 0, b""
            if first:
                file.seek(first)
            remaining = last - first + 1
            return file, remaining, file.read(min(READ_CHUNK_BYTES, remaining))
        except BaseException:
            file.close()
            raise

    def _open_for_read(self, key: str) -> tuple[BinaryIO, int]:
        try:
            file = open(self._data_path(key), "rb", buffering=0)  # noqa: SIM115 - closed by get
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFoundError(f"object {key!r} does not exist") from None
        return file, os.fstat(file.fileno()).st_size

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        validate_prefix(prefix)
        directory, _, name_prefix = prefix.rpartition("/")
        start = self._root.joinpath(*directory.split("/")) if directory else self._root
        walk = walk_tree(start, f"{directory}/" if directory else "", name_prefix)
        return list_in_batches(walk, LIST_BATCH)

    # -- deletes -------------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        validate_key(key)
        await in_thread(f"deleting {key!r}", self._delete, key)

    def _delete(self, key: str) -> None:
        data_path, meta_path = self._data_path(key), self._meta_path(key)
        if data_path.is_dir():
            return  # a "directory" of other keys, not an object
        unlink_if_present(data_path)
        unlink_if_present(meta_path)
        if data_path.parent.is_dir():
            fsync_dir(data_path.parent)
        prune_empty_parents(data_path, self._root)
        prune_empty_parents(meta_path, self._meta)


def _copy_some(source: BinaryIO, target: BinaryIO, digest: Any) -> tuple[int, bool]:
    """Up to BATCH_MAX_BYTES from ``source`` to ``target``, hashed: the bytes copied, and
    whether the source has ended."""
    copied = 0
    while copied < BATCH_MAX_BYTES:
        chunk = source.read(READ_CHUNK_BYTES)
        if not chunk:
            return copied, True
        digest.update(chunk)
        target.write(chunk)
        copied += len(chunk)
    return copied, False
