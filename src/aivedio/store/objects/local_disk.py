"""The local store's filesystem primitives: durable writes and renames, pruning, and disk
calls run in worker threads with ``OSError`` translated into the project's errors.

Durable means: the data fsynced, then the directory that names it, so a power cut cannot
forget a rename; a directory created on the way is fsynced into its parent too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread

from aivedio.errors import AivedioError, ResourceExhaustedError, TransientError
from aivedio.transfer_cpu import measuring

# Attempts at "create parents, rename" when a concurrent delete prunes the parent between.
RENAME_ATTEMPTS = 3
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})

P = ParamSpec("P")
T = TypeVar("T")


@contextmanager
def map_os_errors(action: str) -> Iterator[None]:
    """Translate filesystem errors: a full disk is ``ResourceExhaustedError``, anything else
    from the OS is ``TransientError`` (a flaky mount); our own errors pass through."""
    try:
        yield
    except AivedioError:
        raise
    except OSError as exc:
        detail = f"{action}: {type(exc).__name__}: {exc.strerror or exc}"
        if exc.errno in _NO_SPACE:
            raise ResourceExhaustedError(detail) from exc
        raise TransientError(detail) from exc


async def in_thread(action: str, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    def call() -> T:
        return func(*args, **kwargs)

    with map_os_errors(action):
        return await anyio.to_thread.run_sync(call)


async def moving_bytes(action: str, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``in_thread`` for a call that writes or reads object bytes: its CPU is byte transfer
    (``transfer_cpu``)."""
    return await in_thread(action, measuring("store", func), *args, **kwargs)


def file_etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def file_mtime(st: os.stat_result) -> datetime:
    return datetime.fromtimestamp(st.st_mtime, tz=UTC)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def make_parents(path: Path) -> None:
    """Create the missing directories above ``path``, fsyncing the parent of each new one
    so the new entries survive a crash too."""
    missing: list[Path] = []
    parent = path.parent
    while not parent.is_dir():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not directory.is_dir():
                raise
        fsync_dir(directory.parent)


def replace_into(src: Path, dst: Path) -> None:
    """``os.replace`` after creating ``dst``'s parents; retried when a concurrent delete
    pruned an empty parent between the two steps."""
    for attempt in range(RENAME_ATTEMPTS):
        try:
            make_parents(dst)
            os.replace(src, dst)
            return
        except FileNotFoundError:
            if attempt + 1 == RENAME_ATTEMPTS or not src.exists():
                raise


def prune_empty_parents(path: Path, root: Path) -> None:
    parent = path.parent
    while parent != root:
        try:
            os.rmdir(parent)
        except OSError:
            return
        parent = parent.parent


def unlink_if_present(path: Path) -> None:
    with suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        os.unlink(path)
