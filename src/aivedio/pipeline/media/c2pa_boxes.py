"""Where an ISO BMFF file (MP4, MOV) keeps its C2PA manifest store: a top-level ``uuid`` box
with the C2PA UUID. Found by walking the top-level box headers only (bounded), never by
parsing the store: its hash for the record, and a copy without it when the store must not
be parsed again (``aivedio/provenance/signing.py``)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

C2PA_BOX_UUID = bytes.fromhex("d8fec3d61b0e483c92975828877ec481")
MAX_TOP_LEVEL_BOXES = 4096
MAX_STORE_BYTES = 64 * 1024**2


def c2pa_box(path: Path) -> tuple[int, int] | None:
    """``(offset, size)`` of the C2PA ``uuid`` box, None when there is none (or the file is
    not ISO BMFF, or its boxes do not add up)."""
    size_total = path.stat().st_size
    with path.open("rb") as handle:
        offset = 0
        for _ in range(MAX_TOP_LEVEL_BOXES):
            if offset + 8 > size_total:
                return None
            handle.seek(offset)
            header = handle.read(40)
            size = int.from_bytes(header[:4], "big")
            head = 8
            if size == 1:
                size, head = int.from_bytes(header[8:16], "big"), 16
            elif size == 0:
                size = size_total - offset
            if size < head or offset + size > size_total:
                return None
            if header[4:8] == b"uuid" and header[head : head + 16] == C2PA_BOX_UUID:
                return offset, size
            offset += size
    return None


def store_hash(path: Path) -> str | None:
    """SHA-256 of the C2PA box (the manifest store's own bytes); None without one or when
    it is larger than ``MAX_STORE_BYTES``."""
    found = c2pa_box(path)
    if found is None or found[1] > MAX_STORE_BYTES:
        return None
    offset, size = found
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        handle.seek(offset)
        remaining = size
        while remaining and (block := handle.read(min(remaining, 1024 * 1024))):
            digest.update(block)
            remaining -= len(block)
    return digest.hexdigest()


def without_store(path: Path, target: Path) -> bool:
    """Copy ``path`` to ``target`` without its C2PA box; False (nothing written) when it has
    none."""
    found = c2pa_box(path)
    if found is None:
        return False
    offset, size = found
    with path.open("rb") as source, target.open("wb") as out:
        remaining = offset
        while remaining and (block := source.read(min(remaining, 1024 * 1024))):
            out.write(block)
            remaining -= len(block)
        source.seek(offset + size)
        shutil.copyfileobj(source, out, 1024 * 1024)
    return True
