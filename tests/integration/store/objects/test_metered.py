"""The metered object store: every call counted by operation and outcome, bytes by direction,
over both real stores (a local directory and S3 on moto's server)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest

from aivedio.config.load import StorageConfig
from aivedio.errors import NotFoundError, TransientError
from aivedio.metrics import WorkerMetrics
from aivedio.store.objects.base import InvalidKeyError, ObjectStore
from aivedio.store.objects.metered import MeteredObjectStore
from aivedio.store.objects.opening import open_object_store
from aivedio.store.objects.s3 import S3ObjectStore
from tests.support.s3_server import ENGINES, s3_config

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

CHUNK = 64 * 1024


@pytest.fixture(params=["local", *ENGINES])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> StorageConfig:
    if request.param == "local":
        return StorageConfig(url=f"file://{tmp_path}/objects")
    endpoint: str = request.getfixturevalue(f"{request.param}_endpoint")
    return s3_config(endpoint, f"t-{uuid.uuid4().hex[:12]}")


@asynccontextmanager
async def metered(storage: StorageConfig) -> AsyncIterator[tuple[ObjectStore, WorkerMetrics]]:
    metrics = WorkerMetrics()
    async with open_object_store(storage) as inner:
        yield MeteredObjectStore(inner, metrics.store), metrics


def requests(metrics: WorkerMetrics, operation: str, outcome: str = "ok") -> float:
    value = metrics.registry.get_sample_value(
        "aivedio_object_store_requests_total", {"operation": operation, "outcome": outcome}
    )
    return value or 0.0


def moved(metrics: WorkerMetrics, direction: str) -> float:
    value = metrics.registry.get_sample_value(
        "aivedio_object_store_bytes_total", {"direction": direction}
    )
    return value or 0.0


async def test_an_upload_counts_each_call_and_its_bytes(storage: StorageConfig) -> None:
    data = bytes(range(256)) * 1000  # 256,000 bytes: 4 writes of 64 KiB
    async with metered(storage) as (store, metrics):
        async with await store.start_upload("a/one.bin") as upload:
            for offset in range(0, len(data), CHUNK):
                await upload.write(data[offset : offset + CHUNK])
            info = await upload.complete()
        assert info.size == len(data)
        assert requests(metrics, "start_upload") == 1
        assert requests(metrics, "write") == 4
        assert requests(metrics, "complete_upload") == 1
        # The ``async with`` exit after a completion is not a request.
        assert requests(metrics, "abort_upload") == 0
        assert moved(metrics, "upload") == len(data)
        assert moved(metrics, "download") == 0


async def test_an_upload_given_up_counts_one_abort_and_nothing_is_stored(
    storage: StorageConfig,
) -> None:
    async with metered(storage) as (store, metrics):
        upload = await store.start_upload("a/half.bin")

        async def give_up() -> None:
            async with upload:
                await upload.write(b"x" * 1000)
                raise LookupError("the caller failed half-way")

        with pytest.raises(LookupError):
            await give_up()
        await upload.abort()  # again: idempotent, not a second request
        assert requests(metrics, "abort_upload") == 1
        assert requests(metrics, "complete_upload") == 0
        assert await store.head("a/half.bin") is None
        assert moved(metrics, "upload") == 1000


async def test_reads_count_their_bytes_and_a_stream_counts_once_when_it_ends(
    storage: StorageConfig, tmp_path: Path
) -> None:
    data = b"0123456789" * 50_000
    async with metered(storage) as (store, metrics):
        await store.put_bytes("r/obj.bin", data)
        assert requests(metrics, "put_bytes") == 1
        assert moved(metrics, "upload") == len(data)

        assert b"".join([c async for c in store.get("r/obj.bin")]) == data
        assert requests(metrics, "get") == 1
        assert moved(metrics, "download") == len(data)

        # A reader that stops after the first chunk: one ok call, only what it was handed.
        handed: list[bytes] = []
        async with aclosing(store.get("r/obj.bin")) as stream:  # type: ignore[type-var]
            async for chunk in stream:
                handed.append(chunk)
                break
        first = handed[0]
        assert requests(metrics, "get") == 2
        assert moved(metrics, "download") == 2 * len(data) - (len(data) - len(first))

        assert await store.get_bytes("r/obj.bin", start=10, end=19) == data[10:20]
        assert requests(metrics, "get_bytes") == 1
        assert moved(metrics, "download") == 2 * len(data) - (len(data) - len(first)) + 10

        before = moved(metrics, "download")
        target = tmp_path / "copy.bin"
        assert await store.download_file("r/obj.bin", str(target)) == (
            hashlib.sha256(data).hexdigest(),
            len(data),
        )
        assert requests(metrics, "download_file") == 1
        assert moved(metrics, "download") == before + len(data)

        head = await store.head("r/obj.bin")
        assert head is not None and head.size == len(data)
        assert [info.key async for info in store.list("r/")] == ["r/obj.bin"]
        assert requests(metrics, "list") == 1
        await store.delete("r/obj.bin")
        assert requests(metrics, "delete") == 1
        # A missing object is an answer, not a failure.
        assert await store.head("r/obj.bin") is None
        assert requests(metrics, "head") == 2


async def test_failures_count_under_their_error_class(storage: StorageConfig) -> None:
    async with metered(storage) as (store, metrics):
        with pytest.raises(NotFoundError):
            async for _ in store.get("r/missing.bin"):
                pass
        assert requests(metrics, "get", "not_found") == 1
        assert requests(metrics, "get") == 0
        with pytest.raises(InvalidKeyError):
            await store.start_upload("../escape")
        assert requests(metrics, "start_upload", "invalid_object_key") == 1
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.head("r/anything.bin")
        assert scope.cancelled_caught
        assert requests(metrics, "head", "cancelled") == 1
        assert moved(metrics, "download") == 0


async def test_an_unreachable_s3_endpoint_counts_as_transient(s3_endpoint: str) -> None:
    # A loopback port nobody listens on: the store's seam says transient, and so do we.
    config = msgspec.structs.replace(
        s3_config(s3_endpoint, "gone"), s3_endpoint_url="http://127.0.0.1:9"
    )
    metrics = WorkerMetrics()
    async with S3ObjectStore.from_config(config, max_attempts=1) as inner:
        store = MeteredObjectStore(inner, metrics.store)
        with pytest.raises(TransientError):
            await store.head("any/key.bin")
        assert requests(metrics, "head", "transient") == 1
        with pytest.raises(TransientError):
            await store.list_multipart_uploads("any/")
        assert requests(metrics, "list_multipart_uploads", "transient") == 1
