"""``aivedio api`` and ``aivedio keys`` as an operator runs them: real processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import TEST_KEY

SECRET = base64.b64encode(b"z" * 32).decode()


def env_for(config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.update(AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY, AIVEDIO_CONFIG=str(config), **extra)
    return env


def aivedio(config: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aivedio", *args],
        env=env_for(config, **extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def http_get(url: str, key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)  # noqa: S310 - a loopback http URL built here
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def config_file(database: str, tmp_path: Path) -> Path:
    path = tmp_path / "aivedio.toml"
    path.write_text(
        f'[database]\nurl = "{database}"\n[storage]\nurl = "file://{tmp_path}/objects"\n'
        '[api]\nport = 0\n[log]\nformat = "json"\n'
    )
    return path


def test_api_refuses_to_start_without_a_token_secret(config_file: Path) -> None:
    result = aivedio(config_file, "api")
    assert result.returncode == 2
    assert "api.playback_token_secret: missing" in result.stderr


def test_keys_cli_and_a_served_api_that_drains_on_sigterm(config_file: Path) -> None:
    assert aivedio(config_file, "tenants", "create", "acme").returncode == 0
    created = aivedio(config_file, "keys", "create", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key_doc = json.loads(created.stdout)
    key = key_doc["key"]
    assert key.startswith("av_live_") and key_doc["prefix"] == key[: len(key_doc["prefix"])]
    unknown = aivedio(config_file, "keys", "create", "--tenant", "nobody")
    assert unknown.returncode == 1 and "unknown tenant 'nobody'" in unknown.stderr
    log_path = config_file.parent / "api.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivedio", "api"],
            env=env_for(config_file, AIVEDIO_PLAYBACK_TOKEN_SECRET=SECRET),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            port = None
            deadline = time.monotonic() + 20
            while port is None and time.monotonic() < deadline:
                for line in log_path.read_text().splitlines():
                    if '"api_listening"' in line:
                        port = json.loads(line)["port"]
                assert proc.poll() is None, log_path.read_text()
                time.sleep(0.05)
            assert port, log_path.read_text()
            base = f"http://127.0.0.1:{port}"
            assert http_get(base + "/readyz")[0] == 200
            missing = f"{base}/v1/assets/00000000-0000-0000-0000-000000000000"
            assert http_get(missing, key)[0] == 404
            revoked = aivedio(config_file, "keys", "revoke", key_doc["id"])
            assert json.loads(revoked.stdout)["revoked_now"] is True
            assert http_get(missing, key)[0] == 401
            again = aivedio(config_file, "keys", "revoke", key_doc["prefix"])
            assert json.loads(again.stdout)["revoked_now"] is False
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    events = [json.loads(line)["event"] for line in log_path.read_text().splitlines() if line]
    assert events[-3:] == ["api_draining", "api_listener_closed", "api_stopped"]
    assert key not in log_path.read_text()
