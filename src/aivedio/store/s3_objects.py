"""The S3 object store over aiobotocore (AWS S3 or any S3-compatible endpoint).

Choices, and the failure each prevents:

* **Multipart with bounded concurrency and memory.** ``write`` fills a buffer; each full
  part (``part_size_bytes``) waits for one of ``parts_in_flight`` slots before it is handed
  to a part task. A slow store therefore blocks the writer, and memory stays within about
  ``part_size_bytes x (parts_in_flight + 1)`` instead of growing with the object.
* **Structured concurrency.** Part uploads run in a task group owned by the upload. That
  group lives in a "driver" task started in the store's own task group, so it is nested in
  the store's lifetime and never in the caller's cancel scopes: a failing part cannot cancel
  unrelated work of the caller, and no part task outlives the store (no bare
  ``create_task``).
* **First failure wins.** A failing part cancels its siblings (task-group semantics), the
  driver aborts the multipart upload (shielded) and the writer's next ``write`` or
  ``complete`` raises that failure. No pending upload is left to be billed.
* **Every part carries its SHA-256** (``ChecksumSHA256``), so S3 rejects a part corrupted
  on the way; when the store echoes a checksum that differs from ours (stores that compute
  instead of verifying) we raise ``ChecksumMismatchError`` too. Objects smaller than one
  part go through a single ``PutObject`` with the same checksum.
* **Shielded, bounded control requests.** ``CreateMultipartUpload``, the final
  ``PutObject``/``CompleteMultipartUpload`` and ``AbortMultipartUpload`` run shielded from
  cancellation with a deadline: a cancellation in the middle would leave an upload whose id
  we never learnt (unabortable until a reaper runs) or an object in an unknown state.
* **Lazy multipart creation.** Nothing is sent until a full part exists, so an abandoned
  small upload costs no request, and small objects cost one request.
* **Checksum calculation "when_required".** We supply checksums ourselves; botocore's
  automatic CRC trailers (aws-chunked encoding) are rejected by several S3-compatible stores.
* **Errors are translated here:** not found -> ``NotFoundError`` (``None`` from ``head``),
  throttling, 5xx and connection failures -> ``TransientError``, checksum rejections ->
  ``ChecksumMismatchError``, other refusals (access denied, no such bucket) ->
  ``ObjectStoreError`` (not retried).
* **Closing aborts what is open.** ``aclose`` (and leaving ``async with``) aborts every
  upload neither completed nor aborted, so a shutdown does not strand billed parts.
* **The key prefix** of ``s3://bucket/prefix`` is added and stripped here; callers only ever
  see their own keys.
"""

from __future__ import annotations

import base64
import builtins
import collections
import functools
import hashlib
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, Self

import aiohttp
import anyio
import anyio.to_thread
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from anyio.abc import TaskGroup, TaskStatus
from botocore import exceptions as boto_exc

from aivedio.config import StorageConfig
from aivedio.errors import (
    AivedioError,
    ChecksumMismatchError,
    ConfigError,
    NotFoundError,
    TooLargeError,
    TransientError,
)
from aivedio.logs import get_logger
from aivedio.store.objects import (
    ABORT_TIMEOUT_SECONDS,
    DEFAULT_CONTENT_TYPE,
    MIB,
    READ_CHUNK_BYTES,
    ObjectInfo,
    ObjectStoreConveniences,
    ObjectStoreError,
    PendingUpload,
    Upload,
    UploadContextMixin,
    parse_storage_url,
    validate_key,
    validate_prefix,
    validate_range,
)

log = get_logger("aivedio.store.objects")

DEFAULT_PART_SIZE_BYTES = 8 * MIB
MIN_PART_SIZE_BYTES = 5 * MIB  # S3's minimum for every part but the last
MAX_PARTS = 10_000  # S3's maximum part number
DEFAULT_PARTS_IN_FLIGHT = 4
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
DEFAULT_READ_TIMEOUT_SECONDS = 60.0
# Deadline of a shielded control request (create, final put/complete); past it we give up.
CONTROL_REQUEST_TIMEOUT_SECONDS = 120.0
MAX_POOL_CONNECTIONS = 32
CHECKSUM_ALGORITHM = "SHA256"

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchUpload"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
        "PriorRequestNotComplete",
    }
)
_CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})
_TRANSIENT_BOTO = (
    boto_exc.HTTPClientError,  # read timeouts, closed connections, streaming errors
    boto_exc.ConnectionError,  # endpoint unreachable, connect timeouts, proxy errors
    boto_exc.IncompleteReadError,
)


def _error_code(exc: boto_exc.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _translate_client_error(action: str, exc: boto_exc.ClientError) -> AivedioError:
    error = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    code = _error_code(exc)
    status = int(meta.get("HTTPStatusCode", 0) or 0)
    detail = f"{action}: S3 {code or status}: {error.get('Message', '')}".rstrip(": ")
    if code in _NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket"):
        return NotFoundError(detail)
    if code in _CHECKSUM_CODES or (code == "InvalidRequest" and "checksum" in detail.lower()):
        return ChecksumMismatchError(detail)
    if code in _TRANSIENT_CODES or status == 429 or status >= 500:
        retry_after = meta.get("HTTPHeaders", {}).get("retry-after")
        seconds = float(retry_after) if retry_after and retry_after.isdigit() else None
        return TransientError(detail, retry_after_seconds=seconds)
    return ObjectStoreError(detail)


@contextmanager
def map_s3_errors(action: str) -> Iterator[None]:
    """Translate botocore and aiohttp exceptions into the project's errors."""
    try:
        yield
    except AivedioError:
        raise
    except boto_exc.ClientError as exc:
        raise _translate_client_error(action, exc) from exc
    except _TRANSIENT_BOTO as exc:
        raise TransientError(f"{action}: {type(exc).__name__}: {exc}") from exc
    except boto_exc.FlexibleChecksumError as exc:
        raise ChecksumMismatchError(f"{action}: {exc}") from exc
    except (boto_exc.NoCredentialsError, boto_exc.PartialCredentialsError) as exc:
        raise ConfigError(f"{action}: no usable S3 credentials: {exc}") from exc
    except boto_exc.BotoCoreError as exc:
        raise ObjectStoreError(f"{action}: {type(exc).__name__}: {exc}") from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TransientError(f"{action}: {type(exc).__name__}: {exc}") from exc


class _Chunks:
    """Written chunks kept as they came (no copy on write); a part is joined once, on take."""

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, chunk: bytes) -> None:
        if chunk:
            self._chunks.append(chunk if type(chunk) is bytes else bytes(chunk))
            self._size += len(chunk)

    def take(self, size_bytes: int) -> bytes:
        """The first ``size_bytes`` as one bytes object, removed from the buffer."""
        parts: list[bytes] = []
        wanted = size_bytes
        while wanted and self._chunks:
            head = self._chunks.popleft()
            if len(head) > wanted:
                parts.append(head[:wanted])
                self._chunks.appendleft(head[wanted:])
                wanted = 0
            else:
                parts.append(head)
                wanted -= len(head)
        self._size -= size_bytes - wanted
        return b"".join(parts)


def sha256_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")


def _etag(value: Any) -> str | None:
    return str(value).strip('"') if value else None


def _utc(value: Any) -> datetime | None:
    return value.astimezone(UTC) if isinstance(value, datetime) else None


@functools.cache
def _shared_session() -> Any:
    """One botocore session per process, its S3 models loaded once (call in a thread).

    Creating a client parses several large JSON models (~0.1 s); doing that on the event loop
    for every store would stall every other task, and a fresh session per store re-parses.
    """
    session = get_session()
    loader = session.get_component("data_loader")
    with suppress(Exception):  # best effort: a model missing here just loads later
        for type_name in ("service-2", "endpoint-rule-set-1", "paginators-1"):
            loader.load_service_model("s3", type_name)
        for name in ("partitions", "endpoints", "_retry", "sdk-default-configuration"):
            loader.load_data(name)
    return session


class S3Upload(UploadContextMixin):
    """A multipart (or, when small, single-request) upload. See the module docstring."""

    def __init__(self, store: S3ObjectStore, key: str, content_type: str) -> None:
        self._store = store
        self._key = key
        self._full_key = store._full_key(key)
        self._content_type = content_type
        self._part_size_bytes = store.part_size_bytes
        self._slots = anyio.Semaphore(store.parts_in_flight)
        self._buffer = _Chunks()
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
            self._buffer.append(chunk)
            self._bytes_written += len(chunk)
            self._account(len(chunk))
            while len(self._buffer) >= self._part_size_bytes:
                await self._submit_part(self._part_size_bytes)
        except BaseException:
            self._state = "broken"
            raise

    async def _submit_part(self, size_bytes: int) -> None:
        """Hand the first ``size_bytes`` of the buffer to a part task once a slot is free."""
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
        data = self._buffer.take(size_bytes)  # the part's one copy
        self._parts_group.start_soon(self._upload_part, number, data)

    async def _create(self) -> None:
        client, group = self._store._client, self._store._task_group()
        with (
            map_s3_errors(f"starting upload of {self._key!r}"),
            anyio.CancelScope(shield=True),
            anyio.fail_after(CONTROL_REQUEST_TIMEOUT_SECONDS),
        ):
            response = await client.create_multipart_upload(
                Bucket=self._store.bucket,
                Key=self._full_key,
                ContentType=self._content_type,
                ChecksumAlgorithm=CHECKSUM_ALGORITHM,
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

    async def _upload_part(self, number: int, data: bytes) -> None:
        try:
            checksum = await anyio.to_thread.run_sync(sha256_b64, data)
            with map_s3_errors(f"uploading part {number} of {self._key!r}"):
                response = await self._store._client.upload_part(
                    Bucket=self._store.bucket,
                    Key=self._full_key,
                    UploadId=self._upload_id,
                    PartNumber=number,
                    Body=data,
                    ChecksumAlgorithm=CHECKSUM_ALGORITHM,
                    ChecksumSHA256=checksum,
                )
            self._check_echo(response, checksum, f"part {number}")
            self._parts[number] = {
                "PartNumber": number,
                "ETag": response["ETag"],
                "ChecksumSHA256": checksum,
            }
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
            raise
        finally:
            self._account(-len(data))
            self._slots.release()

    def _check_echo(self, response: Any, checksum: str, what: str) -> None:
        echoed = response.get("ChecksumSHA256")
        if echoed is not None and echoed != checksum:
            raise ChecksumMismatchError(
                f"{what} of {self._key!r}: the store computed SHA-256 {echoed}, we sent {checksum}"
            )

    # -- completing ----------------------------------------------------------------------

    async def complete(self) -> ObjectInfo:
        self._require_open()
        self._state = "completing"
        try:
            self._raise_failure()
            if self._upload_id is None:
                info = await self._put_single()
            else:
                if self._buffer:
                    await self._submit_part(len(self._buffer))
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
        data = self._buffer.take(len(self._buffer))
        checksum = await anyio.to_thread.run_sync(sha256_b64, data)
        with (
            map_s3_errors(f"putting {self._key!r}"),
            anyio.CancelScope(shield=True),
            anyio.fail_after(CONTROL_REQUEST_TIMEOUT_SECONDS),
        ):
            response = await self._store._client.put_object(
                Bucket=self._store.bucket,
                Key=self._full_key,
                Body=data,
                ContentType=self._content_type,
                ChecksumAlgorithm=CHECKSUM_ALGORITHM,
                ChecksumSHA256=checksum,
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
            map_s3_errors(f"completing upload of {self._key!r}"),
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
        self._buffer = _Chunks()
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


class S3ObjectStore(ObjectStoreConveniences):
    """Objects in ``bucket`` under ``prefix``. Use as ``async with``: it owns the client and
    the task group in which uploads run their parts."""

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        part_size_bytes: int = DEFAULT_PART_SIZE_BYTES,
        parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT,
        connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
        read_timeout_seconds: float = DEFAULT_READ_TIMEOUT_SECONDS,
        max_attempts: int = 3,
    ) -> None:
        if part_size_bytes < MIN_PART_SIZE_BYTES:
            raise ValueError(f"part_size_bytes must be >= {MIN_PART_SIZE_BYTES} (S3's minimum)")
        if not bucket:
            raise ValueError("bucket must not be empty")
        if parts_in_flight < 1:
            raise ValueError("parts_in_flight must be >= 1")
        prefix = prefix.strip("/")
        if prefix:
            validate_prefix(prefix + "/")
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.part_size_bytes = part_size_bytes
        self.parts_in_flight = parts_in_flight
        self._endpoint_url = endpoint_url or None
        self._region = region
        self._access_key_id = access_key_id or None
        self._secret_access_key = secret_access_key or None
        self._client_config = AioConfig(
            connect_timeout=connect_timeout_seconds,
            read_timeout=read_timeout_seconds,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=MAX_POOL_CONNECTIONS,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # Custom endpoints (MinIO, Ceph, moto) rarely have wildcard DNS for buckets.
            # Every part and put carries our own ChecksumSHA256, which the store verifies, so
            # SigV4 need not hash each payload once more (botocore does so on plain-HTTP
            # endpoints, synchronously, on the event loop).
            s3={
                "addressing_style": "path" if endpoint_url else "auto",
                "payload_signing_enabled": False,
            },
        )
        self._stack: AsyncExitStack | None = None
        self._client: Any = None
        self._group: TaskGroup | None = None
        self._closed = False
        # Uploads neither completed nor aborted, so closing the store can abort them.
        self._live_uploads: weakref.WeakSet[S3Upload] = weakref.WeakSet()

    @classmethod
    def from_config(cls, config: StorageConfig, **tuning: Any) -> S3ObjectStore:
        scheme, bucket, prefix = parse_storage_url(config.url)
        if scheme != "s3":
            raise ConfigError("config error: storage.url: not an s3:// URL")
        return cls(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=config.s3_endpoint_url or None,
            region=config.s3_region,
            access_key_id=config.s3_access_key_id or None,
            secret_access_key=config.s3_secret_access_key or None,
            **tuning,
        )

    async def __aenter__(self) -> Self:
        session = await anyio.to_thread.run_sync(_shared_session)
        stack = AsyncExitStack()
        try:
            self._client = await stack.enter_async_context(
                session.create_client(
                    "s3",
                    endpoint_url=self._endpoint_url,
                    region_name=self._region,
                    aws_access_key_id=self._access_key_id,
                    aws_secret_access_key=self._secret_access_key,
                    config=self._client_config,
                )
            )
            self._group = await stack.enter_async_context(anyio.create_task_group())
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        stack, self._stack = self._stack, None
        if stack is None:
            return
        if self._group is not None:
            self._group.cancel_scope.cancel()  # safe here: the body of ``async with`` is over
        self._group = None
        await stack.aclose()

    async def aclose(self) -> None:
        """Refuse new uploads and abort the ones still open (shielded). The client and the
        task group are released when the ``async with`` block exits; this may be called
        earlier, from any task, without disturbing the caller's cancel scopes."""
        self._closed = True
        for upload in builtins.list(self._live_uploads):
            await upload.abort()

    def _task_group(self) -> TaskGroup:
        if self._closed:
            raise TransientError("the object store is closing")
        if self._group is None:
            raise RuntimeError("S3ObjectStore used outside 'async with'")
        return self._group

    def _full_key(self, key: str) -> str:
        return self.prefix + key

    def _own_key(self, full_key: str) -> str:
        return full_key[len(self.prefix) :]

    # -- uploads -------------------------------------------------------------------------

    async def start_upload(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> Upload:
        validate_key(key)
        self._task_group()
        return S3Upload(self, key, content_type)

    async def list_multipart_uploads(self, prefix: str = "") -> builtins.list[PendingUpload]:
        validate_prefix(prefix)
        found: builtins.list[PendingUpload] = []
        markers: dict[str, str] = {}
        while True:
            with map_s3_errors("listing pending uploads"):
                page = await self._client.list_multipart_uploads(
                    Bucket=self.bucket, Prefix=self._full_key(prefix), **markers
                )
            for upload in page.get("Uploads", []):
                initiated = _utc(upload.get("Initiated")) or datetime.fromtimestamp(0, tz=UTC)
                found.append(
                    PendingUpload(self._own_key(upload["Key"]), upload["UploadId"], initiated)
                )
            if not page.get("IsTruncated"):
                return found
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        validate_key(key)
        try:
            with map_s3_errors(f"aborting upload of {key!r}"):
                await self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self._full_key(key), UploadId=upload_id
                )
        except NotFoundError:
            pass  # already aborted or completed

    # -- reads ---------------------------------------------------------------------------

    async def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        try:
            with map_s3_errors(f"head {key!r}"):
                response = await self._client.head_object(
                    Bucket=self.bucket, Key=self._full_key(key)
                )
        except NotFoundError:
            return None
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            etag=_etag(response.get("ETag")),
            last_modified=_utc(response.get("LastModified")),
            content_type=response.get("ContentType"),
        )

    async def get(
        self, key: str, *, start: int | None = None, end: int | None = None
    ) -> AsyncIterator[bytes]:
        validate_key(key)
        validate_range(start, end)
        request: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full_key(key)}
        if start is not None or end is not None:
            request["Range"] = f"bytes={start or 0}-{'' if end is None else end}"
        action = f"reading {key!r}"
        with map_s3_errors(action):
            try:
                response = await self._client.get_object(**request)
            except boto_exc.ClientError as exc:
                if _error_code(exc) == "InvalidRange":
                    return  # the range starts at or past the end: no bytes, as locally
                raise
        async with response["Body"] as body:
            while True:
                with map_s3_errors(action):
                    chunk = await body.read(READ_CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        validate_prefix(prefix)
        token: dict[str, str] = {}
        while True:
            with map_s3_errors("listing objects"):
                page = await self._client.list_objects_v2(
                    Bucket=self.bucket, Prefix=self._full_key(prefix), **token
                )
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    key=self._own_key(item["Key"]),
                    size=int(item["Size"]),
                    etag=_etag(item.get("ETag")),
                    last_modified=_utc(item.get("LastModified")),
                )
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    # -- deletes -------------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        validate_key(key)
        with map_s3_errors(f"deleting {key!r}"):
            await self._client.delete_object(Bucket=self.bucket, Key=self._full_key(key))
