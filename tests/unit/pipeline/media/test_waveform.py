from __future__ import annotations

import math
import random
import shutil
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import msgspec
import pytest

from aivedio.pipeline.media import waveform
from aivedio.pipeline.media.waveform import compute_peaks, silent_waveform, write_waveforms

FFMPEG = shutil.which("ffmpeg")


def _write_pcm(path: Path, samples: list[int]) -> Path:
    data = array("h", samples)
    if sys.byteorder == "big":  # pragma: no cover
        data.byteswap()
    path.write_bytes(data.tobytes())
    return path


def _c_div(value: int, divisor: int) -> int:
    """C/C++ integer division (truncates toward zero)."""
    q = abs(value) // divisor
    return q if value >= 0 else -q


def _reference(samples: list[int], zoom: int, bits: int) -> list[int]:
    """audiowaveform's WaveformGenerator::process/done, one sample at a time."""
    out: list[int] = []
    lo, hi, count = 32767, -32768, 0
    for s in samples:
        lo, hi, count = min(lo, s), max(hi, s), count + 1
        if count == zoom:
            out += [lo, hi]
            lo, hi, count = 32767, -32768, 0
    if count:
        out += [lo, hi]
    return [_c_div(v, 256) for v in out] if bits == 8 else out


def _random_samples(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    edge = [-32768, 32767, -256, -255, -257, 255, 256, 0, -1]
    return [
        rng.choice(edge) if rng.random() < 0.02 else rng.randint(-32768, 32767) for _ in range(n)
    ]


@pytest.mark.parametrize("chunk_bytes", [2, 7, 64, 1000, 1 << 20])
@pytest.mark.parametrize("bits", [8, 16])
def test_matches_per_sample_reference_across_chunk_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int, bits: int
) -> None:
    samples = _random_samples(5003, seed=chunk_bytes)
    pcm = _write_pcm(tmp_path / "a.pcm", samples)
    monkeypatch.setattr(waveform, "CHUNK_BYTES", chunk_bytes)
    zooms = [2, 3, 8, 24, 64, 96, 100, 256, 7000]  # multiples, non-multiples, > file length
    peaks = compute_peaks(pcm, sample_rate=11025, zooms=zooms, bits=bits)
    assert sorted(peaks) == zooms
    for zoom in zooms:
        doc = peaks[zoom]
        assert doc["data"] == _reference(samples, zoom, bits), zoom
        assert doc["length"] == math.ceil(len(samples) / zoom)
        assert len(doc["data"]) == 2 * doc["length"]


def test_document_shape_is_audiowaveform_v2(tmp_path: Path) -> None:
    pcm = _write_pcm(tmp_path / "a.pcm", [0, 100, -100, 32767, -32768])
    peaks = compute_peaks(pcm, sample_rate=8000, zooms=[2], bits=16)
    assert peaks == {
        2: {
            "version": 2,
            "channels": 1,
            "sample_rate": 8000,
            "samples_per_pixel": 2,
            "bits": 16,
            "length": 3,  # the last partial window (one sample) is a pixel
            "data": [0, 100, -100, 32767, -32768, -32768],
        }
    }


def test_eight_bit_truncates_toward_zero_like_audiowaveform(tmp_path: Path) -> None:
    samples = [-255, -1, -256, -257, 255, 256, -32768, 32767]
    pcm = _write_pcm(tmp_path / "a.pcm", samples)
    doc = compute_peaks(pcm, sample_rate=8000, zooms=[2], bits=8)[2]
    # pairs: (-255,-1) (-257,-256) (255,256) (-32768,32767)
    assert doc["data"] == [0, 0, -1, -1, 0, 1, -128, 127]
    assert all(-128 <= v <= 127 for v in doc["data"])


def test_empty_file_and_torn_last_sample(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pcm"
    empty.write_bytes(b"")
    doc = compute_peaks(empty, sample_rate=11025, zooms=[256, 512], bits=8)
    assert doc[256]["length"] == 0 and doc[256]["data"] == []
    assert doc[512]["length"] == 0 and doc[512]["data"] == []

    torn = tmp_path / "torn.pcm"
    torn.write_bytes(_write_pcm(tmp_path / "x.pcm", [1000, -1000, 500]).read_bytes() + b"\x7f")
    doc16 = compute_peaks(torn, sample_rate=11025, zooms=[2], bits=16)[2]
    assert doc16["data"] == [-1000, 1000, 500, 500]


def test_invalid_arguments(tmp_path: Path) -> None:
    pcm = _write_pcm(tmp_path / "a.pcm", [0] * 10)
    with pytest.raises(ValueError, match="samples_per_pixel"):
        compute_peaks(pcm, sample_rate=8000, zooms=[1])
    with pytest.raises(ValueError, match="bits"):
        compute_peaks(pcm, sample_rate=8000, zooms=[2], bits=12)
    with pytest.raises(ValueError, match="zoom"):
        compute_peaks(pcm, sample_rate=8000, zooms=[])
    with pytest.raises(ValueError, match="sample_rate"):
        compute_peaks(pcm, sample_rate=0, zooms=[2])


def test_duplicate_zooms_collapse(tmp_path: Path) -> None:
    pcm = _write_pcm(tmp_path / "a.pcm", list(range(-50, 50)))
    assert sorted(compute_peaks(pcm, sample_rate=8000, zooms=[8, 4, 8])) == [4, 8]


def test_silent_waveform_has_the_shape_real_audio_would(tmp_path: Path) -> None:
    rate, seconds = 11025, 3.7
    zooms = [256, 300, 512]
    pcm = _write_pcm(tmp_path / "zero.pcm", [0] * round(seconds * rate))
    real = compute_peaks(pcm, sample_rate=rate, zooms=zooms, bits=8)
    assert silent_waveform(seconds, rate, zooms, bits=8) == real
    assert silent_waveform(0.0, rate, [256])[256]["length"] == 0
    with pytest.raises(ValueError, match="duration"):
        silent_waveform(-1.0, rate, [256])


def test_write_waveforms_compact_json(tmp_path: Path) -> None:
    peaks = silent_waveform(1.0, 8000, [512, 256], bits=16)
    paths = write_waveforms(peaks, tmp_path / "out")
    assert [p.name for p in paths] == ["waveform_256.json", "waveform_512.json"]
    raw = paths[0].read_bytes()
    assert b" " not in raw and b"\n" not in raw
    decoded: dict[str, Any] = msgspec.json.decode(raw)
    assert decoded == peaks[256]
    other = write_waveforms(peaks, tmp_path / "out", stem="wf")
    assert [p.name for p in other] == ["wf_256.json", "wf_512.json"]


@pytest.mark.skipif(FFMPEG is None, reason="ffmpeg not installed")
def test_ffmpeg_s16le_output(tmp_path: Path) -> None:
    pcm = tmp_path / "tone.pcm"
    subprocess.run(
        [
            *(FFMPEG or "ffmpeg", "-v", "error"),
            *("-f", "lavfi", "-i", "sine=f=440:d=2:sample_rate=11025"),
            *("-f", "s16le", "-ac", "1", "-ar", "11025", str(pcm)),
        ],
        check=True,
        timeout=30,
    )
    data = array("h")
    data.frombytes(pcm.read_bytes())
    if sys.byteorder == "big":  # pragma: no cover
        data.byteswap()
    samples = data.tolist()
    assert len(samples) == 2 * 11025
    peaks = compute_peaks(pcm, sample_rate=11025, zooms=[256, 512], bits=8)
    for zoom in (256, 512):
        assert peaks[zoom]["data"] == _reference(samples, zoom, 8)
        assert peaks[zoom]["length"] == math.ceil(2 * 11025 / zoom)
    # lavfi sine is 1/8 full scale: about +-16 in 8 bits
    assert max(peaks[512]["data"]) in range(14, 18)
