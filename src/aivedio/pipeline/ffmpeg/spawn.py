"""Start a child process cheaply from the event loop, and wait for it without a thread.

Why not ``anyio.open_process``: under uvloop (the worker's loop) it spawns through libuv,
which forks the whole worker: page tables copied, then a copy-on-write fault for every page
the worker touches until the child execs. A profile of the fleet benchmark put more than half
of a worker's own CPU there (every asset starts a dozen ffprobe/ffmpeg processes), about 2 ms
a spawn against 0.1 ms for ``subprocess.Popen``, which uses ``vfork`` (the parent's memory is
never copied). So the process is started by ``Popen`` and only its pipes and its exit are
handed to the loop:

* stdout and stderr are read through the loop's pipe transports (``connect_read_pipe``)
  and handed to the caller's ``on_stdout``/``on_stderr`` as they arrive (without one, the
  bytes are dropped): no task, no stream, since every asset starts about a dozen processes
  and a reader task's wakeups were a good part of the worker's own CPU; ``drained()`` waits
  for the pipes to end. The "pipes" are Unix socket pairs, not ``os.pipe``: uvloop (0.23)
  closes a pipe transport's descriptor twice, once in libuv and once through the file
  object it was given (MagicStack/uvloop#763), and a file a store thread opened in between
  gets that number and is closed under it (seen as ``EBADF`` in a fleet benchmark, then a
  worker's abort). A socket object it detaches instead: each descriptor closed once, on
  either loop;
* the exit is awaited on a pidfd (Linux 5.3+), which becomes readable when the child exits;
  where there is none, the exit is polled every few milliseconds.

Only this process reaps its child (``os.wait4``): neither asyncio's child watcher nor libuv's
waits for a pid it did not start. ``wait4`` hands over the child's resource usage with its
status: its CPU time and peak RSS (``Spawned.rusage``), the whole process's, whatever it
exec'd into (``prlimit`` and ``unshare`` exec the tool in the same process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

POLL_SECONDS = 0.005
POLL_MAX_SECONDS = 0.1


class _Sink(asyncio.Protocol):
    """A pipe whose bytes go to ``feed`` as they arrive. A failing ``feed`` is remembered
    (``error``, raised by ``Spawned.drained``) and fed nothing more."""

    def __init__(self, feed: Callable[[bytes], None]) -> None:
        self._feed = feed
        self.error: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.error is None:
            try:
                self._feed(data)
            except Exception as exc:  # handed to the caller by drained()
                self.error = exc

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def _drop(_data: bytes) -> None:
    """Output nobody reads."""


async def _pipe(end: socket.socket, feed: Callable[[bytes], None] | None) -> _Sink:
    sink = _Sink(feed or _drop)
    await asyncio.get_running_loop().connect_read_pipe(lambda: sink, end)
    return sink


class Spawned:
    """A started child: ``pid``, ``wait()``, ``drained()``, ``returncode``."""

    def __init__(self, popen: subprocess.Popen[bytes], pipes: Sequence[_Sink | None]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._pipes = list(pipes)
        # The child's resource usage, once reaped (None if something else reaped it).
        self.rusage: resource.struct_rusage | None = None
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(popen.pid)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        """The exit status (negative: the signal that ended it), once the child has exited."""
        interval = POLL_SECONDS
        while not self._reaped():
            if self._pidfd is not None:
                await anyio.wait_readable(self._pidfd)
            else:  # no pidfd (an old kernel, a seccomp profile that refuses it): poll
                await anyio.sleep(interval)
                interval = min(interval * 2, POLL_MAX_SECONDS)
        assert self._popen.returncode is not None
        return self._popen.returncode

    def _reaped(self) -> bool:
        """Reap the child if it has exited, keeping its status and resource usage."""
        if self._popen.returncode is not None:
            return True
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped behind our back: Popen knows what can be known
            return self._popen.poll() is not None
        if pid == 0:
            return False
        self._popen.returncode = os.waitstatus_to_exitcode(status)
        self.rusage = usage
        return True

    async def drained(self) -> None:
        """Wait until the pipes have ended (the child and anything that inherited them
        closed them); then raise what a callback raised, if one did."""
        for pipe in self._pipes:
            if pipe is not None:
                await pipe.closed
                if pipe.error is not None:
                    raise pipe.error

    async def aclose(self) -> None:
        """Close the pipes and the pidfd; the caller has waited for the exit (or killed)."""
        _close(self._pipes)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _close(pipes: Sequence[_Sink | None]) -> None:
    for pipe in pipes:
        if pipe is not None and pipe.transport is not None:
            pipe.transport.close()


async def spawn(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
    start_new_session: bool = True,
    on_stdout: Callable[[bytes], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
) -> Spawned:
    """Start ``argv`` (never a shell) with stdin from /dev/null; OSError if it cannot start.
    A piped output goes to its ``on_…`` callback as it arrives."""
    ours: list[socket.socket | None] = []
    theirs: list[Any] = []
    try:
        for target in (stdout, stderr):
            if target is subprocess.PIPE:
                mine, child = socket.socketpair()  # both ends close-on-exec
                ours.append(mine)
                theirs.append(child)
            else:
                ours.append(None)
                theirs.append(target)
        popen = subprocess.Popen(  # noqa: ASYNC220 - vfork: the loop waits only for the exec
            list(argv),
            stdin=subprocess.DEVNULL,
            stderr=_child_end(theirs[1]),
            stdout=_child_end(theirs[0]),
            cwd=cwd,
            env=dict(env),
            start_new_session=start_new_session,
        )
    except BaseException:
        for end in ours:
            if end is not None:
                end.close()
        raise
    finally:
        for end in theirs:
            if isinstance(end, socket.socket):
                end.close()  # the child holds its own copy
    feeds = [on_stdout, on_stderr]
    streams: list[_Sink | None] = []
    try:
        # Shielded: a cancellation while a transport is being attached (uvloop takes a loop
        # turn) would leave the descriptor closed under us or not, unknowable.
        with anyio.CancelScope(shield=True):
            for end, feed in zip(ours, feeds, strict=True):
                streams.append(await _pipe(end, feed) if end is not None else None)
    except BaseException:  # nothing below awaits: no cancellation can cut it short
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if start_new_session:
                os.killpg(popen.pid, signal.SIGKILL)
            else:
                popen.kill()
        popen.wait()  # killed: it exits at once
        _close(streams)
        # The end that failed to attach: uvloop's libuv has closed its descriptor by number
        # (detached here, never closed again: a leak at worst, never another's descriptor);
        # asyncio closes the socket object, later or not at all, and closing it here too is
        # harmless (a socket object closes once). Those after it are ours alone.
        failed = len(streams)
        for index, end in enumerate(ours):
            if end is not None and index == failed and _closes_by_number():
                end.detach()
            elif end is not None and index >= failed:
                end.close()
        raise
    return Spawned(popen, streams)


def _closes_by_number() -> bool:
    """Whether the running loop is uvloop's, whose pipe transports close the descriptor
    itself (libuv) rather than the object they were given."""
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


def _child_end(end: Any) -> Any:
    """What Popen takes for a child's output: a socket's descriptor, else as given."""
    return end.fileno() if isinstance(end, socket.socket) else end
