"""The ffmpeg runner itself: deadline and cancellation kill the whole process group, rlimits,
a cleared environment, the network namespace, progress, CPU and peak RSS, the bounded and
redacted stderr tail, scratch directories.

Processes are observed from outside through ``/proc``: each test puts a unique marker in the
argv (``-metadata title=MARKER``) and a watcher task records the pid, process group, limits,
environment and network namespace of the ffmpeg carrying it while it runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream
from structlog.testing import capture_logs

from aivedio.config.media import MediaConfig
from aivedio.errors import ConfigError, ResourceExhaustedError
from aivedio.pipeline.ffmpeg import sandbox as sandbox_mod
from aivedio.pipeline.ffmpeg.sandbox import STDERR_TAIL_LINES, RunResult, Sandbox, media_deadline

pytestmark = pytest.mark.anyio

FFMPEG = shutil.which("ffmpeg") or "ffmpeg"


def new_marker() -> str:
    return f"aivedio-sbx-{uuid.uuid4().hex}"


# -- watching /proc -----------------------------------------------------------------------------


@dataclass
class Seen:
    pid: int
    pgid: int
    argv: list[str]
    limits: str
    environ: bytes
    netns: str


def _argv(pid_dir: Path) -> list[str]:
    return [a.decode(errors="replace") for a in (pid_dir / "cmdline").read_bytes().split(b"\0")]


def pids_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose argv contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def watch(marker: str, seen: dict[int, Seen]) -> None:
    """Record every process that carries ``marker`` once it has become ffmpeg itself (prlimit
    and unshare exec into it, keeping the pid)."""
    while True:
        for pid in pids_with(marker):
            if pid in seen:
                continue
            entry = Path(f"/proc/{pid}")
            try:
                argv = _argv(entry)
                if Path(argv[0]).name != "ffmpeg":
                    continue
                seen[pid] = Seen(
                    pid=pid,
                    pgid=os.getpgid(pid),
                    argv=argv,
                    limits=(entry / "limits").read_text(),
                    environ=(entry / "environ").read_bytes(),
                    netns=os.readlink(entry / "ns" / "net"),
                )
            except (OSError, IndexError):
                continue
        await anyio.sleep(0.01)


def assert_group_gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def limit_of(limits: str, name: str) -> tuple[str, str]:
    for line in limits.splitlines():
        if line.startswith(name):
            soft, hard = line[len(name) :].split()[:2]
            return soft, hard
    raise AssertionError(f"{name!r} not in {limits}")


def realtime_args(marker: str, seconds: int = 30) -> list[str]:
    """An ffmpeg run that takes ``seconds`` of wall time (``-re``) and little CPU."""
    return [
        *("-re", "-f", "lavfi", "-i", f"testsrc2=s=160x120:r=10:d={seconds}"),
        *("-metadata", f"title={marker}", "-f", "null", "-"),
    ]


# -- deadline and cancellation ---------------------------------------------------------------


async def test_deadline_kills_the_group_and_counts_as_exhaustion(tmp_path: Path) -> None:
    media = MediaConfig(
        address_space_mib=3000, cpu_seconds=77, file_size_mib=33, open_files=99, processes=555
    )
    sandbox = Sandbox(media)
    marker = new_marker()
    seen: dict[int, Seen] = {}
    # Detect the network namespace (a run of `unshare` or two) before the clock starts: the
    # bound below is about the deadline and the kill, not that one-time probe.
    await sandbox.isolation_prefix()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, marker, seen)
        started = time.monotonic()
        result = await sandbox.run(
            "ffmpeg", realtime_args(marker), cwd=tmp_path, deadline_seconds=1.0
        )
        elapsed = time.monotonic() - started
        tg.cancel_scope.cancel()

    assert result.timed_out and result.exhausted and not result.ok
    assert result.returncode == -signal.SIGKILL
    assert 0.9 <= elapsed < 3.0
    assert 0.9 <= result.wall_seconds < 3.0
    assert result.error_detail().startswith("ffmpeg deadline exceeded: ")
    with pytest.raises(ResourceExhaustedError, match="deadline exceeded"):
        result.raise_if_exhausted()

    (proc,) = seen.values()
    assert proc.pgid == proc.pid  # its own process group (start_new_session)
    assert proc.argv[0] == FFMPEG
    assert {"-nostdin", "-progress", "pipe:1"} <= set(proc.argv)
    assert proc.argv[proc.argv.index("-loglevel") + 1] == "level+warning"
    # No trace of it afterwards: not the process, not its group.
    assert not Path(f"/proc/{proc.pid}").exists()
    assert_group_gone(proc.pgid)
    assert pids_with(marker) == []

    # What it ran under, as the kernel saw it.
    assert limit_of(proc.limits, "Max address space") == (str(3000 * 1024**2),) * 2
    assert limit_of(proc.limits, "Max cpu time") == ("77", "77")
    assert limit_of(proc.limits, "Max file size") == (str(33 * 1024**2),) * 2
    assert limit_of(proc.limits, "Max open files") == ("99", "99")
    assert limit_of(proc.limits, "Max processes") == ("555", "555")
    assert limit_of(proc.limits, "Max core file size") == ("0", "0")
    # The environment is cleared: the C locale and SVT-AV1's log level alone.
    assert proc.environ == b"LC_ALL=C\0SVT_LOG=2\0"
    assert proc.netns != os.readlink("/proc/self/ns/net")  # a network namespace of its own


async def test_deadline_kills_grandchildren_too(tmp_path: Path) -> None:
    """A stand-in "ffmpeg" (``media.ffmpeg``) that starts two background children: the group
    kill at the deadline reaches them, though they are not the direct child."""
    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho $$ > group\n"
        "sleep 60 & echo $! >> children\nsleep 60 & echo $! >> children\nwait\n"
    )
    fake.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    sandbox = Sandbox(MediaConfig(ffmpeg=str(fake)))
    result = await sandbox.run("ffmpeg", [], cwd=work, deadline_seconds=1.0)
    assert result.timed_out and result.returncode == -signal.SIGKILL
    group = int((work / "group").read_text())
    children = [int(line) for line in (work / "children").read_text().split()]
    assert len(children) == 2
    # Killed with the group; orphaned, they are reaped by init soon after.
    with anyio.fail_after(5):
        while True:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            await anyio.sleep(0.02)
    assert all(not Path(f"/proc/{pid}").exists() for pid in children)


async def test_cancellation_from_outside_kills_the_group(tmp_path: Path) -> None:
    sandbox = Sandbox(MediaConfig())
    marker = new_marker()
    seen: dict[int, Seen] = {}
    record: list[RunResult] = []
    cancelled_at: list[float] = []

    async def cancel_once_running(scope: anyio.CancelScope) -> None:
        # The caller gives up once ffmpeg is running (seen in /proc), however long that took.
        with anyio.fail_after(10):
            while not seen:
                await anyio.sleep(0.01)
        cancelled_at.append(time.monotonic())
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, marker, seen)
        with anyio.CancelScope() as scope:
            tg.start_soon(cancel_once_running, scope)
            await sandbox.run(
                "ffmpeg", realtime_args(marker), cwd=tmp_path, deadline_seconds=60, record=record
            )
        elapsed = time.monotonic() - cancelled_at[0]
        tg.cancel_scope.cancel()
    assert scope.cancelled_caught
    assert elapsed < 3.0  # killed and reaped promptly (ffmpeg alone would run for 30 s)
    (proc,) = seen.values()
    assert not Path(f"/proc/{proc.pid}").exists()
    assert_group_gone(proc.pgid)
    assert pids_with(marker) == []
    # The run is still recorded, killed: the deadline did not fire, the caller gave up.
    (result,) = record
    assert result.returncode == -signal.SIGKILL
    assert not result.timed_out


# -- rlimits -----------------------------------------------------------------------------------


async def test_tiny_address_space_stops_ffmpeg_from_starting(tmp_path: Path) -> None:
    sandbox = Sandbox(MediaConfig(address_space_mib=64))
    result = await sandbox.run(
        "ffmpeg",
        ["-f", "lavfi", "-i", "testsrc2=d=1", "-f", "null", "-"],
        cwd=tmp_path,
        deadline_seconds=20,
    )
    assert not result.ok
    assert result.returncode != 0
    tail = "\n".join(result.stderr_tail)
    # The dynamic loader cannot even map ffmpeg's libraries: a limit problem, not bad input.
    assert "failed to map segment" in tail or "annot allocate memory" in tail, tail
    assert result.exhausted
    assert result.progress == {}


async def test_file_size_limit_stops_a_big_output(tmp_path: Path) -> None:
    sandbox = Sandbox(MediaConfig(file_size_mib=1))
    result = await sandbox.run(
        "ffmpeg",
        [
            *("-f", "lavfi", "-i", "testsrc2=s=640x480:r=25:d=5"),
            *("-c:v", "rawvideo", "-f", "rawvideo", "-y", "out.raw"),
        ],
        cwd=tmp_path,
        deadline_seconds=20,
    )
    assert result.returncode == -signal.SIGXFSZ
    assert result.exhausted and not result.timed_out
    assert (tmp_path / "out.raw").stat().st_size == 1024**2  # and not a byte more


async def test_cpu_limit_kills_a_busy_encoder(tmp_path: Path) -> None:
    sandbox = Sandbox(MediaConfig(cpu_seconds=1))
    started = time.monotonic()
    result = await sandbox.run(
        "ffmpeg",
        [
            *("-f", "lavfi", "-i", "testsrc2=s=1280x720:r=25:d=120"),
            *("-c:v", "libx264", "-preset", "medium", "-f", "null", "-"),
        ],
        cwd=tmp_path,
        deadline_seconds=30,
    )
    # Soft and hard limits are equal, so the kernel sends SIGKILL rather than SIGXCPU.
    assert result.returncode in (-signal.SIGKILL, -signal.SIGXCPU)
    assert result.exhausted and not result.timed_out
    assert time.monotonic() - started < 15


# -- environment ---------------------------------------------------------------------------


async def test_environment_is_cleared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FFREPORT makes ffmpeg write a log file: set in our environment, it must not reach the
    sandboxed ffmpeg (it does reach one started normally, so the check can fail)."""
    report = tmp_path / "report.log"
    monkeypatch.setenv("FFREPORT", f"file={report}:level=32")
    args = ["-f", "lavfi", "-i", "testsrc2=s=160x120:d=0.2", "-f", "null", "-"]
    result = await Sandbox(MediaConfig()).run("ffmpeg", args, cwd=tmp_path, deadline_seconds=20)
    assert result.ok
    assert not report.exists()
    subprocess.run([FFMPEG, "-nostdin", "-v", "error", *args], check=True, timeout=30)
    assert report.exists()


# -- network namespace ---------------------------------------------------------------------


@dataclass
class Listener:
    port: int
    connections: int = 0


async def _connect_with_ffmpeg(tmp_path: Path, isolation: str) -> tuple[RunResult, Listener]:
    """ffmpeg opening ``tcp://127.0.0.1:PORT`` of a listener of ours (loopback only)."""
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = tcp.extra(SocketAttribute.local_port)  # noqa: S610 - anyio, not Django
    listener = Listener(port)

    async def handle(stream: SocketStream) -> None:
        listener.connections += 1
        await stream.aclose()

    async with tcp, anyio.create_task_group() as tg:
        tg.start_soon(tcp.serve, handle)
        result = await Sandbox(MediaConfig(network_isolation=isolation)).run(
            "ffmpeg",
            [*("-rw_timeout", "3000000", "-i", f"tcp://127.0.0.1:{port}", "-f", "null", "-")],
            cwd=tmp_path,
            deadline_seconds=15,
        )
        await anyio.sleep(0.2)  # let a connection that did arrive reach its handler
        tg.cancel_scope.cancel()
    return result, listener


async def test_isolated_ffmpeg_cannot_reach_loopback(tmp_path: Path) -> None:
    result, listener = await _connect_with_ffmpeg(tmp_path, "auto")
    assert result.network_isolated
    assert not result.ok and not result.timed_out
    assert listener.connections == 0
    assert any("Network is unreachable" in line for line in result.stderr_tail), result.stderr_tail


async def test_without_isolation_the_same_ffmpeg_does_connect(tmp_path: Path) -> None:
    # The control for the test above: the listener works and ffmpeg does connect to it.
    result, listener = await _connect_with_ffmpeg(tmp_path, "off")
    assert not result.network_isolated
    assert listener.connections == 1
    assert not any("Network is unreachable" in line for line in result.stderr_tail)


def _which_without_unshare(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which

    def which(cmd: str, mode: int = os.F_OK | os.X_OK, path: str | None = None) -> str | None:
        return None if cmd == "unshare" else real_which(cmd, mode, path)

    monkeypatch.setattr(shutil, "which", which)  # the module the sandbox uses


async def test_required_isolation_without_unshare_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _which_without_unshare(monkeypatch)
    sandbox = Sandbox(MediaConfig(network_isolation="required"))
    with pytest.raises(ConfigError, match="network_isolation"):
        await sandbox.isolation_prefix()
    with pytest.raises(ConfigError, match="network_isolation"):
        await sandbox.run("ffprobe", ["-version"], cwd=tmp_path, deadline_seconds=10)
    # "auto" runs anyway and says so.
    auto = Sandbox(MediaConfig(network_isolation="auto"))
    assert await auto.isolation_prefix() == []
    result = await auto.run("ffprobe", ["-version"], cwd=tmp_path, deadline_seconds=10)
    assert result.ok and not result.network_isolated


async def test_required_isolation_with_a_failing_unshare_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """unshare present but refused (no privilege, seccomp): both prefixes are tried, then
    "required" refuses to run."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ConfigError, match="unshare -n and unshare -rn both failed"):
        await Sandbox(MediaConfig(network_isolation="required")).isolation_prefix()
    assert await Sandbox(MediaConfig()).isolation_prefix() == []


async def test_isolation_prefix_when_available() -> None:
    required = Sandbox(MediaConfig(network_isolation="required"))
    assert required.network_isolated is None  # not decided before the first use
    prefix = await required.isolation_prefix()
    assert Path(prefix[0]).name == "unshare" and "-n" in prefix and prefix[-1] == "--"
    assert required.network_isolated is True
    off = Sandbox(MediaConfig(network_isolation="off"))
    assert await off.isolation_prefix() == []
    assert off.network_isolated is False


# -- progress, benchmark, stdout ---------------------------------------------------------------


PROGRESS_ARGS = [
    *("-stats_period", "0.1", "-re", "-f", "lavfi"),
    *("-i", "testsrc2=s=160x120:r=20:d=1", "-f", "null", "-"),
]


async def test_progress_blocks_reach_the_callback(tmp_path: Path) -> None:
    blocks: list[dict[str, str]] = []
    result = await Sandbox(MediaConfig()).run(
        "ffmpeg", PROGRESS_ARGS, cwd=tmp_path, deadline_seconds=20, on_progress=blocks.append
    )
    assert result.ok
    assert len(blocks) >= 3, blocks
    assert all("progress" in b and "out_time_us" in b and "frame" in b for b in blocks)
    assert blocks[-1]["progress"] == "end"
    assert {b["progress"] for b in blocks[:-1]} <= {"continue"}
    frames = [int(b["frame"]) for b in blocks]
    assert frames == sorted(frames) and frames[-1] == 20
    assert int(blocks[-1]["out_time_us"]) > 900_000
    assert result.progress == blocks[-1]


async def test_a_failing_progress_callback_is_logged_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def on_progress(block: dict[str, str]) -> None:
        calls.append(block["progress"])
        raise RuntimeError(f"callback broke at frame {block['frame']}")

    result = await Sandbox(MediaConfig()).run(
        "ffmpeg", PROGRESS_ARGS, cwd=tmp_path, deadline_seconds=20, on_progress=on_progress
    )
    assert result.ok and result.progress["progress"] == "end"  # the run itself is fine
    assert calls == ["continue"]  # called until it broke, then no more
    assert "sandbox_progress_callback_failed" in capsys.readouterr().out


async def test_pipes_held_open_after_the_exit_do_not_hold_the_run(tmp_path: Path) -> None:
    # The tool exits at once, leaving a child that keeps its stdout and stderr open.
    script = tmp_path / "leaves-a-child"
    script.write_text("#!/bin/sh\nsleep 31.4159 &\nexit 0\n")
    script.chmod(0o755)
    sandbox = Sandbox(MediaConfig(network_isolation="off"))
    sandbox._paths["ffprobe"] = str(script)
    started = time.monotonic()
    result = await sandbox.run("ffprobe", [], cwd=tmp_path, deadline_seconds=60)
    assert result.returncode == 0 and not result.timed_out
    assert time.monotonic() - started < 10  # the grace, then the group killed
    for _ in range(100):  # SIGKILLed with the group; gone once init reaps it
        if not pids_with("31.4159"):
            break
        await anyio.sleep(0.05)
    assert pids_with("31.4159") == []


async def test_cpu_and_peak_rss_of_ffmpeg_come_from_the_kernel(tmp_path: Path) -> None:
    sandbox = Sandbox(MediaConfig())

    async def encode(seconds: int) -> RunResult:
        return await sandbox.run(
            "ffmpeg",
            [
                "-f",
                "lavfi",
                "-i",
                f"testsrc2=s=640x360:r=25:d={seconds}",
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-f",
                "null",
                "-",
            ],
            cwd=tmp_path,
            deadline_seconds=60,
        )

    short, long = await encode(1), await encode(8)
    for result in (short, long):
        assert result.ok
        assert result.cpu_seconds is not None and result.cpu_seconds > 0
        assert result.max_rss_bytes is not None
        assert 5 * 1024**2 < result.max_rss_bytes < 4 * 1024**3
        assert result.wall_seconds > 0 and result.network_isolated
        # A run that goes well at the default level writes no info lines to read.
        assert not any("[info]" in line for line in result.stderr_tail), result.stderr_tail
    # The process's own account (wait4): eight times the frames cost more CPU.
    assert short.cpu_seconds is not None and long.cpu_seconds is not None
    assert long.cpu_seconds > short.cpu_seconds
    # ffprobe: no CPU figures (they are the media tools' CPU of a render's report), and its
    # stdout is captured on request.
    probe = await sandbox.run(
        "ffprobe",
        ["-f", "lavfi", "-i", "testsrc2=d=0.2", "-show_format", "-of", "json"],
        cwd=tmp_path,
        deadline_seconds=20,
        capture_stdout=True,
    )
    assert probe.ok and b'"format_name": "lavfi"' in probe.stdout
    assert (probe.cpu_seconds, probe.max_rss_bytes, probe.progress) == (None, None, {})
    quiet = await sandbox.run(
        "ffprobe",
        ["-f", "lavfi", "-i", "testsrc2=d=0.2", "-show_format"],
        cwd=tmp_path,
        deadline_seconds=20,
    )
    assert quiet.ok and quiet.stdout == b""


async def test_info_lines_on_request_only(tmp_path: Path) -> None:
    sandbox = Sandbox(MediaConfig())
    args = ["-f", "lavfi", "-i", "testsrc2=d=0.2", "-vf", "showinfo", "-f", "null", "-"]
    chatty = await sandbox.run("ffmpeg", args, cwd=tmp_path, deadline_seconds=20, log_level="info")
    assert chatty.ok and any(
        "showinfo" in line and "[info]" in line for line in chatty.raw_stderr_tail
    )
    quiet = await sandbox.run("ffmpeg", args, cwd=tmp_path, deadline_seconds=20)
    assert quiet.ok and not any("[info]" in line for line in quiet.raw_stderr_tail)
    with pytest.raises(ValueError, match="log level"):
        await sandbox.run("ffmpeg", args, cwd=tmp_path, deadline_seconds=20, log_level="debug")


async def test_ffprobe_stdout_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_mod, "STDOUT_LIMIT_BYTES", 20_000)
    result = await Sandbox(MediaConfig()).run(
        "ffprobe",
        ["-f", "lavfi", "-i", "testsrc2=s=160x120:d=20", "-show_frames", "-of", "json"],
        cwd=tmp_path,
        deadline_seconds=20,
        capture_stdout=True,
    )
    assert result.stdout_overflow and result.exhausted and not result.ok
    assert result.stdout == b""


# -- stderr tail -------------------------------------------------------------------------------

SECRET = "abcdef123456"


async def test_stderr_tail_is_bounded_and_redacted(tmp_path: Path) -> None:
    metadata: list[str] = []
    for i in range(100):
        metadata += ["-metadata", f"filler{i:03d}=line {i}"]
    metadata += ["-metadata", "long=" + "x" * 2000]
    metadata += ["-metadata", f"src=https://cdn.example/v.mp4?X-Amz-Signature={SECRET}&e=1"]
    metadata += ["-metadata", f"note=X-Amz-Signature={SECRET}"]
    result = await Sandbox(MediaConfig()).run(
        "ffmpeg",
        ["-f", "lavfi", "-i", "testsrc2=s=160x120:d=0.2", *metadata, "-f", "null", "-"],
        cwd=tmp_path,
        deadline_seconds=20,
        log_level="info",  # the output's metadata is echoed at info level
    )
    assert result.ok
    assert len(result.stderr_tail) == STDERR_TAIL_LINES == 40
    assert all(len(line) <= 500 for line in result.stderr_tail)
    tail = "\n".join(result.stderr_tail)
    assert "filler099" in tail and "filler000" not in tail  # the last lines are kept
    assert SECRET not in tail
    assert "https://cdn.example/v.mp4?***" in tail
    assert "X-Amz-Signature=***" in tail


async def test_error_detail_names_a_signed_path_without_its_signature(tmp_path: Path) -> None:
    result = await Sandbox(MediaConfig()).run(
        "ffmpeg",
        ["-i", f"file:{tmp_path}/missing.mp4?X-Amz-Signature={SECRET}", "-f", "null", "-"],
        cwd=tmp_path,
        deadline_seconds=20,
    )
    assert not result.ok and not result.exhausted
    detail = result.error_detail()
    assert detail.startswith(f"ffmpeg exit {result.returncode}: ")
    assert "No such file or directory" in detail
    assert "X-Amz-Signature=***" in detail
    assert SECRET not in detail and SECRET not in "\n".join(result.stderr_tail)


# -- scratch and setup ---------------------------------------------------------------------


def test_scratch_is_empty_private_and_removed(tmp_path: Path) -> None:
    base = tmp_path / "not" / "yet"
    sandbox = Sandbox(MediaConfig(scratch_dir=str(base)))
    with sandbox.scratch() as one, sandbox.scratch() as two:
        assert one != two
        for path in (one, two):
            assert path.parent == base and path.name.startswith("aivedio-media-")
            assert path.is_dir() and list(path.iterdir()) == []
            assert path.stat().st_mode & 0o777 == 0o700
        (one / "sub").mkdir()
        (one / "sub" / "file").write_bytes(b"x" * 1000)
    assert not one.exists() and not two.exists()
    assert list(base.iterdir()) == []

    made: list[Path] = []

    def fail_inside() -> None:
        with sandbox.scratch() as three:
            made.append(three)
            (three / "partial.mp4").write_bytes(b"partial")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert len(made) == 1 and not made[0].exists()
    assert list(base.iterdir()) == []


def test_a_relative_scratch_dir_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ffmpeg runs with its cwd inside the scratch dir, so paths handed to it must be absolute.
    monkeypatch.chdir(tmp_path)
    with Sandbox(MediaConfig(scratch_dir="rel/base")).scratch() as path:
        assert path.is_absolute()
        assert path.parent == (tmp_path / "rel" / "base").resolve()
    assert not path.exists()


def test_scratch_defaults_to_the_system_temp_dir() -> None:
    with Sandbox(MediaConfig()).scratch() as path:
        assert path.parent == Path(tempfile.gettempdir())
    assert not path.exists()


async def test_unknown_tool_and_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tool"):
        await Sandbox(MediaConfig()).run("sh", ["-c", "true"], cwd=tmp_path, deadline_seconds=5)
    missing = Sandbox(MediaConfig(ffprobe="no-such-ffprobe-aivedio"))
    with pytest.raises(ConfigError, match=r"media\.ffprobe"):
        await missing.run("ffprobe", ["-version"], cwd=tmp_path, deadline_seconds=5)


def test_media_deadline_grows_with_duration() -> None:
    media = MediaConfig(process_timeout_seconds=100, process_timeout_per_media_second=2)
    assert media_deadline(media, None) == 100
    assert media_deadline(media, -5) == 100
    assert media_deadline(media, 30) == 160


async def test_scratch_left_by_a_killed_process_of_this_host_is_reclaimed_at_check(
    tmp_path: Path,
) -> None:
    media = MediaConfig(scratch_dir=str(tmp_path), network_isolation="off")
    box = Sandbox(media)
    # A child makes its scratch and is SIGKILLed inside it: nothing removes the directory.
    code = (
        "import os, signal, sys\n"
        "from aivedio.config.media import MediaConfig\n"
        "from aivedio.pipeline.ffmpeg.sandbox import Sandbox\n"
        f"box = Sandbox(MediaConfig(scratch_dir={str(tmp_path)!r}))\n"
        "with box.scratch() as p:\n"
        "    (p / 'partial.mp4').write_bytes(b'x' * 1000)\n"
        "    print(p, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL
    left = Path(child.stdout.strip())
    assert left.is_dir() and left.parent == tmp_path.resolve()
    # Another host's scratch and a live process's (ours) are never touched; nor is any other
    # directory that merely looks alike.
    other_host = tmp_path / f"aivedio-media-otherhost-{os.getpid() + 1}-abc"
    other_host.mkdir()
    foreign = tmp_path / "aivedio-media-notours"
    foreign.mkdir()
    with box.scratch() as live:
        await box.check()
        assert live.is_dir()
    assert not left.exists()
    assert other_host.is_dir() and foreign.is_dir()


async def test_isolation_refused_by_the_platform_is_a_warning_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As under Kubernetes' restricted profile (no CAP_SYS_ADMIN, no user namespaces): "auto"
    runs ffmpeg on the pod's network, and says so at warning level, not as an info line."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with capture_logs() as logs:
        await Sandbox(MediaConfig()).check()
        await Sandbox(MediaConfig(network_isolation="off")).check()
    said = [e for e in logs if e["event"] == "sandbox_network_isolation"]
    assert [(e["log_level"], e["mode"], e["available"]) for e in said] == [
        ("warning", "auto", False),
        ("info", "off", False),
    ]
