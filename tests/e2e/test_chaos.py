"""The small chaos run: ``scripts/chaos --n 20`` with a fixed seed must hold every invariant.

The harness (scripts/lib/chaos) starts its own PostgreSQL cluster, SeaweedFS (S3) on its own
data directory, the simulated provider, the API and two workers as processes; kills and
drains workers, restarts PostgreSQL once, SIGKILLs SeaweedFS and starts it again once, then
checks the invariants from the
database, the store and the logs. Exit 0 means every invariant held; on a failure the
output (the tables and each violation) is in the assertion message and the JSON report
under var/chaos-test/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261130

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_small_chaos_run_holds_every_invariant() -> None:
    harness = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "lib" / "chaos" / "main.py"),
            "--n",
            "20",
            "--seed",
            str(SEED),
            "--workdir",
            str(ROOT / "var" / "chaos-test"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = harness.communicate(timeout=360)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: the harness then stops the cluster, SeaweedFS, the provider, the
        # API and the workers it started (each in a session of its own) instead of leaving
        # them running after the test.
        harness.terminate()
        try:
            stdout, stderr = harness.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            harness.kill()
            stdout, stderr = harness.communicate()
        pytest.fail(
            "scripts/chaos did not finish in 360 s:\n"
            + "\n".join(stdout.splitlines()[-40:])
            + stderr[-2000:]
        )
    tail = "\n".join(stdout.splitlines()[-80:])
    assert harness.returncode == 0, (
        f"scripts/chaos exited {harness.returncode}:\n{tail}\n{stderr[-3000:]}"
    )
    assert "every invariant held" in stdout
