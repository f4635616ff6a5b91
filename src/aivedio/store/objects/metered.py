"""Object store calls counted for ``/metrics``: a wrapper around any ``ObjectStore``.

The worker wraps the store it opens once, so every stage's calls are counted at the one seam
they all go through, whichever store (local or S3) sits behind it; the stores themselves
know nothing of metrics.

What is counted, and why this way:

* **One count a call, by operation and outcome.** ``outcome`` is ``ok`` or the error class
  the store's seam translated the failure into (``transient``, ``object_store``,
  ``not_found``, ...: ``errors.py`` is the one list), ``cancelled`` when the caller's
  deadline or a drain cut the call short, ``internal`` for anything else (a bug: the seam
  lets nothing foreign through). A missing object answered by ``head`` is an ``ok`` answer:
  the fetch stage asks before every download. The error rate of the store is therefore
  ``outcome!="ok"`` over all, without counting the questions whose answer is "no".
* **Streams are counted when they end.** ``get`` and ``list`` are counted once their
  iteration ends (exhausted, closed early, or failed), with the outcome of the whole stream.
* **An upload counts each of its calls.** ``start_upload``, every ``write`` (on S3 a write
  may send a part, and a part that fails is a store error like any other),
  ``complete_upload``, and ``abort_upload`` unless the upload completed (the ``async with``
  exit calls ``abort`` after every upload; after a completion it is a no-op, not a request).
* **Bytes by direction**: ``upload`` when a write or ``put_bytes`` was accepted, ``download``
  as chunks are handed to the reader (and ``get_bytes`` when it returns).

Presigning (``PresigningStore``) is the API's business; the worker never presigns, so the
wrapper does not offer it.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager

import anyio

from aivedio.errors import AivedioError
from aivedio.metrics import StoreMetrics
from aivedio.store.objects.base import (
    DEFAULT_CONTENT_TYPE,
    DEFAULT_GET_BYTES_MAX_BYTES,
    LocalFile,
    ObjectInfo,
    ObjectStore,
    PendingUpload,
    Upload,
    UploadContextMixin,
)

# The ``operation`` label's values.
OPERATIONS = (
    "head",
    "sizes",
    "get",
    "get_bytes",
    "download_file",
    "put_bytes",
    "store_files",
    "delete",
    "list",
    "start_upload",
    "write",
    "complete_upload",
    "abort_upload",
    "list_multipart_uploads",
    "abort_multipart_upload",
)
# The ``outcome`` label's values besides the error classes.
OK = "ok"
CANCELLED = "cancelled"
INTERNAL = "internal"
UPLOAD = "upload"
DOWNLOAD = "download"
DIRECTIONS = (UPLOAD, DOWNLOAD)


def outcome_of(exc: BaseException) -> str:
    if isinstance(exc, AivedioError):
        return exc.error_class
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return CANCELLED
    return INTERNAL


class _Counting:
    def __init__(self, metrics: StoreMetrics) -> None:
        self._metrics = metrics

    @contextmanager
    def _call(self, operation: str) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            self._count(operation, outcome_of(exc))
            raise
        self._count(operation, OK)

    def _count(self, operation: str, outcome: str) -> None:
        self._metrics.requests.labels(operation, outcome).inc()

    def _moved(self, direction: str, size: int) -> None:
        if size:
            self._metrics.bytes.labels(direction).inc(size)


class MeteredUpload(UploadContextMixin, _Counting):
    """One upload of a ``MeteredObjectStore``: the inner upload's calls, counted."""

    def __init__(self, inner: Upload, metrics: StoreMetrics) -> None:
        _Counting.__init__(self, metrics)
        self._inner = inner
        self._completed = False
        self._aborted = False

    @property
    def key(self) -> str:
        return self._inner.key

    @property
    def bytes_written(self) -> int:
        return self._inner.bytes_written

    @property
    def max_buffered_bytes(self) -> int:
        return self._inner.max_buffered_bytes

    async def write(self, chunk: bytes) -> None:
        with self._call("write"):
            await self._inner.write(chunk)
        self._moved(UPLOAD, len(chunk))

    async def complete(self) -> ObjectInfo:
        with self._call("complete_upload"):
            info = await self._inner.complete()
        self._completed = True
        return info

    async def abort(self) -> None:
        if self._completed or self._aborted:
            await self._inner.abort()  # a no-op by contract: nothing to count
            return
        self._aborted = True
        with self._call("abort_upload"):
            await self._inner.abort()


class MeteredObjectStore(_Counting):
    """``inner``'s calls, counted into ``metrics``; otherwise exactly ``inner``."""

    def __init__(self, inner: ObjectStore, metrics: StoreMetrics) -> None:
        super().__init__(metrics)
        self.inner = inner

    async def start_upload(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> Upload:
        with self._call("start_upload"):
            upload = await self.inner.start_upload(key, content_type=content_type)
        return MeteredUpload(upload, self._metrics)

    async def head(self, key: str) -> ObjectInfo | None:
        with self._call("head"):
            return await self.inner.head(key)

    async def sizes(self, keys: Sequence[str]) -> dict[str, int | None]:
        with self._call("sizes"):
            return await self.inner.sizes(keys)

    async def get(
        self, key: str, *, start: int | None = None, end: int | None = None
    ) -> AsyncIterator[bytes]:
        stream = self.inner.get(key, start=start, end=end)
        outcome = OK
        try:
            async for chunk in stream:
                self._moved(DOWNLOAD, len(chunk))
                yield chunk
        except GeneratorExit:
            raise  # the reader stopped early: the stream served what was asked
        except BaseException as exc:
            outcome = outcome_of(exc)
            raise
        finally:
            self._count("get", outcome)
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def download_file(self, key: str, path: str) -> tuple[str, int]:
        with self._call("download_file"):
            digest, size = await self.inner.download_file(key, path)
        self._moved(DOWNLOAD, size)
        return digest, size

    async def get_bytes(
        self,
        key: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_bytes: int = DEFAULT_GET_BYTES_MAX_BYTES,
    ) -> bytes:
        with self._call("get_bytes"):
            data = await self.inner.get_bytes(key, start=start, end=end, max_bytes=max_bytes)
        self._moved(DOWNLOAD, len(data))
        return data

    async def put_bytes(
        self, key: str, data: bytes, *, content_type: str = DEFAULT_CONTENT_TYPE
    ) -> ObjectInfo:
        with self._call("put_bytes"):
            info = await self.inner.put_bytes(key, data, content_type=content_type)
        self._moved(UPLOAD, len(data))
        return info

    async def store_files(self, files: Sequence[LocalFile]) -> None:
        with self._call("store_files"):
            await self.inner.store_files(files)
        self._moved(UPLOAD, sum(f.size for f in files))

    async def delete(self, key: str) -> None:
        with self._call("delete"):
            await self.inner.delete(key)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        stream = self.inner.list(prefix)
        outcome = OK
        try:
            async for info in stream:
                yield info
        except GeneratorExit:
            raise
        except BaseException as exc:
            outcome = outcome_of(exc)
            raise
        finally:
            self._count("list", outcome)
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def list_multipart_uploads(self, prefix: str = "") -> builtins.list[PendingUpload]:
        with self._call("list_multipart_uploads"):
            return await self.inner.list_multipart_uploads(prefix)

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        with self._call("abort_multipart_upload"):
            await self.inner.abort_multipart_upload(key, upload_id)

    async def aclose(self) -> None:
        await self.inner.aclose()
