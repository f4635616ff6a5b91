"""The one runner for every ffmpeg and ffprobe process, each in its own sandbox.

ffmpeg is a native parser of hostile input, and so is c2pa-rs, whose C2PA manifest reader
runs here too as the ``c2pa`` tool (``python -I -m aivedio.provenance.read_child``, see
``pipeline/ffmpeg/provenance_read.py``). Every process started here gets:

* an argv list (never a shell) with ``-nostdin`` (ffmpeg) and the caller's own arguments;
* an empty scratch directory as its working directory and a cleared environment;
* rlimits through ``prlimit``: address space, CPU seconds, file size, open files, processes;
* a network namespace through ``unshare -n`` when the platform allows (recorded in every
  result as ``network_isolated``; ``media.network_isolation = "required"`` refuses to run
  without one);
* its own process group, a wall-clock deadline, then SIGKILL of the whole group, shielded
  from cancellation so that no ffmpeg outlives the job that started it;
* progress parsed from ``-progress pipe:1`` and the tail of stderr kept, redacted, for the
  error detail; ffmpeg logs warnings and errors only (``log_level="info"`` for a run whose
  caller reads info lines), so a run that goes well writes next to nothing to read;
* ffmpeg's CPU time and peak RSS from the kernel's account of the process (``wait4``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from aivedio.config.media import MediaConfig
from aivedio.errors import ConfigError, ResourceExhaustedError
from aivedio.logs import get_logger, redact_text
from aivedio.pipeline.ffmpeg.spawn import Spawned, spawn

log = get_logger("aivedio.sandbox")

STDERR_TAIL_LINES = 40
# After the process exits, how long its pipes may stay open (held by something it started).
PIPES_GRACE_SECONDS = 2.0
# The whole environment of a sandboxed process: the C locale, and SVT-AV1 (the AV1
# ladder's encoder) logging warnings and errors only instead of a banner per encoder,
# which would push ffmpeg's own last lines out of the kept stderr tail.
SVT_LOG_LEVEL = "2"  # SVT-AV1's SVT_LOG: 2, warnings and errors
PROCESS_ENV = {"LC_ALL": "C", "SVT_LOG": SVT_LOG_LEVEL}
STDOUT_LIMIT_BYTES = 64 * 1024**2
# stderr text that means the process ran out of something rather than met bad input.
_EXHAUSTION = re.compile(
    r"(?i)cannot allocate memory|out of memory|not enough memory|no space left on device|"
    r"file too large|resource temporarily unavailable|"
    # the address-space limit is too low for the dynamic loader itself: not the input's fault
    r"error while loading shared libraries|failed to map segment"
)
# SIGKILL from outside is the OOM killer; SIGSEGV/SIGABRT are the parser crashing on its
# input, which is a verdict on the input (and worth an alert), not a reason to run it again.
_SIGNAL_EXHAUSTION = {-signal.SIGXCPU, -signal.SIGXFSZ, -signal.SIGKILL}
CRASH_SIGNALS = {-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGILL, -signal.SIGFPE}
# Only ffmpeg's own error lines count: [info] lines echo the input's metadata, which an
# attacker writes ("comment=Cannot allocate memory").
_ERROR_LEVEL = re.compile(r"\[(error|fatal|panic)\]")

ProgressCallback = Callable[[dict[str, str]], None]


SCRATCH_PREFIX = "aivedio-media-"


def _host_tag() -> str:
    """This host's name as a scratch-name part (no dashes, so the pid that follows parses)."""
    name = socket.gethostname() or "host"
    return "".join(c if c.isalnum() else "_" for c in name)[:40]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@dataclass(frozen=True, slots=True)
class Limits:
    address_space_bytes: int
    cpu_seconds: int
    file_size_bytes: int
    open_files: int
    processes: int

    @classmethod
    def from_media(cls, media: MediaConfig) -> Limits:
        return cls(
            address_space_bytes=media.address_space_mib * 1024**2,
            cpu_seconds=media.cpu_seconds,
            file_size_bytes=media.file_size_mib * 1024**2,
            open_files=media.open_files,
            processes=media.processes,
        )


@dataclass(slots=True)
class RunResult:
    tool: str
    args: list[str]
    returncode: int
    wall_seconds: float
    network_isolated: bool
    started_at: float = 0.0  # time.monotonic() when the process was started
    timed_out: bool = False
    stdout_overflow: bool = False
    stdout: bytes = b""
    # The last lines of stderr as written: read through ``stderr_tail``, redacted.
    raw_stderr_tail: list[str] = field(default_factory=list, repr=False)
    progress: dict[str, str] = field(default_factory=dict)
    cpu_seconds: float | None = None
    max_rss_bytes: int | None = None
    _redacted_tail: list[str] | None = field(default=None, repr=False)

    @property
    def stderr_tail(self) -> list[str]:
        """The last lines of stderr, redacted, each cut to 500 characters after the
        redaction (so a secret is never cut into a fragment the patterns miss). Redacted
        on first use: most runs succeed and nobody reads them."""
        if self._redacted_tail is None:
            self._redacted_tail = [redact_text(line)[:500] for line in self.raw_stderr_tail]
        return self._redacted_tail

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.stdout_overflow

    @property
    def exhausted(self) -> bool:
        """Out of time, memory, disk or another limit, as opposed to rejecting its input."""
        if self.timed_out or self.stdout_overflow or self.returncode in _SIGNAL_EXHAUSTION:
            return True
        if self.crashed:
            return False
        return any(
            _EXHAUSTION.search(line)
            for line in self.stderr_tail
            # the loader's complaint comes before ffmpeg's logging exists, untagged
            if _ERROR_LEVEL.search(line) or not line.startswith("[")
        )

    @property
    def crashed(self) -> bool:
        """Killed by a crash signal: the parser failed on this input."""
        return self.returncode in CRASH_SIGNALS

    def error_detail(self, limit: int = 6) -> str:
        """The last error lines of stderr (already redacted), for a job's error detail."""
        wanted = [
            line
            for line in self.stderr_tail
            if _ERROR_LEVEL.search(line) or "[warning]" in line or not line.startswith("[")
        ]
        tail = (wanted or self.stderr_tail)[-limit:]
        status = "deadline exceeded" if self.timed_out else f"exit {self.returncode}"
        if self.crashed:
            status = f"crashed (signal {-self.returncode})"
        return f"{self.tool} {status}: " + " | ".join(tail)

    def raise_if_exhausted(self) -> None:
        if self.exhausted:
            raise ResourceExhaustedError(self.error_detail())


class Sandbox:
    """Starts ffmpeg/ffprobe under the limits of ``[media]``. One per process is enough."""

    def __init__(self, media: MediaConfig) -> None:
        self.media = media
        self.limits = Limits.from_media(media)
        # c2pa: this interpreter, running the C2PA reader's child module (no shell, no
        # site of the user's, no environment: ``-I``).
        self._tools = {"ffmpeg": media.ffmpeg, "ffprobe": media.ffprobe, "c2pa": sys.executable}
        self._paths: dict[str, str] = {}
        self._isolation: list[str] | None = None
        self._isolation_checked = False
        self._prlimit = shutil.which("prlimit")
        self._base: Path | None = None

    # -- scratch ------------------------------------------------------------------------

    def _scratch_base(self) -> Path:
        if self.media.scratch_dir:
            return Path(self.media.scratch_dir).resolve()
        return Path(tempfile.gettempdir()).resolve()

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """An empty private directory, removed with everything in it afterwards. Its name
        carries this host and process (``reclaim_scratch`` after a crash)."""
        base = self._base
        if base is None or not base.is_dir():  # resolved once; made again if removed
            base = self._base = self._scratch_base()
            base.mkdir(parents=True, exist_ok=True)
        # Absolute: ffmpeg runs with its cwd inside, so a relative path would point elsewhere.
        prefix = f"{SCRATCH_PREFIX}{_host_tag()}-{os.getpid()}-"
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))  # base is resolved
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def reclaim_scratch(self) -> list[Path]:
        """Remove the scratch directories that processes of this host left behind when they
        died (SIGKILL, OOM): those naming this host and a process that no longer exists.
        Another host's, or a live process's, are never touched. Returns what was removed."""
        base = self._scratch_base()
        removed: list[Path] = []
        if not base.is_dir():
            return removed
        mine = f"{SCRATCH_PREFIX}{_host_tag()}-"
        for entry in base.iterdir():
            if not entry.name.startswith(mine) or not entry.is_dir() or entry.is_symlink():
                continue
            pid_text = entry.name[len(mine) :].split("-", 1)[0]
            if not pid_text.isdigit() or _alive(int(pid_text)):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        return removed

    # -- setup --------------------------------------------------------------------------

    def _tool_path(self, tool: str) -> str:
        if tool not in self._paths:
            found = shutil.which(self._tools[tool])
            if found is None:
                raise ConfigError(
                    f"config error: media.{tool}: {self._tools[tool]!r} not found on PATH; "
                    "install ffmpeg (scripts/test and scripts/demo do)"
                )
            self._paths[tool] = found
        return self._paths[tool]

    async def check(self) -> None:
        """Everything a run needs, checked once at start; ConfigError names what is missing.
        Scratch left by this host's dead processes is removed first."""
        removed = await anyio.to_thread.run_sync(self.reclaim_scratch)
        if removed:
            log.warning(
                "scratch_reclaimed",
                directories=len(removed),
                detail="left by processes of this host that died",
            )
        for tool in self._tools:
            self._tool_path(tool)
        self._limit_prefix()
        await self.isolation_prefix()

    @property
    def network_isolated(self) -> bool | None:
        """Whether processes get a network namespace; None until the first run decided."""
        return bool(self._isolation) if self._isolation_checked else None

    async def isolation_prefix(self) -> list[str]:
        """The argv prefix that puts a process in a fresh network namespace, or [] if none."""
        if not self._isolation_checked:
            self._isolation = await self._detect_isolation()
            self._isolation_checked = True
            # Loud when it was asked for and the platform refused it (no CAP_SYS_ADMIN and no
            # user namespaces, as under Kubernetes' restricted Pod Security standard): ffmpeg
            # then has the pod's network, and only an egress policy keeps it off it.
            emit = (
                log.warning
                if self.media.network_isolation != "off" and not self._isolation
                else log.info
            )
            emit(
                "sandbox_network_isolation",
                mode=self.media.network_isolation,
                available=bool(self._isolation),
                prefix=" ".join(self._isolation or []),
            )
        if not self._isolation and self.media.network_isolation == "required":
            raise ConfigError(
                "config error: media.network_isolation: 'required' but this platform cannot "
                "create a network namespace (unshare -n and unshare -rn both failed)"
            )
        return list(self._isolation or [])

    async def _detect_isolation(self) -> list[str]:
        if self.media.network_isolation == "off":
            return []
        unshare = shutil.which("unshare")
        if unshare is None:
            return []
        for prefix in ([unshare, "-n", "--"], [unshare, "-r", "-n", "--"]):
            try:
                done = await anyio.run_process(
                    [*prefix, "true"], check=False, stderr=subprocess.DEVNULL
                )
            except OSError:
                continue
            if done.returncode == 0:
                return prefix
        return []

    def _limit_prefix(self, limits: Limits | None = None) -> list[str]:
        if self._prlimit is None:
            raise ConfigError("prlimit (util-linux) is required to start ffmpeg under rlimits")
        lim = limits or self.limits
        return [
            self._prlimit,
            f"--as={lim.address_space_bytes}",
            f"--cpu={lim.cpu_seconds}",
            f"--fsize={lim.file_size_bytes}",
            f"--nofile={lim.open_files}",
            f"--nproc={lim.processes}",
            "--core=0",
            "--",
        ]

    # -- running ------------------------------------------------------------------------

    async def run(
        self,
        tool: str,
        args: list[str],
        *,
        cwd: Path,
        deadline_seconds: float,
        capture_stdout: bool = False,
        on_progress: ProgressCallback | None = None,
        record: list[RunResult] | None = None,
        log_level: str = "warning",
        limits: Limits | None = None,
    ) -> RunResult:
        """Run ``tool`` (ffmpeg, ffprobe or c2pa) with ``args``; never raises for the tool's
        failure.

        ffmpeg gets ``-nostdin -hide_banner -nostats -progress pipe:1`` and level-tagged logs
        at ``log_level`` (``warning``, or ``info`` when the caller reads a filter's info
        lines); ffprobe logs errors only, its stdout captured (bounded) on ``capture_stdout``,
        as is the c2pa reader's. ``limits``: other rlimits than ``[media]``'s for this run.
        """
        if tool not in self._tools:
            raise ValueError(f"unknown tool {tool!r}")
        if log_level not in ("warning", "info"):
            raise ValueError(f"unknown log level {log_level!r}")
        binary = self._tool_path(tool)
        if tool == "ffmpeg":
            # -y: a node retried in the same scratch directory rewrites its intermediates.
            head = ["-y", "-nostdin", "-hide_banner", "-nostats", "-loglevel", f"level+{log_level}"]
            head += ["-progress", "pipe:1"]
        elif tool == "c2pa":
            head = ["-I", "-m", "aivedio.provenance.read_child"]
        else:
            head = ["-hide_banner", "-loglevel", "level+error"]
        isolation = await self.isolation_prefix()
        argv = [*self._limit_prefix(limits), *isolation, binary, *head, *args]
        result = RunResult(
            tool=tool,
            args=list(args),
            returncode=-1,
            wall_seconds=0.0,
            network_isolated=bool(isolation),
        )
        started = result.started_at = time.monotonic()
        # Each pipe is read by a callback as its bytes arrive: no reader task per pipe.
        stderr = _StderrTail()
        stdout: _Progress | _Capture = (
            _Progress(result, on_progress) if tool == "ffmpeg" else _Capture(capture_stdout)
        )
        process = await spawn(
            argv, cwd=str(cwd), env=PROCESS_ENV, on_stdout=stdout.feed, on_stderr=stderr.feed
        )
        try:
            if isinstance(stdout, _Capture):
                stdout.started(process)
            with anyio.move_on_after(deadline_seconds) as scope:
                await process.wait()
                # The pipes end with the process, unless something it started holds them:
                # a short wait, then the group is killed (below) and the pipes closed.
                with anyio.move_on_after(PIPES_GRACE_SECONDS):
                    await process.drained()
            result.timed_out = scope.cancelled_caught
        finally:
            with anyio.CancelScope(shield=True):
                await _kill_group(process)
            result.wall_seconds = time.monotonic() - started
            result.returncode = process.returncode if process.returncode is not None else -1
            result.raw_stderr_tail = stderr.lines()
            if isinstance(stdout, _Capture):
                result.stdout_overflow = stdout.overflow
                result.stdout = b"" if stdout.overflow or not capture_stdout else stdout.data()
            if tool == "ffmpeg" and process.rusage is not None:
                usage = process.rusage
                result.cpu_seconds = usage.ru_utime + usage.ru_stime
                result.max_rss_bytes = usage.ru_maxrss * 1024  # kilobytes on Linux
            if record is not None:
                record.append(result)
        return result


class _StderrTail:
    """The last lines of stderr, kept by chunk, not by line: a run at info level writes
    hundreds of lines, and only the last few are kept (decoded and redacted when read)."""

    def __init__(self) -> None:
        self._tail: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._buffer = b""

    def feed(self, chunk: bytes) -> None:
        buffer = self._buffer + chunk
        *complete, buffer = buffer.split(b"\n")
        self._tail.extend(raw for raw in complete if raw.strip(b"\r"))
        if len(buffer) > 65536:  # a line this long is noise; keep memory bounded
            buffer = buffer[-4096:]
        self._buffer = buffer

    def lines(self) -> list[str]:
        tail = list(self._tail)
        if self._buffer.strip(b"\r"):  # a last line without its newline
            tail = [*tail, self._buffer][-STDERR_TAIL_LINES:]
        return [raw.decode("utf-8", "replace").rstrip("\r") for raw in tail]


class _Capture:
    """ffprobe's stdout, bounded: past STDOUT_LIMIT_BYTES the process group is killed."""

    def __init__(self, keep: bool) -> None:
        self._keep = keep
        self._chunks: list[bytes] = []
        self._size = 0
        self._process: Spawned | None = None
        self.overflow = False

    def started(self, process: Spawned) -> None:
        self._process = process
        if self.overflow:  # it overflowed before we knew its pid
            _signal_group(process, signal.SIGKILL)

    def feed(self, chunk: bytes) -> None:
        if not self._keep or self.overflow:
            return
        self._size += len(chunk)
        if self._size > STDOUT_LIMIT_BYTES:
            self.overflow = True
            self._chunks = []
            if self._process is not None:
                _signal_group(self._process, signal.SIGKILL)
            return
        self._chunks.append(chunk)

    def data(self) -> bytes:
        return b"".join(self._chunks)


class _Progress:
    """ffmpeg's ``-progress pipe:1`` blocks: ``key=value`` lines ending with ``progress=``.
    Of the blocks that complete in one read, the newest becomes ``result.progress`` and
    goes to the callback; the older ones are superseded and never parsed (a block has a
    line per output stream: an encode pass of five outputs writes dozens)."""

    def __init__(self, result: RunResult, on_progress: ProgressCallback | None) -> None:
        self._result = result
        self._on_progress = on_progress
        self._lines = b""  # complete lines of the block not yet ended
        self._buffer = b""  # a line not yet complete

    def feed(self, chunk: bytes) -> None:
        buffer = self._buffer + chunk
        cut = buffer.rfind(b"\n") + 1
        lines, buffer = self._lines + buffer[:cut], buffer[cut:]
        if len(buffer) > 65536:  # a line this long is noise; keep memory bounded
            buffer = buffer[-4096:]
        self._buffer = buffer
        found = _progress_line(lines, len(lines))
        if found is None:
            self._lines = lines[-65536:]  # no block ends in a page of lines: noise
            return
        at, last = found
        self._lines = lines[last:]
        previous = _progress_line(lines, at)
        first = previous[1] if previous else 0
        block: dict[str, str] = {}
        for raw in lines[first:last].decode("utf-8", "replace").split("\n"):
            key, sep, value = raw.partition("=")
            if sep:
                block[key.strip()] = value.strip()
        self._result.progress = block
        if self._on_progress is not None:
            try:
                self._on_progress(block)
            except Exception:  # progress is for logs: a broken callback stops alone
                log.exception("sandbox_progress_callback_failed")
                self._on_progress = None


def _progress_line(lines: bytes, before: int) -> tuple[int, int] | None:
    """Where the last ``progress=`` line ending at or before ``before`` starts and ends
    (just past its newline), in ``lines`` (complete lines); None if there is none."""
    limit = before
    while (at := lines.rfind(b"progress=", 0, limit)) >= 0:
        end = lines.find(b"\n", at) + 1
        if (at == 0 or lines[at - 1] == 0x0A) and end <= before:
            return at, end
        limit = at + len(b"progress=") - 1  # a match starting before this one
    return None


def _signal_group(process: Spawned, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


async def _kill_group(process: Spawned) -> None:
    """SIGKILL the whole group (ffmpeg and anything it started), then reap and close."""
    _signal_group(process, signal.SIGKILL)
    with anyio.move_on_after(10):
        await process.wait()
    await process.aclose()


def media_deadline(media: MediaConfig, duration_seconds: float | None) -> float:
    """Wall-clock budget for one ffmpeg run over media of this duration."""
    return media.process_timeout_seconds + media.process_timeout_per_media_second * max(
        duration_seconds or 0.0, 0.0
    )
