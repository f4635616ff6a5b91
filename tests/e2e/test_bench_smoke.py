"""Every benchmark still runs, and fails at once when a process it started dies.

A benchmark is run by hand, rarely; between two runs it rots unseen (``scripts/bench/queue.py``
waited 600 s for workers that had refused to start since the moderation backend became
required, their stderr in /dev/null). So each benchmark script has a ``--smoke`` mode (tiny
sizes, its own results checked for sanity, the verdict line ``smoke: NAME ok``) that runs
here, and the watcher of ``scripts/lib/children.py`` that the benchmarks start their
processes with is held to failing a run at once, with the child's stderr, in each way a
script can be waiting (blocked in the main thread, in a coroutine, in ``asyncio.run``).

The chaos harness (``scripts/chaos``) has its small run in ``test_chaos.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
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
# Not benchmarks by themselves: the workloads a benchmark runs as its children (they need
# its servers), run by that benchmark's smoke mode.
WORKLOADS = {
    "boto3_upload.py": "fetch.py",
    "fetch_worker.py": "fetch.py",
    "procrastinate_drain.py": "queue.py",
}
# The benchmarks that simulate nodes (``--pin``: each worker on CPUs of its own, by taskset),
# whose smoke run also checks that every ffmpeg ran on its worker's CPUs.
PINNED = ("chunked.py", "fleet.py")
# A smoke run takes under 30 s on 2 busy cores; this only stops one that hangs.
SMOKE_LIMIT_SECONDS = 100
STOP_GRACE_SECONDS = 30

pytestmark = pytest.mark.integration


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


def test_every_benchmark_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SMOKES) | set(WORKLOADS), (
        "a benchmark script with neither a --smoke run here nor a parent that runs it: "
        f"{sorted(scripts - set(SMOKES) - set(WORKLOADS))}"
    )
    for name in SMOKES:
        assert '"--smoke"' in (BENCH / name).read_text(), name
    for workload, parent in WORKLOADS.items():
        assert workload in (BENCH / parent).read_text(), (workload, parent)


@pytest.mark.timeout(SMOKE_LIMIT_SECONDS + STOP_GRACE_SECONDS + 20)
@pytest.mark.parametrize("script", sorted(SMOKES))
def test_benchmark_smoke_run_passes(script: str) -> None:
    code, stdout, stderr, seconds = run_script(
        [sys.executable, str(BENCH / script), "--smoke", *SMOKES[script]], SMOKE_LIMIT_SECONDS
    )
    name = script.removesuffix(".py")
    tail = "\n".join(stdout.splitlines()[-30:]) + "\n" + stderr[-4000:]
    assert code == 0, f"{script} --smoke exited {code} after {seconds:.1f} s:\n{tail}"
    assert f"smoke: {name} ok" in stdout.splitlines(), tail


@pytest.mark.timeout(SMOKE_LIMIT_SECONDS + STOP_GRACE_SECONDS + 20)
@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None,
    reason="--pin needs two CPUs and taskset",
)
@pytest.mark.parametrize("script", PINNED)
def test_pinned_benchmark_smoke_run_keeps_each_worker_on_its_cpus(script: str) -> None:
    code, stdout, stderr, seconds = run_script(
        [sys.executable, str(BENCH / script), "--smoke", "--pin"], SMOKE_LIMIT_SECONDS
    )
    name = script.removesuffix(".py")
    tail = "\n".join(stdout.splitlines()[-30:]) + "\n" + stderr[-4000:]
    assert code == 0, f"{script} --smoke --pin exited {code} after {seconds:.1f} s:\n{tail}"
    assert f"smoke: {name} ok" in stdout.splitlines(), tail
    assert "worker-2: CPUs " in stdout, tail  # the second node's worker and where it ran


# -- the watcher -------------------------------------------------------------------------------

DOOMED = (
    "import sys, time; time.sleep(0.3); "
    "print('aivedio: config error: moderation.backend: not set', file=sys.stderr); sys.exit(2)"
)
# How the script using the watcher waits while its child dies: blocked in the main thread,
# in a coroutine (Children entered inside the loop), inside asyncio.run (entered outside).
WAITS = {
    "blocked": """
        with Children(logs) as children:
            children.start("doomed worker", [sys.executable, "-c", DOOMED])
            time.sleep(60)
    """,
    "coroutine": """
        async def main():
            with Children(logs) as children:
                children.start("doomed worker", [sys.executable, "-c", DOOMED])
                await asyncio.sleep(60)
        asyncio.run(main())
    """,
    "asyncio.run": """
        with Children(logs) as children:
            children.start("doomed worker", [sys.executable, "-c", DOOMED])
            asyncio.run(asyncio.sleep(60))
    """,
}


def watcher_script(tmp_path: Path, body: str) -> list[str]:
    head = f"""
        import asyncio, signal, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(LIB)!r})
        from children import Children, ChildExited
        DOOMED = {DOOMED!r}
        logs = Path({str(tmp_path / "logs")!r})
    """
    source = textwrap.dedent(head) + textwrap.dedent(body)
    return [sys.executable, "-c", source]


@pytest.mark.parametrize("wait", sorted(WAITS))
def test_a_child_that_exits_early_fails_the_run_at_once_with_its_stderr(
    tmp_path: Path, wait: str
) -> None:
    code, stdout, stderr, seconds = run_script(watcher_script(tmp_path, WAITS[wait]), 30)
    assert code == 1, (code, stdout, stderr)
    assert seconds < 10, f"failed after {seconds:.1f} s, not at once: {stderr}"
    assert "doomed worker" in stderr and "exited with status 2" in stderr, stderr
    assert "moderation.backend: not set" in stderr, stderr  # the child's own words
    assert "Traceback" not in stderr, stderr
    assert (tmp_path / "logs" / "doomed-worker.log").read_text().strip().endswith("not set")


def test_children_told_to_stop_and_finished_runs_fail_nothing(tmp_path: Path) -> None:
    body = """
        with Children(logs) as children:
            server = children.start("server", [sys.executable, "-c", "import time; time.sleep(60)"])
            other = children.start("other", [sys.executable, "-c", "import time; time.sleep(60)"])
            out = children.run("job", [sys.executable, "-c", "print('done')"])
            assert out == "done\\n", out
            assert server.stop() == -signal.SIGTERM
            time.sleep(1)  # the watcher sees it gone, told to stop
            assert other.alive()
        assert not other.alive()  # stopped on the way out
        print("clean")
    """
    code, stdout, stderr, _ = run_script(watcher_script(tmp_path, body), 30)
    assert (code, stdout.strip()) == (0, "clean"), stderr


def test_a_failed_run_to_completion_child_fails_with_its_stderr(tmp_path: Path) -> None:
    body = """
        with Children(logs) as children:
            try:
                children.run("fetch", [sys.executable, "-c", DOOMED])
            except ChildExited as exc:
                print("caught:", exc.message.splitlines()[0])
                print(exc.message.splitlines()[-1])
    """
    code, stdout, stderr, _ = run_script(watcher_script(tmp_path, body), 30)
    assert code == 0, stderr
    assert "caught: fetch (pid" in stdout and "exited with status 2" in stdout, stdout
    assert stdout.strip().endswith("moderation.backend: not set"), stdout
