"""Loudness: the EBU R128 measurement of a source's audio and the gain that normalizes it.

Why. Videos side by side that jump in loudness are the complaint; a platform that
normalizes plays them at one level. The measurement costs an audio decode, and the fast
path's frames pass decodes the audio anyway (the decode check): the ``ebur128`` filter
rides on that decode (``measure_filter``), so a measured source costs no pass of its own.
Where no such pass runs (the queue path, a long source) an audio-only pass measures.

How. ``ebur128`` with ``metadata=1`` stamps every 100 ms frame with the integrated
loudness and range so far and the per-channel true peaks; ``ametadata`` prints them to a
file in the scratch directory (read back as numbers, never parsed from stderr), and the
last frame holds the whole track's figures (``parse_measurement``).

The normalization is the "two-pass linear" one: with the measurement in hand, a single
gain takes the integrated loudness to the target (``volume``), which changes nothing but
the level, as long as the true peak then stays under the ceiling. When it would not (a
quiet track with loud peaks), ffmpeg's ``loudnorm`` is given the measurement (its second
pass) and compresses dynamically, then the audio is resampled back to its own rate
(``loudnorm`` works at 192 kHz). Silence (below the absolute gate) is left as it is.

A copied (remuxed) source keeps its own audio while it is within ``tolerance_lu`` of the
target and under the ceiling (``on_target``); otherwise its audio alone is re-encoded.
"""

from __future__ import annotations

import math

import msgspec

from aivedio.config.media import LoudnessConfig

# The file the measurement is printed to (in the process's scratch directory).
MEASURED = "loudness.txt"
# ebur128's absolute gate: an integrated loudness at or below it is silence.
SILENCE_LUFS = -70.0
# The relative gate of BS.1770 sits 10 LU under the absolute-gated loudness: the
# threshold ``loudnorm``'s second pass is told.
RELATIVE_GATE_LU = 10.0


class Loudness(msgspec.Struct, frozen=True, kw_only=True):
    """A track's EBU R128 figures."""

    integrated_lufs: float
    range_lu: float
    true_peak_dbtp: float

    @property
    def silent(self) -> bool:
        return self.integrated_lufs <= SILENCE_LUFS


def measure_filter(path: str = MEASURED) -> str:
    """The chain that measures the audio it passes through (unchanged) into ``path``."""
    return f"ebur128=peak=true:metadata=1,ametadata=mode=print:file={path}"


def _db(linear: float) -> float:
    return 20.0 * math.log10(linear) if linear > 0 else -math.inf


def parse_measurement(text: str) -> Loudness | None:
    """The figures of the last frame ``measure_filter`` printed (the true peak: the highest
    of any channel at any frame); None when nothing was printed (no audio decoded)."""
    integrated: float | None = None
    lra = 0.0
    peak = 0.0
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if key == "lavfi.r128.I":
            integrated = number
        elif key == "lavfi.r128.LRA":
            lra = number
        elif key.startswith("lavfi.r128.true_peaks_ch") and math.isfinite(number):
            peak = max(peak, number)
    if integrated is None or not math.isfinite(integrated):
        return None
    true_peak = _db(peak)
    return Loudness(
        integrated_lufs=round(integrated, 2),
        range_lu=round(lra, 2),
        true_peak_dbtp=round(true_peak, 2) if math.isfinite(true_peak) else -150.0,
    )


def on_target(measured: Loudness, config: LoudnessConfig) -> bool:
    """Whether a copy of the track may stand as normalized: silent, or within the
    tolerance of the target and under the ceiling (plus the tolerance)."""
    if measured.silent:
        return True
    close = abs(measured.integrated_lufs - config.target_lufs) <= config.tolerance_lu
    return close and measured.true_peak_dbtp <= config.true_peak_dbtp + config.tolerance_lu


def gain_db(measured: Loudness, config: LoudnessConfig) -> float:
    return config.target_lufs - measured.integrated_lufs


def normalize_filter(measured: Loudness, config: LoudnessConfig, sample_rate: int) -> str:
    """The audio filter that takes a track measured as ``measured`` to the target; "" for
    silence. A single gain when the peak allows (linear), else ``loudnorm``'s second pass
    with the measurement, resampled back to ``sample_rate``."""
    if measured.silent:
        return ""
    gain = gain_db(measured, config)
    if measured.true_peak_dbtp + gain <= config.true_peak_dbtp:
        return f"volume={gain:.2f}dB"
    threshold = measured.integrated_lufs - RELATIVE_GATE_LU
    return (
        f"loudnorm=I={config.target_lufs:g}:TP={config.true_peak_dbtp:g}"
        f":LRA={config.range_lu:g}:measured_I={measured.integrated_lufs:.2f}"
        f":measured_LRA={measured.range_lu:.2f}:measured_TP={measured.true_peak_dbtp:.2f}"
        f":measured_thresh={threshold:.2f}:linear=true,aresample={sample_rate}"
    )
