"""The whole-file SHA-256 of resumable uploads, computed as their bytes arrive.

A tus upload's bytes come in many PATCHes, and its digest is needed once the last one
arrives (the asset's ``source_sha256``, checked against a declared one). hashlib's state
cannot be saved (neither pickled nor exported), so it cannot be recorded in the database
beside the upload's offset. What this process keeps instead, per upload: the hash of the
bytes up to the offset it last recorded. A PATCH starting at that offset goes on with a
copy of it (the copy is fed; it replaces the kept one only when the PATCH's bytes are
recorded, so a refused PATCH leaves it as it was).

When it is missing (the API restarted, the upload's PATCHes went to several processes, or
the table forgot it as the least recently used of ``MAX_UPLOADS``), the digest is
computed once the upload is complete, by reading the finished object back through SHA-256:
one more read of the whole file, at about the store's read speed, paid only by the uploads
that crossed a restart or a process. (S3 cannot read the parts of an unfinished multipart
upload, so re-hashing the stored prefix at resume time is not possible there.)
"""

from __future__ import annotations

import hashlib
import uuid
from collections import OrderedDict
from typing import Any

import anyio

MAX_UPLOADS = 10_000  # a sha256 state is about 200 bytes


class UploadHashes:
    def __init__(self, writes: int = 16) -> None:
        self._kept: OrderedDict[uuid.UUID, tuple[int, Any]] = OrderedDict()
        # PATCHes streaming at once in this process (memory: a part buffer set each).
        self.writes = anyio.Semaphore(writes)

    def resume(self, upload: uuid.UUID, offset: int) -> Any | None:
        """A hasher of the first ``offset`` bytes to feed (a copy), or None when unknown."""
        kept = self._kept.get(upload)
        if kept is not None and kept[0] == offset:
            self._kept.move_to_end(upload)
            return kept[1].copy()
        if offset == 0:
            return hashlib.sha256()
        return None

    def keep(self, upload: uuid.UUID, offset: int, hasher: Any) -> None:
        """``hasher`` has seen the first ``offset`` bytes, now recorded."""
        self._kept[upload] = (offset, hasher)
        self._kept.move_to_end(upload)
        while len(self._kept) > MAX_UPLOADS:
            self._kept.popitem(last=False)

    def forget(self, upload: uuid.UUID) -> None:
        self._kept.pop(upload, None)
