"""The verdict of a benchmark's ``--smoke`` run: tiny sizes, and its own results checked.

A smoke run measures nothing worth recording; it proves that the benchmark still runs end to
end and that what it measured is sane (every job done once, every checksum right, every
figure a positive number), so that a benchmark cannot rot unseen between the runs made by
hand. ``tests/e2e/test_bench_smoke.py`` runs each one and looks for the verdict line.
"""

from __future__ import annotations

import math
import sys
from typing import Any


def positive(value: Any) -> bool:
    """A finite number above zero (a rate, a duration, a size)."""
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def verdict(name: str, problems: list[str]) -> int:
    """Print the verdict line (``smoke: NAME ok``) or each problem; the exit status."""
    if problems:
        for problem in problems:
            print(f"smoke: {name}: {problem}", file=sys.stderr, flush=True)
        print(f"smoke: {name} FAILED ({len(problems)} problems)", flush=True)
        return 1
    print(f"smoke: {name} ok", flush=True)
    return 0
