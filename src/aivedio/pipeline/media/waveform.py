"""Waveform peaks in BBC audiowaveform JSON (version 2) from raw PCM, without audiowaveform.

The media stage has ffmpeg decode the audio to mono signed 16-bit little-endian PCM
(``-f s16le -ac 1 -ar RATE``); this module turns that file into the min/max-per-pixel data
peaks.js (waveform-data.js) reads, one document per zoom level (``samples_per_pixel``).

Why not a per-sample loop: an hour at 11 025 Hz is 40 M samples, far too slow in Python. The
file is read in bounded chunks into ``array('h')`` and each window is reduced with the builtin
``min``/``max`` over a slice (C speed). All zooms come from ONE pass: the finest zoom and every
zoom that no coarser one can be derived from are computed from the samples; a zoom that is a
multiple of an already computed zoom is reduced from that zoom's pixels afterwards (a min of
mins is the min), which is exact, including the last partial window. A window that straddles a
chunk boundary is carried in a small per-zoom accumulator, so chunks need no alignment.

Conversion to 8 bits follows audiowaveform's C++ ``value / 256``: integer division truncating
toward zero (so -255 becomes 0, not -1 as Python's ``//`` would give); the result of a 16-bit
value is always within -128..127. The last partial window counts as a pixel, exactly as
audiowaveform's ``done()`` flushes it. Sources without audio get :func:`silent_waveform`, so
the published set of files has the same shape for every asset.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

CHUNK_BYTES = 1 << 20  # 1 MiB of PCM = 524 288 samples per read
MIN_ZOOM = 2  # audiowaveform refuses samples_per_pixel < 2 ("Invalid zoom: minimum 2")

_INT16_MAX = 32767
_INT16_MIN = -32768


class _Window:
    """Min/max reducer for one ``samples_per_pixel``, carrying a partial window across chunks."""

    __slots__ = ("count", "hi", "lo", "out", "zoom")

    def __init__(self, zoom: int) -> None:
        self.zoom = zoom
        self.out = array("h")  # interleaved min, max (16-bit, converted to 8 bits at the end)
        self.count = 0  # samples already in the pending window
        self.lo = _INT16_MAX
        self.hi = _INT16_MIN

    def feed(self, samples: array[int]) -> None:
        n = len(samples)
        if n == 0:
            return
        zoom = self.zoom
        out = self.out
        i = 0
        if self.count:
            i = min(zoom - self.count, n)
            head = samples[:i]
            self.lo = min(self.lo, min(head))
            self.hi = max(self.hi, max(head))
            self.count += i
            if self.count < zoom:
                return
            out.append(self.lo)
            out.append(self.hi)
            self.count = 0
        end = i + (n - i) // zoom * zoom
        if end > i:
            windows = [samples[j : j + zoom] for j in range(i, end, zoom)]
            pairs = array("h", bytes(4 * len(windows)))
            pairs[0::2] = array("h", map(min, windows))
            pairs[1::2] = array("h", map(max, windows))
            out.extend(pairs)
        if end < n:
            tail = samples[end:]
            self.lo = min(tail)
            self.hi = max(tail)
            self.count = n - end

    def finish(self) -> array[int]:
        if self.count:
            self.out.append(self.lo)
            self.out.append(self.hi)
            self.count = 0
        return self.out


def _reduce(pixels: array[int], factor: int) -> array[int]:
    """Coarser pixels from finer ones: each output pixel is ``factor`` input pixels."""
    mins = pixels[0::2]
    maxes = pixels[1::2]
    out = array("h")
    for p in range(0, len(mins), factor):
        out.append(min(mins[p : p + factor]))
        out.append(max(maxes[p : p + factor]))
    return out


def _check(sample_rate: int, zooms: Sequence[int], bits: int) -> list[int]:
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    if bits not in (8, 16):
        raise ValueError(f"bits must be 8 or 16, got {bits}")
    if not zooms:
        raise ValueError("at least one zoom (samples_per_pixel) is required")
    for zoom in zooms:
        if zoom < MIN_ZOOM:
            raise ValueError(f"samples_per_pixel must be >= {MIN_ZOOM}, got {zoom}")
    return sorted(set(zooms))


def _document(pixels: Sequence[int], *, sample_rate: int, zoom: int, bits: int) -> dict[str, Any]:
    # 8 bits: C++ ``v / 256`` truncates toward zero; ``v / 256`` is exact in binary floating point.
    data = [int(v / 256) for v in pixels] if bits == 8 else list(pixels)
    return {
        "version": 2,
        "channels": 1,
        "sample_rate": sample_rate,
        "samples_per_pixel": zoom,
        "bits": bits,
        "length": len(data) // 2,
        "data": data,
    }


def compute_peaks(
    pcm_path: Path, *, sample_rate: int, zooms: Sequence[int], bits: int = 8
) -> dict[int, dict[str, Any]]:
    """Waveform documents keyed by zoom, from mono s16le PCM, in one bounded-memory pass.

    A trailing odd byte (a torn last sample) is ignored. Memory is one chunk plus the output.
    """
    ordered = _check(sample_rate, zooms, bits)
    # For each zoom, the coarsest already-planned zoom it is a multiple of (None: from samples).
    source: dict[int, int | None] = {}
    for k, zoom in enumerate(ordered):
        divisors = [z for z in ordered[:k] if zoom % z == 0]
        source[zoom] = divisors[-1] if divisors else None
    direct = [_Window(z) for z in ordered if source[z] is None]

    swap = sys.byteorder == "big"
    carry = b""
    with pcm_path.open("rb") as handle:
        while True:
            chunk = handle.read(CHUNK_BYTES)
            if not chunk:
                break
            if carry:
                chunk = carry + chunk
            usable = len(chunk) - (len(chunk) & 1)
            carry = chunk[usable:]
            samples = array("h")
            samples.frombytes(chunk[:usable])
            if swap:
                samples.byteswap()
            for window in direct:
                window.feed(samples)

    pixels: dict[int, array[int]] = {w.zoom: w.finish() for w in direct}
    for zoom in ordered:
        base = source[zoom]
        if base is not None:
            pixels[zoom] = _reduce(pixels[base], zoom // base)
    return {
        zoom: _document(pixels[zoom], sample_rate=sample_rate, zoom=zoom, bits=bits)
        for zoom in ordered
    }


def silent_waveform(
    duration_seconds: float, sample_rate: int, zooms: Sequence[int], bits: int = 8
) -> dict[int, dict[str, Any]]:
    """All-zero documents of the length real audio of that duration would have produced."""
    ordered = _check(sample_rate, zooms, bits)
    if not math.isfinite(duration_seconds) or duration_seconds < 0:
        raise ValueError(f"duration must be a finite non-negative number, got {duration_seconds}")
    n_samples = round(duration_seconds * sample_rate)
    return {
        zoom: _document(
            [0] * (2 * -(-n_samples // zoom)), sample_rate=sample_rate, zoom=zoom, bits=bits
        )
        for zoom in ordered
    }


def waveform_name(zoom: int, stem: str = "waveform") -> str:
    return f"{stem}_{zoom}.json"


def write_waveforms(
    peaks: dict[int, dict[str, Any]], out_dir: Path, stem: str = "waveform"
) -> list[Path]:
    """Write ``{stem}_{zoom}.json`` (compact JSON) per zoom, in zoom order; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for zoom in sorted(peaks):
        path = out_dir / waveform_name(zoom, stem)
        path.write_bytes(msgspec.json.encode(peaks[zoom]))
        paths.append(path)
    return paths
