"""The object-store and variant-row side of a media job.

``download_source`` fetches an asset's quarantined source into the scratch directory and
checks it against the size and SHA-256 recorded at fetch; ``upload_and_verify`` writes an
output's files under the revision prefix and reads each back (size, SHA-256) before it may
count as done; ``record_variants`` then moves PENDING variants to SUCCEEDED in one statement
(a CAS per row: one another run got to first is left out). Kept out of ``media_stage`` so the
job logic reads as job logic; each function takes the store or pool it needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec

from aivedio.errors import ChecksumMismatchError
from aivedio.pipeline.ffmpeg.outputs import OutputRecord
from aivedio.store import asset_variants
from aivedio.store.database import Pool
from aivedio.store.objects.base import LocalFile, ObjectStore


async def download_source(store: ObjectStore, asset: asyncpg.Record, target: Path) -> None:
    key = asset["source_object_key"]
    digest, size = await download(store, key, target)
    if asset["source_sha256"] and digest != asset["source_sha256"]:
        raise ChecksumMismatchError(
            f"quarantined source {key}: sha256 {digest} != recorded {asset['source_sha256']}"
        )
    if asset["source_size_bytes"] is not None and size != asset["source_size_bytes"]:
        raise ChecksumMismatchError(
            f"quarantined source {key}: {size} bytes, recorded {asset['source_size_bytes']}"
        )


async def download(store: ObjectStore, key: str, target: Path) -> tuple[str, int]:
    target.parent.mkdir(parents=True, exist_ok=True)
    return await store.download_file(key, str(target))


async def upload_and_verify(
    store: ObjectStore, prefix: str, out: Path, record: OutputRecord
) -> None:
    """Write every file under the revision prefix, then read each back: size and SHA-256
    must match what was made before the output may count as done (``store_files``)."""
    await store.store_files(
        [
            LocalFile(
                key=f"{prefix}/{file.path}",
                path=str(out / file.path),
                size=file.size,
                sha256=file.sha256,
                content_type=file.mime,
            )
            for file in record.files
        ]
    )


async def record_variant(
    pool: Pool, asset_id: uuid.UUID, revision: int, record: OutputRecord, prefix: str
) -> bool:
    return bool(await record_variants(pool, asset_id, revision, [record], prefix))


async def record_variants(
    pool: Pool, asset_id: uuid.UUID, revision: int, records: Sequence[OutputRecord], prefix: str
) -> set[str]:
    """Move these outputs' PENDING variants to SUCCEEDED in one statement (a CAS per row);
    returns the variant types moved (one another run got to first is left out)."""
    if not records:
        return set()
    now = datetime.now(UTC)
    return await asset_variants.succeed(
        pool, asset_id, revision, variant_columns(records, prefix), now
    )


def variant_columns(records: Sequence[OutputRecord], prefix: str) -> list[list[Any]]:
    """The variant columns of made outputs, one list per column (``asset_variants``)."""
    rows = [(r, r.primary_file()) for r in records]
    return [
        [r.variant_type for r, _ in rows],
        [f"{prefix}/{p.path}" for _, p in rows],
        [p.mime for _, p in rows],
        [p.size for _, p in rows],
        [p.sha256 for _, p in rows],
        [r.width for r, _ in rows],
        [r.height for r, _ in rows],
        [r.codec for r, _ in rows],
        [r.bitrate for r, _ in rows],
        [
            {
                "files": [msgspec.to_builtins(f) for f in r.files],
                "total_bytes": r.size,
                "required": r.required,
                # Its C2PA signing: signed (the platform's manifest label) or the reason not.
                **({"c2pa": msgspec.to_builtins(r.c2pa)} if r.c2pa is not None else {}),
                # The text tracks its playlists name (``media/text_tracks.py``).
                **({"tracks": msgspec.to_builtins(r.tracks)} if r.tracks else {}),
            }
            for r, _ in rows
        ],
    ]


async def upload_work_object(store: ObjectStore, key: str, path: Path) -> tuple[str, int]:
    """Write a work object and read it back: its SHA-256 and size as stored."""
    async with await store.start_upload(key) as upload:
        async with await anyio.open_file(path, "rb") as handle:
            while block := await handle.read(1024 * 1024):
                await upload.write(block)
        await upload.complete()
    digest, size = await _read_digest(store, key)
    expected = await anyio.to_thread.run_sync(_file_digest, path)
    if (digest, size) != expected:
        raise ChecksumMismatchError(f"{key}: read back {size} bytes, sha256 {digest}")
    return digest, size


async def download_piece(store: ObjectStore, row: asyncpg.Record, target: Path) -> None:
    """Download a recorded object (a chunk piece, a made output: ``object_key``,
    ``size_bytes``, ``sha256``), checked against its recorded size and SHA-256."""
    digest, size = await download(store, row["object_key"], target)
    if digest != row["sha256"] or size != row["size_bytes"]:
        raise ChecksumMismatchError(
            f"{row['object_key']}: {size} bytes, sha256 {digest}; recorded"
            f" {row['size_bytes']} bytes, sha256 {row['sha256']}"
        )


async def discard(store: ObjectStore, *object_keys: str) -> None:
    """Delete objects, shielded from cancellation; one that cannot be deleted is left (the
    sweeper's GC collects it)."""
    with anyio.CancelScope(shield=True):
        for key in object_keys:
            with contextlib.suppress(Exception):
                await store.delete(key)


async def _read_digest(store: ObjectStore, key: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    async for block in store.get(key):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def _file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(1024 * 1024):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
