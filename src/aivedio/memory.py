"""Keep a long-running streamer's memory flat: large buffers go to mmap and back to the OS.

glibc serves large allocations with mmap, but raises that threshold dynamically each time
such a block is freed (up to 32 MiB). After the first few multipart parts are freed, every
later 8 MiB part buffer comes from the heap instead, and the heap's freed blocks are kept,
fragmented, by the process: peak RSS grows to several times the bytes actually in flight.
Pinning the threshold at 1 MiB (which also turns the dynamic adjustment off) returns each
part buffer to the OS when it is freed, at the cost of a page fault per page of a new part.
Measured in scripts/bench/fetch.py: 128 MiB peak RSS instead of 180 MiB for the same fetch.

Pinning it leaves the trim threshold at its 128 KiB default, though: the top of the heap is
given back to the OS and faulted in again over and over as 256 KiB network chunks come and
go. An 8 MiB trim threshold keeps that much free heap mapped: in the same benchmark, 7k page
faults per 512 MiB instead of 15-50k, for 2 MiB more peak RSS.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_THRESHOLD_BYTES = 8 << 20


def tune_allocator() -> bool:
    """Pin glibc's mmap and trim thresholds; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
