"""The CPU this process spends moving and hashing bytes, measured in the thread that spends it.

The fleet benchmark's target is *orchestration* overhead: a worker's own CPU except ffmpeg
(its children, counted apart by the kernel) and byte transfer. The kernel cannot split the
second, so the code that moves bytes measures itself: ``time.thread_time()`` (this thread's
user + system CPU) before and after a synchronous section, added to a per-process total by
kind. Only code that runs without yielding is measured, so no other task's CPU is counted.

Kinds, each measured at the one place its work happens:

* ``store``: object-store calls that write or read object bytes, in the store's own thread:
  the local store's copy, fsync and read-back of stored files, its upload writes and commit,
  its reads; the S3 store's part and object checksums. HEAD, list, delete, and starting or
  aborting an upload are not counted: they move no bytes.
* ``fetch``: the fetcher's SHA-256 of the provider's body, chunk by chunk.
* ``hash``: an output's files hashed (SHA-256) before they are stored, and a downloaded
  source hashed as it is written to scratch.

What is not measured stays in the orchestration figure (conservatively): TLS decryption of
the body in the event loop, aiohttp's sending of S3 parts, the scratch writes of a download.

``seconds()`` is read by ``metrics.WorkerMetrics`` at scrape time
(``aivedio_byte_transfer_cpu_seconds_total{kind}``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

KINDS = ("store", "fetch", "hash")

_lock = threading.Lock()
_seconds = dict.fromkeys(KINDS, 0.0)


@contextmanager
def measured(kind: str) -> Iterator[None]:
    """Add the CPU this thread spends inside the block to ``kind``'s total. The block must
    not yield to the event loop (no ``await``), or another task's CPU would be counted."""
    if kind not in _seconds:
        raise ValueError(f"unknown byte transfer kind {kind!r}")
    start = time.thread_time()
    try:
        yield
    finally:
        spent = time.thread_time() - start
        with _lock:
            _seconds[kind] += spent


def measuring(kind: str, func: Callable[P, T]) -> Callable[P, T]:
    """``func`` with its CPU added to ``kind``: for a call handed to a thread."""

    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        with measured(kind):
            return func(*args, **kwargs)

    return call


def seconds() -> dict[str, float]:
    """The totals by kind since this process started."""
    with _lock:
        return dict(_seconds)
