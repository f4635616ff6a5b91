"""``aivedio api`` stops as a pod behind a Kubernetes Service must: a real process, SIGTERM.

A Service keeps routing to a pod until its readiness probe has failed and the endpoint change
has reached every node, seconds after SIGTERM. So the process first answers /readyz with 503
while serving everything else for ``[api] drain_delay_seconds``, then closes its listener,
then lets the requests in flight finish (``drain_timeout_seconds``).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_KEY

SECRET = base64.b64encode(b"d" * 32).decode()
DRAIN_DELAY_SECONDS = 3.0
MISSING_ASSET = "/v1/assets/00000000-0000-0000-0000-000000000000"


def env_for(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(
        AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY,
        AIVEDIO_PLAYBACK_TOKEN_SECRET=SECRET,
        AIVEDIO_CONFIG=str(config),
    )
    return env


def run_cli(config: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "aivedio", *args],
        env=env_for(config),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def get(port: int, path: str, key: str | None = None) -> tuple[int, dict[str, str]]:
    """A GET on a keep-alive connection (http.client asks for none to close, unlike urllib)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        resp.read()
        return resp.status, dict(resp.headers)
    finally:
        conn.close()


def events(log_path: Path) -> list[dict[str, Any]]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def wait_for_event(log_path: Path, proc: subprocess.Popen[bytes], name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for event in events(log_path):
            if event.get("event") == name:
                return event
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.02)
    pytest.fail(f"no {name} event in 20 s:\n{log_path.read_text()}")


@pytest.fixture
def api(database: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, int, str]]:
    config = tmp_path / "aivedio.toml"
    config.write_text(
        f'[database]\nurl = "{database}"\n[storage]\nurl = "file://{tmp_path}/objects"\n'
        f"[api]\nport = 0\ndrain_delay_seconds = {DRAIN_DELAY_SECONDS}\n"
        'drain_timeout_seconds = 10.0\n[log]\nformat = "json"\n'
    )
    run_cli(config, "tenants", "create", "acme")
    key = json.loads(run_cli(config, "keys", "create", "--tenant", "acme"))["key"]
    log_path = tmp_path / "api.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivedio", "api"],
            env=env_for(config),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        port = int(wait_for_event(log_path, proc, "api_listening")["port"])
        yield proc, log_path, port, key
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start_slow_upload(port: int, key: str) -> tuple[socket.socket, bytes]:
    """POST /v1/videos with its headers and half its body sent: a request in flight until the
    rest comes. Returns the socket and the rest of the body."""
    body = json.dumps({"sha256": "ab" * 32, "size_bytes": 1234}).encode()
    head = (
        f"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    half = len(body) // 2
    sock.sendall(head + body[:half])
    return sock, body[half:]


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest


def test_sigterm_keeps_serving_while_readyz_fails_then_closes_and_finishes_in_flight(
    api: tuple[subprocess.Popen[bytes], Path, int, str],
) -> None:
    proc, log_path, port, key = api
    assert get(port, "/readyz")[0] == 200
    status, headers = get(port, MISSING_ASSET, key)
    assert status == 404  # served: the asset does not exist
    assert headers.get("Connection") != "close"
    slow, rest = start_slow_upload(port, key)
    idle = socket.create_connection(("127.0.0.1", port), timeout=10)
    idle.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert idle.recv(65536).startswith(b"HTTP/1.1 200")  # and the connection is kept alive

    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    wait_for_event(log_path, proc, "api_draining")
    # The window: not ready, yet every route still answers, telling clients to reconnect.
    assert get(port, "/readyz")[0] == 503
    status, headers = get(port, MISSING_ASSET, key)
    assert status == 404
    assert headers.get("Connection") == "close"
    assert get(port, "/healthz")[0] == 200
    assert not any(e.get("event") == "api_listener_closed" for e in events(log_path))

    closed = wait_for_event(log_path, proc, "api_listener_closed")
    assert time.monotonic() - signalled >= DRAIN_DELAY_SECONDS - 0.1
    assert closed["open_connections"] >= 2  # the slow upload's and the idle one
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # The idle keep-alive connection is closed by the server, not left to its keep-alive timeout.
    try:
        assert idle.recv(65536) == b""
    finally:
        idle.close()

    # The request that was in flight when the listener closed completes.
    slow.sendall(rest)
    try:
        status, answer = read_response(slow)
    finally:
        slow.close()
    assert status == 201, (answer, log_path.read_text())
    assert b'"AWAITING_UPLOAD"' in answer
    assert proc.wait(20) == 0
    names = [e["event"] for e in events(log_path) if e.get("event", "").startswith("api_")]
    assert names[-3:] == ["api_draining", "api_listener_closed", "api_stopped"]


def test_a_second_signal_cuts_the_drain_delay_short(
    api: tuple[subprocess.Popen[bytes], Path, int, str],
) -> None:
    proc, log_path, _port, _key = api
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    wait_for_event(log_path, proc, "api_draining")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert time.monotonic() - signalled < DRAIN_DELAY_SECONDS
    names = [e["event"] for e in events(log_path) if e.get("event", "").startswith("api_")]
    assert names[-3:] == ["api_draining", "api_listener_closed", "api_stopped"]
