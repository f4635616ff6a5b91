"""The S3 object store over aiobotocore (AWS S3 or any S3-compatible endpoint).

Uploads (multipart, bounded concurrency and memory, per-part checksums, shielded control
requests) live in ``s3_upload``; appends (per-part SHA-256) in ``s3_append``.

Choices, and the failure each prevents:

* **Checksum calculation "when_required".** We supply checksums ourselves; botocore's
  automatic CRC trailers (aws-chunked encoding) are rejected by several S3-compatible stores.
* **Errors are translated here:** not found -> ``NotFoundError`` (``None`` from ``head``),
  throttling, 5xx and connection failures -> ``TransientError``, checksum rejections ->
  ``ChecksumMismatchError``, other refusals (access denied, no such bucket) ->
  ``ObjectStoreError`` (not retried).
* **Closing aborts what is open.** ``aclose`` (and leaving ``async with``) aborts every
  upload neither completed nor aborted, so a shutdown does not strand billed parts.
* **The key prefix** of ``s3://bucket/prefix`` is added and stripped here, unseen by callers.
* **Presigned URLs are SigV4** (``signature_version = "s3v4"``; botocore would otherwise
  presign with SigV2 against custom endpoints), so the headers they name are signed: a
  presigned PUT binds its Content-Length, Content-Type and SHA-256, and a client cannot
  send a bigger or different object than the one the URL was made for. They point at
  ``s3_endpoint_url``, which clients must therefore be able to reach.
"""

from __future__ import annotations

import base64
import builtins
import functools
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, Self

import aiohttp
import anyio
import anyio.to_thread
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from anyio.abc import TaskGroup
from botocore import exceptions as boto_exc

from aivedio.config.load import StorageConfig
from aivedio.errors import (
    AivedioError,
    ChecksumMismatchError,
    ConfigError,
    NotFoundError,
    TransientError,
)
from aivedio.store.objects.append import AppendMark
from aivedio.store.objects.base import (
    DEFAULT_CONTENT_TYPE,
    MAX_PRESIGN_SECONDS,
    MIB,
    READ_CHUNK_BYTES,
    ObjectInfo,
    ObjectStoreConveniences,
    ObjectStoreError,
    PendingUpload,
    PresignedRequest,
    Upload,
    UploadedPart,
    parse_storage_url,
    validate_key,
    validate_prefix,
    validate_range,
)
from aivedio.store.objects.part_checksums import SHA256, check_echoed, part_checksum_named
from aivedio.store.objects.s3_append import S3Appender, open_s3_append
from aivedio.store.objects.s3_upload import (
    CONTROL_REQUEST_TIMEOUT_SECONDS as CONTROL_REQUEST_TIMEOUT_SECONDS,
)
from aivedio.store.objects.s3_upload import MAX_PARTS as MAX_PARTS
from aivedio.store.objects.s3_upload import MIN_PART_SIZE_BYTES as MIN_PART_SIZE_BYTES
from aivedio.store.objects.s3_upload import S3Upload as S3Upload
from aivedio.store.objects.s3_upload import _etag, validate_part_size

DEFAULT_PART_SIZE_BYTES = 8 * MIB
DEFAULT_PARTS_IN_FLIGHT = 4
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
DEFAULT_READ_TIMEOUT_SECONDS = 60.0
MAX_POOL_CONNECTIONS = 32
# Keys (and pending uploads) asked for per listing request: S3's own maximum and default.
LIST_PAGE_KEYS = 1000

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


class S3ObjectStore(ObjectStoreConveniences):
    """Objects in ``bucket`` under ``prefix``. Use as ``async with``: it owns the client and
    the task group in which uploads run their parts."""

    # For ``S3Upload``, which cannot import this module (it is imported by it).
    _map_errors = staticmethod(map_s3_errors)

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
        part_checksum: str = "sha256",
    ) -> None:
        validate_part_size(part_size_bytes)
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
        self.part_checksum = part_checksum_named(part_checksum)  # of S3Upload's parts
        self._endpoint_url = endpoint_url or None
        self._region = region
        self._access_key_id = access_key_id or None
        self._secret_access_key = secret_access_key or None
        self._client_config = AioConfig(
            connect_timeout=connect_timeout_seconds,
            read_timeout=read_timeout_seconds,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=MAX_POOL_CONNECTIONS,
            signature_version="s3v4",
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # Custom endpoints (MinIO, Ceph, moto) rarely have wildcard DNS for buckets. Every
            # part and put carries our own checksum, which the store verifies, so SigV4 need
            # not hash each payload again (botocore would, on plain HTTP, on the event loop).
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
            part_checksum=config.s3_part_checksum,
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
        """Every page of pending uploads. S3 pages by key, then upload id, and names both
        markers; SeaweedFS pages by upload id and names only ``NextUploadIdMarker``, so the
        next page is asked for with the markers the engine gave (an empty key marker when
        it gave none), and an upload seen twice is listed once."""
        validate_prefix(prefix)
        found: dict[str, PendingUpload] = {}
        markers: dict[str, str] = {}
        while True:
            with map_s3_errors("listing pending uploads"):
                page = await self._client.list_multipart_uploads(
                    Bucket=self.bucket,
                    Prefix=self._full_key(prefix),
                    MaxUploads=LIST_PAGE_KEYS,
                    **markers,
                )
            for upload in page.get("Uploads", []):
                initiated = _utc(upload.get("Initiated")) or datetime.fromtimestamp(0, tz=UTC)
                found[upload["UploadId"]] = PendingUpload(
                    self._own_key(upload["Key"]), upload["UploadId"], initiated
                )
            if not page.get("IsTruncated"):
                return builtins.list(found.values())
            after = {
                "KeyMarker": page.get("NextKeyMarker") or "",
                "UploadIdMarker": page.get("NextUploadIdMarker") or "",
            }
            if after == markers or not any(after.values()):
                raise ObjectStoreError("listing pending uploads: a truncated page, no next one")
            markers = after

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
                    Bucket=self.bucket,
                    Prefix=self._full_key(prefix),
                    MaxKeys=LIST_PAGE_KEYS,
                    **token,
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

    # -- presigning: clients upload and read directly ------------------------------------

    async def _presign(self, operation: str, params: dict[str, Any], expires_seconds: int) -> str:
        if not 1 <= expires_seconds <= MAX_PRESIGN_SECONDS:
            raise ValueError(f"expires_seconds must be 1..{MAX_PRESIGN_SECONDS}")
        with map_s3_errors(f"presigning {operation}"):
            url: str = await self._client.generate_presigned_url(
                operation, Params={"Bucket": self.bucket, **params}, ExpiresIn=expires_seconds
            )
        return url

    async def presign_put(
        self,
        key: str,
        *,
        expires_seconds: int,
        content_length: int,
        content_type: str = DEFAULT_CONTENT_TYPE,
        sha256_hex: str | None = None,
    ) -> PresignedRequest:
        validate_key(key)
        params: dict[str, Any] = {
            "Key": self._full_key(key),
            "ContentLength": content_length,
            "ContentType": content_type,
        }
        headers = {"Content-Type": content_type, "Content-Length": str(content_length)}
        if sha256_hex is not None:
            checksum = base64.b64encode(bytes.fromhex(sha256_hex)).decode("ascii")
            params["ChecksumSHA256"] = checksum
            headers["x-amz-checksum-sha256"] = checksum
        url = await self._presign("put_object", params, expires_seconds)
        return PresignedRequest("PUT", url, headers)

    async def create_multipart(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> str:
        validate_key(key)
        with map_s3_errors(f"starting a multipart upload of {key!r}"):
            response = await self._client.create_multipart_upload(
                Bucket=self.bucket, Key=self._full_key(key), ContentType=content_type
            )
        upload_id: str = response["UploadId"]
        return upload_id

    async def presign_part(
        self,
        key: str,
        upload_id: str,
        part_number: int,
        *,
        expires_seconds: int,
        content_length: int | None = None,
    ) -> str:
        validate_key(key)
        if not 1 <= part_number <= MAX_PARTS:
            raise ValueError(f"part_number must be 1..{MAX_PARTS}")
        params: dict[str, Any] = {
            "Key": self._full_key(key),
            "UploadId": upload_id,
            "PartNumber": part_number,
        }
        if content_length is not None:
            params["ContentLength"] = content_length
        return await self._presign("upload_part", params, expires_seconds)

    async def list_parts(self, key: str, upload_id: str) -> builtins.list[UploadedPart]:
        validate_key(key)
        found: builtins.list[UploadedPart] = []
        marker: dict[str, int] = {}
        while True:
            with map_s3_errors(f"listing the parts of {key!r}"):
                page = await self._client.list_parts(
                    Bucket=self.bucket, Key=self._full_key(key), UploadId=upload_id, **marker
                )
            for part in page.get("Parts", []):
                found.append(
                    UploadedPart(
                        int(part["PartNumber"]),
                        _etag(part.get("ETag")) or "",
                        int(part.get("Size", 0)),
                        part.get("ChecksumSHA256") or None,
                    )
                )
            if not page.get("IsTruncated"):
                return sorted(found, key=lambda p: p.part_number)
            marker = {"PartNumberMarker": int(page["NextPartNumberMarker"])}

    async def complete_multipart(
        self, key: str, upload_id: str, parts: builtins.list[UploadedPart]
    ) -> ObjectInfo:
        validate_key(key)
        listed = [
            {"PartNumber": p.part_number, "ETag": f'"{p.etag.strip(chr(34))}"'}
            | ({"ChecksumSHA256": p.checksum_sha256} if p.checksum_sha256 else {})
            for p in sorted(parts, key=lambda p: p.part_number)
        ]
        with map_s3_errors(f"completing the multipart upload of {key!r}"):
            await self._client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self._full_key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": listed},
            )
        info = await self.head(key)
        if info is None:
            raise TransientError(f"completed the upload of {key!r} but cannot see it yet")
        return info

    # -- appending (resumable uploads: s3_append.py) ---------------------------------------

    async def begin_append(self, key: str, *, content_type: str = DEFAULT_CONTENT_TYPE) -> str:
        """A multipart upload whose parts carry SHA-256 checksums; its id."""
        validate_key(key)
        with map_s3_errors(f"starting an append of {key!r}"):
            response = await self._client.create_multipart_upload(
                Bucket=self.bucket,
                Key=self._full_key(key),
                ContentType=content_type,
                ChecksumAlgorithm=SHA256.algorithm,
            )
        upload_id: str = response["UploadId"]
        return upload_id

    def open_append(
        self,
        key: str,
        append_id: str,
        mark: AppendMark,
        *,
        part_size_bytes: int,
        scratch_prefix: str,
        content_type: str = DEFAULT_CONTENT_TYPE,
    ) -> AbstractAsyncContextManager[S3Appender]:
        validate_key(key)
        validate_part_size(part_size_bytes)
        return open_s3_append(
            self,
            key,
            append_id,
            mark,
            part_size_bytes=part_size_bytes,
            scratch_prefix=scratch_prefix,
        )

    async def put_part(
        self, key: str, upload_id: str, number: int, body: Any, checksum: str
    ) -> str:
        """Send one part (``body``: a ``_PartBody``) with its SHA-256; its ETag."""
        with map_s3_errors(f"uploading part {number} of {key!r}"):
            response = await self._client.upload_part(
                Bucket=self.bucket,
                Key=self._full_key(key),
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ChecksumAlgorithm=SHA256.algorithm,
                ChecksumSHA256=checksum,
            )
        check_echoed(response, SHA256, checksum, f"part {number} of {key!r}")
        return str(response["ETag"])

    async def presign_get(
        self,
        key: str,
        *,
        expires_seconds: int,
        content_type: str | None = None,
        content_disposition: str | None = None,
    ) -> str:
        validate_key(key)
        params: dict[str, Any] = {"Key": self._full_key(key)}
        if content_type is not None:
            params["ResponseContentType"] = content_type
        if content_disposition is not None:
            params["ResponseContentDisposition"] = content_disposition
        return await self._presign("get_object", params, expires_seconds)
