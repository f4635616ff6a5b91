"""The object-store and variant-row side of a media job.

``download_source`` fetches an asset's quarantined source into the scratch directory and
checks it against the size and SHA-256 recorded at fetch; ``upload_and_verify`` writes an
output's files under the revision prefix and reads each back (size, SHA-256) before it may
count as done; ``record_variant`` then moves its PENDING variant to SUCCEEDED (a CAS: False
if another run got there first). Kept out of ``media_stage`` so the job logic reads as job
logic; each function takes the store or pool it needs.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from pathlib import Path

import anyio
import asyncpg
import msgspec

from aivedio.errors import ChecksumMismatchError, StaleStateError, TransientError
from aivedio.pipeline.media_outputs import OutputRecord
from aivedio.states import Entity
from aivedio.store.database import Pool
from aivedio.store.objects import ObjectStore
from aivedio.store.records import transition


async def download_source(store: ObjectStore, asset: asyncpg.Record, target: Path) -> None:
    key = asset["source_object_key"]
    digest, size = await download(store, key, target)
    if asset["source_sha256"] and digest != asset["source_sha256"]:
        raise ChecksumMismatchError(
            f"quarantined source {key}: sha256 {digest} != recorded {asset['source_sha256']}"
        )
    if asset["source_size_bytes"] is not None and size != asset["source_size_bytes"]:
        raise ChecksumMismatchError(f"quarantined source {key}: {size} bytes, recorded "
                                    f"{asset['source_size_bytes']}")  # fmt: skip


async def download(store: ObjectStore, key: str, target: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    async with await anyio.open_file(target, "wb") as handle:
        async for chunk in store.get(key):
            digest.update(chunk)
            size += len(chunk)
            await handle.write(chunk)
    return digest.hexdigest(), size


WHOLE_READ_BYTES = 1024 * 1024


async def upload_and_verify(
    store: ObjectStore, prefix: str, out: Path, record: OutputRecord
) -> None:
    """Write every file under the revision prefix, then read each back: size and SHA-256
    must match what was made before the output may count as done."""
    for file in record.files:
        key = f"{prefix}/{file.path}"
        async with await store.start_upload(key, content_type=file.mime) as upload:
            if file.size <= WHOLE_READ_BYTES:  # most files of an output: one read, no handle
                await upload.write(await anyio.Path(out / file.path).read_bytes())
            else:
                async with await anyio.open_file(out / file.path, "rb") as handle:
                    while chunk := await handle.read(1024 * 1024):
                        await upload.write(chunk)
            await upload.complete()
        info = await store.head(key)
        if info is None or info.size != file.size:
            raise TransientError(f"{key}: not readable at the size written after upload")
        digest = hashlib.sha256()
        async for chunk in store.get(key):
            digest.update(chunk)
        if digest.hexdigest() != file.sha256:
            raise ChecksumMismatchError(f"{key}: read back a different SHA-256")


async def record_variant(
    pool: Pool, asset_id: uuid.UUID, revision: int, record: OutputRecord, prefix: str
) -> bool:
    primary = record.primary_file()
    extra = {"files": [msgspec.to_builtins(f) for f in record.files],
             "total_bytes": record.size, "required": record.required}  # fmt: skip
    async with pool.acquire() as conn:
        try:
            await transition(
                conn, Entity.VARIANT, (asset_id, revision, record.variant_type),
                expected="PENDING", new="SUCCEEDED",
                values={"object_key": f"{prefix}/{primary.path}", "mime_type": primary.mime,
                        "size_bytes": primary.size, "checksum": primary.sha256,
                        "width": record.width, "height": record.height,
                        "codec": record.codec, "bitrate": record.bitrate, "extra": extra,
                        "completed_at": datetime.now(UTC)},
            )  # fmt: skip
        except StaleStateError:
            return False
    return True
