"""Opening the object store ``storage.url`` names: ``file:///dir`` is the local store,
``s3://bucket[/prefix]`` the S3 store. The one module that knows both engines; the seam they
implement (``ObjectStore``) lives in ``base``, which imports neither.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from aivedio.config.load import StorageConfig
from aivedio.store.objects.base import ObjectStore, parse_storage_url
from aivedio.store.objects.local import LocalObjectStore
from aivedio.store.objects.s3 import S3ObjectStore


@asynccontextmanager
async def _open(
    config: StorageConfig, part_size_bytes: int | None, parts_in_flight: int | None
) -> AsyncIterator[ObjectStore]:
    scheme, location, _ = parse_storage_url(config.url)
    if scheme == "file":
        async with LocalObjectStore(Path(location)) as local:
            yield local
        return
    tuning: dict[str, int] = {}
    if part_size_bytes is not None:
        tuning["part_size_bytes"] = part_size_bytes
    if parts_in_flight is not None:
        tuning["parts_in_flight"] = parts_in_flight
    async with S3ObjectStore.from_config(config, **tuning) as s3:
        yield s3


def open_object_store(
    config: StorageConfig,
    *,
    part_size_bytes: int | None = None,
    parts_in_flight: int | None = None,
) -> AbstractAsyncContextManager[ObjectStore]:
    """Open the store ``config.url`` names (``file:///dir`` or ``s3://bucket[/prefix]``).

    ``part_size_bytes`` and ``parts_in_flight`` tune S3 multipart uploads (ignored locally).
    """
    return _open(config, part_size_bytes, parts_in_flight)
