"""The smoke runs of the benchmarks that spend their time in ffmpeg (see
``test_bench_smoke.py``; a file of their own so that they and the rest run on both workers)."""

from __future__ import annotations

import pytest

from tests.support.bench_smokes import (
    MEDIA_SMOKES,
    SMOKE_LIMIT_SECONDS,
    STOP_GRACE_SECONDS,
    run_smoke,
)

pytestmark = pytest.mark.integration


@pytest.mark.timeout(SMOKE_LIMIT_SECONDS + STOP_GRACE_SECONDS + 20)
@pytest.mark.parametrize("script", MEDIA_SMOKES)
def test_benchmark_smoke_run_passes(script: str) -> None:
    run_smoke(script)
