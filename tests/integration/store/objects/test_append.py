"""The append seam of resumable uploads (store/objects/append.py) on each store and engine:
bytes count only once checkpointed, a refused request leaves the mark as it was, S3 parts
are exactly the part size across requests, and a second finish at the same mark answers the
object the first one published."""

from __future__ import annotations

import os

import pytest

from aivedio.errors import NotFoundError
from aivedio.store.objects.append import AppendingStore, AppendMark
from aivedio.store.objects.base import ObjectStore
from tests.integration.store.objects.test_engines import (  # noqa: F401 (fixtures)
    PART_BYTES,
    s3_storage_config,
    storage_config,
    store,
    store_kind,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

KEY = "quarantine/t/v/source.bin"
SCRATCH = "quarantine/t/v/tus/"


async def append(
    target: AppendingStore, append_id: str, mark: AppendMark, data: bytes, *, keep: bool = True
) -> AppendMark:
    async with target.open_append(
        KEY, append_id, mark, part_size_bytes=PART_BYTES, scratch_prefix=SCRATCH
    ) as appender:
        for start in range(0, len(data), 300_000):
            await appender.write(data[start : start + 300_000])
        assert appender.offset == mark.offset + len(data)
        return await appender.checkpoint() if keep else mark


async def test_appends_across_requests_publish_exactly_the_kept_bytes(
    store: ObjectStore,  # noqa: F811 (the fixture)
) -> None:
    assert isinstance(store, AppendingStore)
    data = os.urandom(2 * PART_BYTES + 777)
    append_id = await store.begin_append(KEY)
    first = await append(store, append_id, AppendMark(), data[: PART_BYTES + 5])
    assert first.offset == PART_BYTES + 5
    # A request refused midway (never checkpointed): its bytes do not count.
    assert await append(store, append_id, first, os.urandom(PART_BYTES + 9), keep=False) == first
    second = await append(store, append_id, first, data[PART_BYTES + 5 : 2 * PART_BYTES + 1])
    async with store.open_append(
        KEY, append_id, second, part_size_bytes=PART_BYTES, scratch_prefix=SCRATCH
    ) as appender:
        await appender.write(data[2 * PART_BYTES + 1 :])
        info = await appender.finish()
    assert info.size == len(data)
    assert await store.get_bytes(KEY, max_bytes=len(data)) == data
    # The finish again at the same mark (its caller crashed before recording it): the object
    # the first one published, or "gone" for the caller to head it.
    try:
        async with store.open_append(
            KEY, append_id, second, part_size_bytes=PART_BYTES, scratch_prefix=SCRATCH
        ) as appender:
            await appender.write(data[2 * PART_BYTES + 1 :])
            again = await appender.finish()
        assert again.size == len(data)
    except NotFoundError:
        pass
    assert await store.get_bytes(KEY, max_bytes=len(data)) == data
    assert await store.list_multipart_uploads("quarantine/") == []
