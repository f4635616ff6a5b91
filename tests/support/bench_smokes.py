"""What the benchmark smoke tests share: the scripts, their smoke arguments, and a runner.

The smoke runs are spread over three test files (``test_bench_smoke*.py``) because the suite's
workers take a file at a time: in one file they held one worker for minutes while the other
was idle.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SERVER_DSN

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench"
LIB = ROOT / "scripts" / "lib"

# Each benchmark and the arguments its smoke run needs here (the PostgreSQL server of the
# suite; fleet.py and chunked.py start clusters of their own).
SMOKES: dict[str, list[str]] = {
    "chunked.py": [],
    "fetch.py": [],
    "fleet.py": [],
    "media.py": [],
    "overheads.py": ["--database-url", SERVER_DSN],
    "playback_tokens.py": [],
    "publish.py": ["--dsn", SERVER_DSN],
    "queue.py": ["--server-dsn", SERVER_DSN],
    "time_to_playable.py": ["--server-dsn", SERVER_DSN],
    "uploads.py": ["--server-dsn", SERVER_DSN],
}
# The smoke runs that spend their time in ffmpeg, in a file of their own.
MEDIA_SMOKES = ("chunked.py", "fleet.py", "media.py", "time_to_playable.py")
# Not benchmarks by themselves: the workloads a benchmark runs as its children (they need
# its servers), run by that benchmark's smoke mode.
WORKLOADS = {
    "boto3_upload.py": "fetch.py",
    "fetch_worker.py": "fetch.py",
    "procrastinate_drain.py": "queue.py",
}
# The benchmarks that simulate nodes (``--pin``: each worker on CPUs of its own, by taskset),
# whose smoke run also checks that every ffmpeg ran on its worker's CPUs, and the arguments
# of that run. fleet.py: one pinned run of two workers (each on a node of its own, the case
# with something to check), not a run of one and then one of two: each run starts a cluster
# of its own, about 15 s, and the unpinned smoke run (MEDIA_SMOKES) takes the same path.
# chunked.py: all three runs, since its pinned model is fitted on the run of one worker.
PINNED: dict[str, list[str]] = {
    "chunked.py": ["--pin"],
    "fleet.py": ["--pin", "--pin-workers", "2"],
}
# A smoke run takes under 30 s on 2 busy cores; this only stops one that hangs.
SMOKE_LIMIT_SECONDS = 100
STOP_GRACE_SECONDS = 30


def run_script(argv: list[str], limit: float) -> tuple[int, str, str, float]:
    """Exit status, stdout, stderr and wall seconds; past ``limit`` the script gets SIGINT
    (it stops the processes it started, each in a session of its own), then SIGKILL."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(
            f"{' '.join(argv)} did not finish in {limit:g} s:\n{stdout[-3000:]}\n{stderr[-3000:]}"
        )
    return proc.returncode, stdout, stderr, time.monotonic() - started


def run_smoke(script: str, *extra: str) -> str:
    """Run ``script --smoke`` with its arguments; fail with its tail unless it exits 0 and
    prints its verdict line. Returns its stdout."""
    code, stdout, stderr, seconds = run_script(
        [sys.executable, str(BENCH / script), "--smoke", *SMOKES[script], *extra],
        SMOKE_LIMIT_SECONDS,
    )
    name = script.removesuffix(".py")
    tail = "\n".join(stdout.splitlines()[-30:]) + "\n" + stderr[-4000:]
    argv = " ".join(("--smoke", *extra))
    assert code == 0, f"{script} {argv} exited {code} after {seconds:.1f} s:\n{tail}"
    assert f"smoke: {name} ok" in stdout.splitlines(), tail
    return stdout
