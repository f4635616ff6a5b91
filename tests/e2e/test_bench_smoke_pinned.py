"""The benchmarks that simulate nodes (``--pin``: each worker on CPUs of its own, by
taskset): their smoke runs also check that every ffmpeg ran on its worker's CPUs."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.bench_smokes import (
    PINNED,
    SMOKE_LIMIT_SECONDS,
    STOP_GRACE_SECONDS,
    run_smoke,
)

pytestmark = pytest.mark.integration


@pytest.mark.timeout(SMOKE_LIMIT_SECONDS + STOP_GRACE_SECONDS + 20)
@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None,
    reason="--pin needs two CPUs and taskset",
)
@pytest.mark.parametrize("script", sorted(PINNED))
def test_pinned_benchmark_smoke_run_keeps_each_worker_on_its_cpus(script: str) -> None:
    stdout = run_smoke(script, *PINNED[script])
    assert "worker-2: CPUs " in stdout, stdout[-3000:]  # the second node's worker, where it ran
