"""Every benchmark still runs, and fails at once when a process it started dies.

A benchmark is run by hand, rarely; between two runs it rots unseen (``scripts/bench/queue.py``
waited 600 s for workers that had refused to start since the moderation backend became
required, their stderr in /dev/null). So each benchmark script has a ``--smoke`` mode (tiny
sizes, its own results checked for sanity, the verdict line ``smoke: NAME ok``) that runs
here, and the watcher of ``scripts/lib/children.py`` that the benchmarks start their
processes with is held to failing a run at once, with the child's stderr, in each way a
script can be waiting (blocked in the main thread, in a coroutine, in ``asyncio.run``).

The smoke runs of the benchmarks that spend their time in ffmpeg are in
``test_bench_smoke_media.py``, the pinned ones in ``test_bench_smoke_pinned.py``; the chaos
harness (``scripts/chaos``) has its small run in ``test_chaos.py``.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.bench_smokes import (
    BENCH,
    LIB,
    MEDIA_SMOKES,
    SMOKE_LIMIT_SECONDS,
    SMOKES,
    STOP_GRACE_SECONDS,
    WORKLOADS,
    run_script,
    run_smoke,
)

pytestmark = pytest.mark.integration


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
    assert set(MEDIA_SMOKES) <= set(SMOKES)


@pytest.mark.timeout(SMOKE_LIMIT_SECONDS + STOP_GRACE_SECONDS + 20)
@pytest.mark.parametrize("script", sorted(set(SMOKES) - set(MEDIA_SMOKES)))
def test_benchmark_smoke_run_passes(script: str) -> None:
    run_smoke(script)


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
