"""A provider output's bytes into the object store: the transfer of one fetch attempt.

An object already at the attempt's quarantine key was stored by an earlier attempt that died
before its transaction: an object exists only if its upload completed, and an upload
completes only after the size and checksum checks, so it is read back once for its SHA-256
(and kept if it matches what the provider said) instead of downloading again.

Otherwise any multipart upload a dead attempt left on that key is aborted, the body streams
through the guarded fetcher into a new upload, its size is checked against the provider's
expected size and its SHA-256 against the provider's checksum, then the upload is completed
and HEADed. A body cut short is resumed by the fetcher into the same upload; one the origin
starts over (a 200 to the resume) gets a new upload, the old one aborted.

The transfer never touches the database: the fetch stage (``pipeline.fetch``) records what
it did.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import msgspec

from aivedio.errors import AivedioError, ChecksumMismatchError, NotFoundError, TransientError
from aivedio.logs import get_logger
from aivedio.metrics import NO_STATUS, WorkerMetrics
from aivedio.net.fetch import Fetcher, FetchResult
from aivedio.net.limits import HostLimiter
from aivedio.pipeline.output_records import OutputRow
from aivedio.providers.seam import ProviderAdapter
from aivedio.store.objects.base import ABORT_TIMEOUT_SECONDS, ObjectInfo, ObjectStore, Upload

log = get_logger("aivedio.fetch")


class Resumed(msgspec.Struct, frozen=True):
    """What the transfer read back of an object an earlier attempt had stored."""

    sha256: str
    bytes: int


@dataclass(frozen=True)
class Transfer:
    """One attempt's transfer of a provider output into the store: through ``fetcher``
    (the provider's), within the host limits of ``hosts``, with the download credential of
    ``adapter`` (None: no adapter, no credential)."""

    store: ObjectStore
    hosts: HostLimiter
    fetcher: Fetcher
    adapter: ProviderAdapter | None

    async def into_store(
        self, output: OutputRow, url: str, key: str, metrics: WorkerMetrics | None = None
    ) -> tuple[ObjectInfo, FetchResult | Resumed]:
        existing = await self.store.head(key)
        if existing is not None:
            resumed = await self._verify_existing(output, key, existing)
            if resumed is not None:
                log.info(
                    "fetch_resumed_from_store",
                    provider_output_id=str(output.id),
                    key=key,
                    bytes=existing.size,
                )
                return existing, resumed
        await self._abort_leftover_uploads(key)
        host = host_of(url)
        async with self.hosts.slot(host):
            started = time.monotonic()
            target = _UploadTarget(
                self.store, key, output.content_type or "application/octet-stream"
            )
            await target.start()
            try:
                try:
                    result = await self.fetcher.stream(
                        url,
                        target.write,
                        headers=self._headers(output, url),
                        restart=target.restart,
                    )
                except AivedioError as exc:
                    _count_response(metrics, output.provider, exc.http_status)
                    _count_resumes(metrics, output.provider, getattr(exc, "fetch_state", None))
                    raise
                _count_response(metrics, output.provider, result.status)
                _count_resumes(metrics, output.provider, result)
                self._check_integrity(output, result)
                try:
                    info = await target.upload.complete()
                except NotFoundError:
                    # Another run of this job aborted our upload as a leftover (it held the
                    # job after our lease lapsed): not a verdict on the bytes; try again.
                    raise TransientError(f"upload of {key} was aborted by another run") from None
            except BaseException:
                await target.abort()
                raise
        self.hosts.succeeded(host)
        if metrics is not None:
            metrics.fetch_duration.labels(output.provider).observe(time.monotonic() - started)
        head = await self.store.head(key)
        if head is None or head.size != result.bytes:
            raise TransientError(
                f"stored object {key} does not verify: HEAD says "
                f"{head.size if head else 'missing'}, wrote {result.bytes}"
            )
        log.info(
            "fetch_stored",
            provider_output_id=str(output.id),
            url=result.url,
            bytes=result.bytes,
            redirects=result.redirects,
            resumes=result.resumes,
            restarts=result.restarts,
        )
        return info, result

    def _check_integrity(self, output: OutputRow, result: FetchResult) -> None:
        if output.expected_size_bytes is not None and result.bytes != output.expected_size_bytes:
            raise ChecksumMismatchError(
                f"size {result.bytes} differs from the provider's {output.expected_size_bytes}"
            )
        if output.expected_checksum and result.sha256 != output.expected_checksum.lower():
            raise ChecksumMismatchError(
                f"sha256 {result.sha256} differs from the provider's {output.expected_checksum}"
            )

    async def _verify_existing(
        self, output: OutputRow, key: str, existing: ObjectInfo
    ) -> Resumed | None:
        hasher = hashlib.sha256()
        async for chunk in self.store.get(key):
            hasher.update(chunk)
        resumed = Resumed(sha256=hasher.hexdigest(), bytes=existing.size)
        expected_size = output.expected_size_bytes
        expected_sha = (output.expected_checksum or "").lower()
        if (expected_size is not None and expected_size != resumed.bytes) or (
            expected_sha and expected_sha != resumed.sha256
        ):
            log.warning("fetch_existing_object_rejected", key=key)
            await self.store.delete(key)
            return None
        return resumed

    async def _abort_leftover_uploads(self, key: str) -> None:
        # We hold this job's lease: any upload open on its key belongs to a dead attempt.
        for pending in await self.store.list_multipart_uploads(prefix=key):
            if pending.key == key:
                await self.store.abort_multipart_upload(pending.key, pending.upload_id)
                log.info("fetch_aborted_leftover_upload", key=key)

    def _headers(self, output: OutputRow, url: str) -> dict[str, str]:
        """The provider's download credential, when ``url`` is on the provider's own origin
        (Gemini files, GCS); never logged, and the fetcher drops it on any hop to another
        origin."""
        return self.adapter.download_headers(url) if self.adapter is not None else {}


class _UploadTarget:
    """The upload a transfer writes into. A transfer that starts over from byte 0 (the
    origin answered a resume with a whole body) gets a new upload on the same key: the
    old one is aborted with its parts, so no byte of the first body can end in the object.
    """

    def __init__(self, store: ObjectStore, key: str, content_type: str) -> None:
        self._store = store
        self._key = key
        self._content_type = content_type
        self._upload: Upload | None = None

    @property
    def upload(self) -> Upload:
        assert self._upload is not None, "start() first"
        return self._upload

    async def start(self) -> None:
        self._upload = await self._store.start_upload(self._key, content_type=self._content_type)

    async def write(self, chunk: bytes) -> None:
        await self.upload.write(chunk)

    async def restart(self) -> None:
        await self.abort()
        await self.start()
        log.info("fetch_upload_restarted", key=self._key)

    async def abort(self) -> None:
        upload, self._upload = self._upload, None
        if upload is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_TIMEOUT_SECONDS):
                await upload.abort()


def _count_resumes(metrics: WorkerMetrics | None, provider: str, fetched: object) -> None:
    """``aivedio_fetch_resumes_total{provider,kind}``: bodies continued (``range``) and
    started over (``restart``) by one download attempt, stored or not."""
    if metrics is None or fetched is None:
        return
    for kind, count in (
        ("range", getattr(fetched, "resumes", 0)),
        ("restart", getattr(fetched, "restarts", 0)),
    ):
        if count:
            metrics.fetch_resumes.labels(provider, kind).inc(count)


def _count_response(metrics: WorkerMetrics | None, provider: str, status: int | None) -> None:
    if metrics is not None:
        label = str(status) if status is not None else NO_STATUS
        metrics.fetch_responses.labels(provider, label).inc()


def host_of(url: str) -> str:
    """The URL's host, lower case: the key of its limits."""
    return (urlsplit(url).hostname or "").lower()
