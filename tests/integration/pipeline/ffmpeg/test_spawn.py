"""The sandbox's process starter, on both event loops the project runs (asyncio in tests,
uvloop in the worker): output, exit status, signals, the pidfd-less fallback, a binary that
does not exist, and a wait cancelled from outside."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from aivedio.pipeline.ffmpeg.spawn import spawn

# The databases' thread (tests/conftest.py) may still be dropping the previous file's last
# database when these tests start: its sockets would count as this process's descriptors.
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("settled_databases")]

ENV = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.fixture(
    params=[("asyncio", {}), ("asyncio", {"use_uvloop": True})], ids=["asyncio", "uvloop"]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param  # type: ignore[no-any-return]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_output_and_status(tmp_path: Path) -> None:
    script = "import sys; sys.stdout.write('out' * 100000); sys.stderr.write('err'); sys.exit(3)"
    out: list[bytes] = []
    err: list[bytes] = []
    process = await spawn(
        [sys.executable, "-c", script],
        cwd=str(tmp_path),
        env=ENV,
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert await process.wait() == 3
    await process.drained()
    await process.aclose()
    results = {"out": b"".join(out), "err": b"".join(err)}
    assert results == {"out": b"out" * 100000, "err": b"err"}
    assert process.returncode == 3


async def test_cwd_and_environment_are_the_callers(tmp_path: Path) -> None:
    script = "import os; print(os.getcwd()); print(sorted(os.environ))"
    chunks: list[bytes] = []
    process = await spawn(
        [sys.executable, "-c", script],
        cwd=str(tmp_path),
        env={"LC_ALL": "C"},
        on_stdout=chunks.append,
    )
    assert await process.wait() == 0
    await process.drained()
    await process.aclose()
    out = b"".join(chunks)
    cwd, names = out.decode().splitlines()
    assert Path(cwd) == tmp_path
    assert "LC_ALL" in names and "PATH" not in names


async def test_a_signal_is_a_negative_status_and_the_process_leads_its_group(
    tmp_path: Path,
) -> None:
    process = await spawn(["sleep", "30"], cwd=str(tmp_path), env=ENV)
    assert os.getpgid(process.pid) == process.pid  # its own group: killpg reaches it
    os.killpg(process.pid, signal.SIGKILL)
    with anyio.fail_after(10):
        assert await process.wait() == -signal.SIGKILL
    await process.aclose()


async def test_without_a_pidfd_the_exit_is_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "pidfd_open")
    process = await spawn(["sh", "-c", "sleep 0.2; exit 7"], cwd=str(tmp_path), env=ENV)
    with anyio.fail_after(10):
        assert await process.wait() == 7
    await process.aclose()


async def test_a_missing_binary_raises_and_leaks_nothing(tmp_path: Path) -> None:
    before = _open_fds()
    with pytest.raises(FileNotFoundError):
        await spawn([str(tmp_path / "no-such-tool")], cwd=str(tmp_path), env=ENV)
    assert _open_fds() == before


async def test_a_cancelled_wait_leaves_the_child_to_the_caller(tmp_path: Path) -> None:
    warm = await spawn(["true"], cwd=str(tmp_path), env=ENV)  # uvloop opens /dev/null once
    await warm.wait()
    await warm.aclose()
    await anyio.sleep(0)
    before = _open_fds()
    process = await spawn(["sleep", "30"], cwd=str(tmp_path), env=ENV)
    with anyio.move_on_after(0.2) as scope:
        await process.wait()
    assert scope.cancelled_caught
    assert process.returncode is None  # still running: the caller decides
    os.killpg(process.pid, signal.SIGKILL)
    with anyio.fail_after(10):
        assert await process.wait() == -signal.SIGKILL
    await process.aclose()
    await anyio.sleep(0)  # let the loop drop the closed pipe transports
    assert _open_fds() == before


async def test_a_spawn_under_a_cancelled_scope_completes_and_leaks_nothing(tmp_path: Path) -> None:
    warm = await spawn(["true"], cwd=str(tmp_path), env=ENV)
    await warm.wait()
    await warm.aclose()
    await anyio.sleep(0)
    before = _open_fds()
    with anyio.CancelScope() as scope:
        scope.cancel()  # the pipes are attached shielded: the caller gets its process
        process = await spawn(["sleep", "30"], cwd=str(tmp_path), env=ENV)
    os.killpg(process.pid, signal.SIGKILL)
    with anyio.fail_after(10):
        assert await process.wait() == -signal.SIGKILL
    await process.aclose()
    await anyio.sleep(0)
    assert _open_fds() == before


async def test_a_failing_callback_is_raised_by_drained(tmp_path: Path) -> None:
    seen: list[bytes] = []

    def broken(chunk: bytes) -> None:
        seen.append(chunk)
        raise ValueError("cannot parse")

    process = await spawn(
        [sys.executable, "-c", "print('x' * 300000)"],
        cwd=str(tmp_path),
        env=ENV,
        on_stdout=broken,
        on_stderr=lambda _: None,
    )
    with anyio.fail_after(10):
        assert await process.wait() == 0
        with pytest.raises(ValueError, match="cannot parse"):
            await process.drained()
    await process.aclose()
    assert len(seen) == 1  # fed nothing more once it failed


RACE = """
import os, sys, threading
import uvloop
from aivedio.pipeline.ffmpeg.spawn import spawn

def opener(stop, errors, path):
    while not stop.is_set():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"x")
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                errors.append("descriptor swapped")
            os.close(fd)
        except OSError as exc:
            errors.append(repr(exc))

async def main(directory, children):
    stop, errors = threading.Event(), []
    path = os.path.join(directory, "file")
    threads = [threading.Thread(target=opener, args=(stop, errors, path)) for _ in range(2)]
    for thread in threads:
        thread.start()
    spawned = 0
    try:
        while spawned < children:
            process = await spawn(["true"], cwd=directory, env={"PATH": os.environ["PATH"]},
                                  on_stdout=lambda _: None, on_stderr=lambda _: None)
            await process.wait()
            await process.drained()
            await process.aclose()
            spawned += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    print(spawned, len(errors), errors[:3])

uvloop.run(main(sys.argv[1], int(sys.argv[2])))
"""


def test_no_descriptor_of_another_thread_is_closed_by_a_finished_child(tmp_path: Path) -> None:
    """Under uvloop, with threads opening files all the while (the object store's), two
    thousand children started and closed leave every thread's descriptors alone. Pipe files
    handed to uvloop were closed twice (MagicStack/uvloop#763): within a few seconds the old
    code aborted, hung or saw EBADF in the threads (most runs; not every one)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", RACE, str(tmp_path), "2000"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    spawned, errors, _ = done.stdout.split(" ", 2)
    assert (spawned, errors) == ("2000", "0"), done.stdout
