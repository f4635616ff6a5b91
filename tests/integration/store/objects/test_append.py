"""The append seam of resumable uploads (store/objects/append.py) on each store and engine:
bytes count only once checkpointed, a refused request leaves the mark as it was, S3 parts
are exactly the part size across requests, and a second finish at the same mark answers the
object the first one published."""

from __future__ import annotations

import hashlib
import os

import pytest

from aivedio.errors import NotFoundError
from aivedio.store.objects.append import AppendingStore, AppendMark
from aivedio.store.objects.base import MIB, ObjectStore
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


async def test_hashers_see_every_byte_in_order_before_write_returns(
    store: ObjectStore,  # noqa: F811 (the fixture)
) -> None:
    # Batches of every shape: small ones held by the local store, big ones hashed and written
    # in one worker-thread call; a bytearray the caller reuses must not leak into the object.
    assert isinstance(store, AppendingStore)
    data = os.urandom(3 * PART_BYTES + 12_345)
    whole, seen = hashlib.sha256(), hashlib.sha256()
    append_id = await store.begin_append(KEY)
    mark = AppendMark()
    offset = 0
    for sizes in ([1, 70_000, 4 * MIB + 3], [2 * MIB, 300_001], [len(data)]):
        async with store.open_append(
            KEY, append_id, mark, part_size_bytes=PART_BYTES, scratch_prefix=SCRATCH
        ) as appender:
            for size in sizes:
                chunk = data[offset : offset + size]
                if not chunk:
                    break
                rest = bytearray(chunk[size // 2 :])
                await appender.write(chunk[: size // 2], rest, hashers=[whole])
                rest[:] = bytes(len(rest))  # the caller reuses its buffer
                seen.update(chunk)
                offset += len(chunk)
                assert whole.copy().digest() == seen.digest()
            if offset < len(data):
                mark = await appender.checkpoint()
            else:
                info = await appender.finish()
    assert info.size == len(data)
    assert whole.hexdigest() == hashlib.sha256(data).hexdigest()
    assert await store.get_bytes(KEY, max_bytes=len(data)) == data
