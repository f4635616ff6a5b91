"""Listing the local store: a depth-first walk of its directory tree, in the byte-wise key
order S3 lists in, advanced in worker threads a batch of steps at a time.
"""

from __future__ import annotations

import builtins
import itertools
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from aivedio.store.objects.base import ObjectInfo
from aivedio.store.objects.local_disk import file_etag, file_mtime, in_thread


async def list_in_batches(
    walk: Iterator[ObjectInfo | None], batch_steps: int
) -> AsyncIterator[ObjectInfo]:
    """The walk advanced in a thread a batch at a time: one thread call for up to
    ``batch_steps`` objects and directories, however the store is laid out."""
    while True:
        batch, more = await in_thread("listing objects", _take, walk, batch_steps)
        for info in batch:
            yield info
        if not more:
            return


def _take(walk: Iterator[ObjectInfo | None], count: int) -> tuple[builtins.list[ObjectInfo], bool]:
    """The objects among the walk's next ``count`` steps (each object or directory entered
    is a step), and whether the walk has more."""
    steps = builtins.list(itertools.islice(walk, count))
    return [info for info in steps if info is not None], len(steps) == count


def walk_tree(path: Path, key_prefix: str, name_prefix: str) -> Iterator[ObjectInfo | None]:
    """Depth first, in key order (``_scan``); each directory read when the walk reaches it
    (a None step: a listing of empty directories is batched as one of objects is)."""
    yield None
    for name, st in _scan(path, name_prefix):
        if stat.S_ISDIR(st.st_mode):
            yield from walk_tree(path / name, f"{key_prefix}{name}/", "")
        else:
            yield ObjectInfo(
                key=key_prefix + name,
                size=st.st_size,
                etag=file_etag(st),
                last_modified=file_mtime(st),
            )


def _scan(path: Path, name_prefix: str) -> builtins.list[tuple[str, os.stat_result]]:
    """Entries of one directory that can hold objects, in key order.

    A directory ``d`` sorts as ``d/`` so a depth-first walk yields keys in the same
    (byte-wise) order S3 lists them: ``a-c`` < ``a/b`` because ``-`` < ``/``.
    """
    try:
        entries = builtins.list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: builtins.list[tuple[str, str, os.stat_result]] = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.startswith(name_prefix):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # deleted while we looked
        if stat.S_ISDIR(st.st_mode):
            found.append((entry.name + "/", entry.name, st))
        elif stat.S_ISREG(st.st_mode):
            found.append((entry.name, entry.name, st))
    found.sort(key=lambda item: item[0])
    return [(name, st) for _, name, st in found]
