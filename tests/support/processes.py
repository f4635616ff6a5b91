"""Worker daemons as real processes, for crash and drain tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.conftest import TEST_KEY


def write_config(
    path: Path,
    dsn: str,
    *,
    control_slots: int = 16,
    lease_seconds: float = 30,
    heartbeat_seconds: float = 5,
    drain_timeout_seconds: float = 30,
    journal_dir: Path | None = None,
) -> Path:
    path.write_text(
        f"""
[database]
url = "{dsn}"
pool_max_size = 8

[worker]
http_port = 0
lease_seconds = {lease_seconds}
heartbeat_interval_seconds = {heartbeat_seconds}
drain_timeout_seconds = {drain_timeout_seconds}
poll_interval_seconds = 0.2

[worker.lanes.control]
slots = {control_slots}

[diagnostics]
execution_journal_dir = "{journal_dir or ""}"

[moderation]
backend = "local"
[moderation.local]
allow_all = true

[sweeper]
periodic = false
"""
    )
    return path


class WorkerProcess:
    def __init__(self, config: Path, log_path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
        env.update(AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY, AIVEDIO_CONFIG=str(config))
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aivedio", "worker"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        self.port = self._wait_for_event("http_listening")["port"]

    def events(self) -> list[dict[str, object]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def _wait_for_event(self, name: str, timeout: float = 20) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if event.get("event") == name:
                    return event
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited: {self.log_path.read_text()}")
            time.sleep(0.05)
        raise AssertionError(f"no {name} event in {timeout}s: {self.log_path.read_text()}")

    @property
    def owner(self) -> str:
        return str(self._wait_for_event("worker_starting")["owner"])

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.wait(10)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def journal_counts(directory: Path) -> Counter[int]:
    counts: Counter[int] = Counter()
    for file in directory.glob("executions-*.log"):
        for line in file.read_text().splitlines():
            counts[int(line.split()[0])] += 1
    return counts
