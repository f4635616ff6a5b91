"""A real worker's own stderr: what the standard library and uvloop log goes through redaction.

The worker is started the way ``aivedio worker`` starts (``aivedio.cli.main``), with a little code
before it that, once the daemon listens, makes its event loop lose a task whose exception
carries an API key (uvloop logs "Task exception was never retrieved" through the
``asyncio`` logger), logs a library record, issues a warning and lets a thread die, each
holding the key. Every line of the worker's log must be a JSON event, none may hold a piece
of the key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TEST_KEY
from tests.support.processes import write_config

KEY = "av_live_5e1f00d2_Qm9vbS1oZWFkZXItc2VjcmV0LXBhcnQtb2YtdGhlLWtleQ"

PROLOGUE = """
import asyncio, logging, os, sys, threading, time, warnings
import uvloop
from aivedio.cli.main import main

key, go = sys.argv[1], sys.argv[2]
loops = []
new_event_loop = uvloop.new_event_loop

def capture():
    loops.append(new_event_loop())
    return loops[-1]

uvloop.new_event_loop = capture  # anyio.run(use_uvloop=True) asks for the loop here

async def boom():
    raise RuntimeError(f"provider refused Authorization: Bearer {key}")

def lose_a_task():
    loops[0].create_task(boom())  # nobody keeps it, nobody reads its exception

def later():
    while not os.path.exists(go):  # the test says when the daemon runs
        time.sleep(0.05)
    loops[0].call_soon_threadsafe(lose_a_task)
    logging.getLogger("asyncpg.pool").warning("reconnecting for %s", key)
    warnings.warn(f"unclosed resource of {key}", UserWarning, stacklevel=1)
    raise OSError(f"helper thread died holding {key}")

threading.Thread(target=later, daemon=True).start()
sys.exit(main(["worker"]))
"""


def test_the_workers_stdlib_output_is_redacted_json(database: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "w.toml", database)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY, AIVEDIO_CONFIG=str(config))
    log_path = tmp_path / "worker.log"
    wanted = {"stdlib_log:asyncio", "stdlib_log:asyncpg.pool", "python_warning", "thread_exception"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", PROLOGUE, KEY, str(tmp_path / "go")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 30
        seen: set[str] = set()
        while not wanted <= seen:
            assert time.monotonic() < deadline, log_path.read_text()
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.1)
            written = log_path.read_text()
            # A line still being written is read on the next round.
            for line in written[: written.rfind("\n") + 1].splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    raise AssertionError(f"not an event: {line}\n{log_path.read_text()}") from None
                name = str(event["event"])
                seen.add(f"{name}:{event['logger']}" if name == "stdlib_log" else name)
            if "http_listening" in seen:
                (tmp_path / "go").touch()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log_path.read_text()
    events = [json.loads(line) for line in text.splitlines()]  # every line is an event
    assert not [KEY[i : i + 12] for i in range(len(KEY) - 11) if KEY[i : i + 12] in text]
    (lost,) = [e for e in events if e.get("logger") == "asyncio"]
    assert str(lost["message"]).startswith("Task exception was never retrieved")
    assert "Bearer ***" in str(lost["exception"])
    assert events[-1]["event"] == "worker_stopped"
