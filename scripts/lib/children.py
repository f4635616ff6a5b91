"""Child processes of a benchmark or a harness, watched: one that dies fails the run at once.

A benchmark starts servers and workers, then waits for the work they do. When one of them
exits at start (a config error, a port in use, a missing package), a script that only waits
for the work waits until its own timeout, and with the child's stderr sent to /dev/null
nobody learns why: ``scripts/bench/queue.py`` waited 600 s for jobs that its workers,
refusing to start without a moderation backend, never ran. So here:

* every child's stderr (and its stdout, unless that goes to a file of its own) is written to
  a log file, and what it said is kept;
* a watcher thread polls the children; when one exits before it was told to stop
  (``Child.stop``, ``Child.expect_exit``), the watcher prints its status and the end of its
  log to stderr and fails the run in the main thread with ``ChildExited``, a ``SystemExit``:
  ``except Exception`` does not swallow it, and uncaught it exits 1;
* the main thread is interrupted wherever it waits. Entered outside asyncio, by a signal
  (``SIGUSR1``, sent to the main thread alone with ``pthread_kill``) whose handler raises,
  so a blocking ``sleep``, ``wait`` or ``select`` returns at once; when the handler finds
  an event loop running (an ``asyncio.run`` inside the block), it has the loop raise the
  failure from a callback instead, between two of its steps. Entered inside a running
  event loop, by cancelling the task that entered it (thread-safe, from the watcher), whose
  ``CancelledError`` the context manager turns back into ``ChildExited`` on the way out.
  Either way the loop stops at a clean point: an exception raised by a signal handler in
  the middle of the loop's own bookkeeping can lose a task's wake-up and hang its shutdown;
* leaving the ``with`` block stops every child still running (SIGTERM to all, then SIGKILL
  to those still there after the timeout).

A child whose exits the caller handles itself (the chaos harness's workers, which it kills
and refills on purpose) is started with ``watched=False``. A run-to-completion child (a
measured fetch, a baseline upload) goes through ``Children.run``: its exit is expected, and
a non-zero status fails the run with the end of its stderr.

    with Children(workdir / "logs") as children:
        server = children.start("S3 server", [sys.executable, "-m", "moto.server", ...])
        server.wait_for(lambda: answers(url), "an answer", 30)
        figures = children.run_json("fetch", [sys.executable, "fetch_worker.py", ...])
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
INTERRUPT_SIGNAL = signal.SIGUSR1
POLL_SECONDS = 0.1
TAIL_LINES = 25
STOP_SECONDS = 30.0
KILL_SECONDS = 5.0
SIGTERM = signal.SIGTERM  # for defaults inside Child, whose ``signal`` method hides the module


class ChildExited(SystemExit):
    """A child exited before it was told to stop, or a run-to-completion child failed."""

    def __init__(self, message: str, *, printed: bool = False) -> None:
        super().__init__(message)
        self.message = message
        # Uncaught, a SystemExit prints a string code and exits 1; when the watcher has
        # printed the message already, exit 1 quietly.
        self.code = 1 if printed else message


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-").lower() or "child"


class Child:
    """One child process; its stderr (and stdout, unless ``stdout`` names a file) in ``log``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        *,
        env: Mapping[str, str] | None,
        cwd: Path,
        stdout: Path | None = None,
        watched: bool = True,
        new_session: bool = True,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.stdout = stdout
        self.watched = watched
        self.expected = False  # its exit is expected from now on
        self.started = time.monotonic()
        log.parent.mkdir(parents=True, exist_ok=True)
        self._files: list[IO[bytes]] = [open(log, "wb")]  # noqa: SIM115 - closed in close()
        if stdout is not None:
            self._files.append(open(stdout, "wb"))  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._files[-1],
            stderr=self._files[0],
            start_new_session=new_session,  # a Ctrl-C reaches the script, which stops it
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"    (cannot read {self.log}: {exc})"
        return "\n".join("    " + line[:400] for line in text) or "    (nothing)"

    def exited(self) -> str:
        """What to say about this child having exited: status, command, the end of its log."""
        seconds = time.monotonic() - self.started
        return (
            f"{self.name} (pid {self.pid}) exited with status {self.proc.returncode} after "
            f"{seconds:.1f} s: {' '.join(self.argv)[:300]}\n"
            f"  the end of {self.log}:\n{self.tail()}"
        )

    def events(self) -> list[dict[str, Any]]:
        """The JSON objects among the log's lines (an aivedio daemon's events)."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    found.append(event)
        return found

    def wait_for(self, ready: Callable[[], Any], what: str, timeout: float) -> Any:
        """``ready()``'s first true value, polled; fails when the child exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = ready()
            if found:
                return found
            if not self.alive():
                raise ChildExited(f"{self.name} exited while waiting for {what}: {self.exited()}")
            time.sleep(0.05)
        raise ChildExited(
            f"{self.name}: no {what} within {timeout:g} s; the end of {self.log}:\n{self.tail()}"
        )

    def wait_for_event(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events() if e.get("event") == name), None)

        event: dict[str, Any] = self.wait_for(found, f"{name!r} log event", timeout)
        return event

    def json_line(self, timeout: float = 60.0) -> Any:
        """The first whole line the child wrote to its ``stdout`` file, decoded as JSON."""
        assert self.stdout is not None, f"{self.name} was started without a stdout file"
        path = self.stdout

        def line() -> str | None:
            text = path.read_text()
            return text.split("\n", 1)[0] if "\n" in text else None

        return json.loads(self.wait_for(line, "JSON line on stdout", timeout))

    def expect_exit(self) -> None:
        self.expected = True

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def reap(self, timeout: float | None) -> int | None:
        """Its status once it has exited within ``timeout``, else None."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.close()
        return code

    def stop(self, timeout: float = STOP_SECONDS, signum: int = SIGTERM) -> int | None:
        """Tell it to stop and wait; SIGKILL when it is still there after ``timeout``."""
        self.expect_exit()
        self.signal(signum)
        code = self.reap(timeout)
        if code is None:
            self.signal(signal.SIGKILL)
            code = self.reap(KILL_SECONDS)
        return code

    def close(self) -> None:
        for file in self._files:
            with contextlib.suppress(OSError):
                file.close()


class Children:
    """The children of one run, watched from ``__enter__`` to ``__exit__``; see the module."""

    def __init__(
        self,
        logs: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.logs = logs
        self.env = env
        self.cwd = cwd
        self.poll_seconds = poll_seconds
        self.children: list[Child] = []
        self.failure: ChildExited | None = None
        self._lock = threading.Lock()
        self._names: dict[str, int] = {}
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._main = threading.main_thread().ident
        self._previous_handler: Any = None
        self._delivered = False  # the failure was raised in the main thread
        self._scheduled = False  # the running loop was asked to raise it
        self._closing = False  # __exit__ runs: the handler raises nothing any more

    # -- starting -------------------------------------------------------------------------------

    def _log_for(self, name: str, log: str | Path | None) -> Path:
        if log is not None:
            path = Path(log)
            return path if path.is_absolute() else self.logs / path
        with self._lock:
            n = self._names[name] = self._names.get(name, 0) + 1
        return self.logs / (f"{_slug(name)}{'' if n == 1 else f'-{n}'}.log")

    def add(self, child: Child) -> Child:
        """Watch a child made here by a subclass of ``Child`` (the chaos harness's)."""
        with self._lock:
            self.children.append(child)
        return child

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        log: str | Path | None = None,
        stdout: Path | None = None,
        env: Mapping[str, str] | None = None,
        watched: bool = True,
        new_session: bool = True,
    ) -> Child:
        """A long-running child: its exit before ``stop`` fails the run (unless not watched)."""
        child = Child(
            name,
            argv,
            self._log_for(name, log),
            env=self.env if env is None else env,
            cwd=self.cwd,
            stdout=stdout,
            watched=watched,
            new_session=new_session,
        )
        return self.add(child)

    def run(
        self,
        name: str,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        log: str | Path | None = None,
    ) -> str:
        """A run-to-completion child's stdout; a non-zero exit or the timeout fails the run.
        Safe to call from a thread (``asyncio.to_thread``): the child is stopped with the rest
        if the run is interrupted meanwhile."""
        path = self._log_for(name, log)
        out = path.with_name(path.stem + ".stdout")
        child = self.start(name, argv, log=path, stdout=out, env=env, new_session=False)
        child.expect_exit()
        code = child.reap(timeout)
        if code is None:
            child.stop(KILL_SECONDS)
            raise ChildExited(f"{name}: not done within {timeout:g} s; {child.exited()}")
        if code != 0:
            raise ChildExited(child.exited())
        return out.read_text()

    def run_json(self, name: str, argv: list[str], **kwargs: Any) -> Any:
        """``run``, and the last line of its stdout decoded as JSON."""
        text = self.run(name, argv, **kwargs).strip()
        if not text:
            raise ChildExited(f"{name} printed nothing on stdout: {' '.join(argv)[:300]}")
        return json.loads(text.splitlines()[-1])

    # -- stopping -------------------------------------------------------------------------------

    def stop(self, children: list[Child] | None = None, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM to each (all still running when None), then wait; SIGKILL past ``timeout``."""
        with self._lock:
            group = list(self.children if children is None else children)
        for child in reversed(group):
            child.expect_exit()
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in reversed(group):
            if child.reap(max(0.1, deadline - time.monotonic())) is None:
                child.signal(signal.SIGKILL)
                child.reap(KILL_SECONDS)

    # -- the watcher ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._done.wait(self.poll_seconds):
            with self._lock:
                group = list(self.children)
            for child in group:
                if not child.watched or child.expected or child.proc.poll() is None:
                    continue
                if child.expected:  # told to stop (expected, then the signal) since read above
                    continue
                self._fail(child)
                return

    def _fail(self, child: Child) -> None:
        message = f"{child.exited()}\n  (it exited before it was told to stop: failing the run)"
        print(f"[children] {message}", file=sys.stderr, flush=True)
        self.failure = ChildExited(message, printed=True)
        if self._loop is not None and self._task is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to cancel
                self._loop.call_soon_threadsafe(self._task.cancel)
        elif self._main is not None:
            signal.pthread_kill(self._main, INTERRUPT_SIGNAL)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.failure is None or self._delivered or self._scheduled or self._closing:
            return  # not ours, or done already, or too late: then __exit__ raises it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._delivered = True
            raise self.failure from None
        self._scheduled = True
        loop.call_soon_threadsafe(self._raise_failure)

    def _raise_failure(self) -> None:
        if self.failure is None or self._delivered or self._closing:
            return
        self._delivered = True
        raise self.failure  # a SystemExit: the loop lets it through and stops

    def __enter__(self) -> Children:
        try:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
        except RuntimeError:
            self._loop = None
        if self._loop is None:
            self._previous_handler = signal.signal(INTERRUPT_SIGNAL, self._on_signal)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._watcher = threading.Thread(target=self._watch, name="children-watcher", daemon=True)
        self._watcher.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True  # from here on the handler raises nothing: the cleanup runs whole
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
        try:
            self.stop()
        finally:
            if self._loop is None:
                signal.signal(INTERRUPT_SIGNAL, self._previous_handler or signal.SIG_DFL)
        if self.failure is not None and not self._delivered:
            # The task was cancelled for it (asyncio), or the body ended as the child died.
            raise self.failure from None


def environ_without_aivedio(**extra: str) -> dict[str, str]:
    """This process's environment less every ``AIVEDIO_*`` variable, plus ``extra``: a child's
    configuration comes from the file and the variables the script gives it, never from the
    shell that ran the benchmark."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(extra)
    return env
