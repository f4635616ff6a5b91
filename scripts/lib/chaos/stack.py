"""The processes of a chaos run, each in its own session with its log under the run's dir.

PostgreSQL is a throwaway cluster of the run's own (initdb + pg_ctl, a unix socket dir and a
free TCP port under the run's directory), so it can be restarted mid-run without touching a
server anything else uses. The S3 server is SeaweedFS (``scripts/lib/seaweedfs.py``), a real
object store with its data on disk under the run's directory, so it too is SIGKILLed and
started again mid-run. The provider is ``provider.py``. The API and the workers are
``aivedio api`` and ``aivedio worker``; a worker slot is refilled by a new process whenever
the harness kills or drains the one in it. A sampler thread reads every worker's peak RSS
(``VmHWM``) from /proc a few times a second: a SIGKILLed process takes its peak with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from asyncpg.exceptions._base import InternalClientError
from children import Child

ROOT = Path(__file__).resolve().parents[3]
AIVEDIO = [sys.executable, "-m", "aivedio"]  # the package as installed or on PYTHONPATH
LIB = ROOT / "scripts" / "lib"
START_TIMEOUT_SECONDS = 60.0
PG_BINDIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


class ChaosError(Exception):
    """The harness cannot go on (not an invariant violation: those are reported)."""


def out(line: str = "") -> None:
    print(line, flush=True)


# -- processes ---------------------------------------------------------------------------------


class Proc(Child):
    """A child in its own session; stdout and stderr into ``log`` (or stdout apart). The
    infrastructure (SeaweedFS, the provider) is watched: one that exits by itself
    fails the run at once (``children.Children``). The API and the workers are not: the
    harness kills and refills them itself, and one that exits by itself is a finding
    (``Run.watch_processes``)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str],
        *,
        stdout: Path | None = None,
        watched: bool = True,
    ) -> None:
        super().__init__(name, argv, log, env=env, cwd=ROOT, stdout=stdout, watched=watched)
        self.fate = "running"  # killed | drained | stopped | exited
        self.exit_code: int | None = None
        self.peak_rss_kib = 0

    def reap(self, timeout: float | None) -> int | None:
        code = super().reap(timeout)
        if code is not None:
            self.exit_code = code
        return code

    def sample_rss(self) -> None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(("VmHWM:", "VmRSS:")):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))


# -- PostgreSQL --------------------------------------------------------------------------------


class Postgres:
    """A throwaway cluster under ``directory``; ``restart()`` is ``pg_ctl restart -m fast``."""

    def __init__(self, directory: Path, port: int) -> None:
        bindirs = [d for d in PG_BINDIRS if (d / "initdb").exists() and (d / "pg_ctl").exists()]
        if not bindirs:
            raise ChaosError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        self.bindir = bindirs[0]
        self.dir = directory
        self.port = port
        self.runas: list[str] = []
        if os.getuid() == 0:
            self.runas = ["runuser", "-u", "postgres", "--"]

    @property
    def log(self) -> Path:
        return self.dir / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run([*self.runas, *argv], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ChaosError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()}")

    def _ctl(self, action: str) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
            " -c max_connections=300 -c full_page_writes=off"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.dir / "data"),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-m",
            "fast",
            "-o",
            options,
            action,
        )

    def start(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        if self.runas:
            shutil.chown(self.dir, "postgres")
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.dir / "data"),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        )
        self._ctl("start")

    def restart(self) -> None:
        self._ctl("restart")

    def stop(self) -> None:
        with contextlib.suppress(ChaosError):
            self._ctl("stop")


# -- database access from the harness ------------------------------------------------------------


def sql(dsn: str, query: str, *args: Any, retry_seconds: float = 60.0) -> list[dict[str, Any]]:
    """Rows as dicts; retried while the server is restarting."""

    async def run() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            return [dict(r) for r in await conn.fetch(query, *args)]
        finally:
            await conn.close()

    deadline = time.monotonic() + retry_seconds
    while True:
        try:
            return asyncio.run(run())
        except (
            OSError,
            asyncpg.PostgresConnectionError,
            asyncpg.CannotConnectNowError,
            asyncpg.InterfaceError,
            InternalClientError,
            TimeoutError,
        ) as exc:
            if time.monotonic() > deadline:
                raise ChaosError(f"database unreachable for {retry_seconds:g} s: {exc}") from None
            time.sleep(0.5)


# -- the RSS sampler ---------------------------------------------------------------------------


@dataclass
class Sampler:
    procs: list[Proc] = field(default_factory=list)
    interval: float = 0.2
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, proc: Proc) -> None:
        with self._lock:
            self.procs.append(proc)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                live = [p for p in self.procs if p.alive()]
            for proc in live:
                proc.sample_rss()

    def start(self) -> None:
        threading.Thread(target=self.run, name="rss-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def stop_all(procs: list[Proc], timeout: float) -> None:
    for proc in procs:
        proc.expect_exit()  # told to stop: not a failure of the run
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        if proc.reap(max(0.1, deadline - time.monotonic())) is None:
            proc.signal(signal.SIGKILL)
            proc.reap(5)
