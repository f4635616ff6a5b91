"""Malformed requests carrying a live API key and a live playback token, against the real API.

Each form is sent over a raw socket (no client library would send it) to ``aivedio api``
running as a process, with its stderr (its log) captured: no line may hold the key or the
token or a 12-character piece of either, every line is a JSON event, there is no
traceback, and each malformed request is exactly one warning. The 400 bodies must not echo
them back either.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aivedio.api.tokens import TokenSigner
from tests.e2e.test_api_process import SECRET, aivedio, env_for
from tests.support.processes import WorkerProcess, write_config

WINDOW_CHARS = 12  # the shortest piece of a secret that counts as leaked


@dataclass(frozen=True)
class Served:
    port: int
    log_path: Path
    key: str
    token: str


def pieces(secret: str) -> set[str]:
    return {secret[i : i + WINDOW_CHARS] for i in range(len(secret) - WINDOW_CHARS + 1)}


def leaked(text: str, *secrets: str) -> list[str]:
    return sorted(piece for secret in secrets for piece in pieces(secret) if piece in text)


def written(log_path: Path) -> str:
    """The log's whole lines (one still being written is read the next time)."""
    text = log_path.read_text()
    return text[: text.rfind("\n") + 1]


def events(log_path: Path) -> list[dict[str, object]]:
    """The JSON events of a log (``not_json`` finds the lines that are something else)."""
    return [json.loads(line) for line in written(log_path).splitlines() if is_json(line)]


def is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def not_json(text: str) -> list[str]:
    return [line for line in text.splitlines() if not is_json(line)]


def exchange(port: int, parts: list[bytes], pause_seconds: float = 0.2) -> bytes:
    """Send ``parts`` (pausing between them), then read until the server closes or 3 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause_seconds)
            sock.sendall(part)
        sock.settimeout(3)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


@pytest.fixture
def served(database: str, tmp_path: Path) -> Iterator[Served]:
    config = tmp_path / "aivedio.toml"
    config.write_text(
        f'[database]\nurl = "{database}"\n[storage]\nurl = "file://{tmp_path}/objects"\n'
        # No drain delay: its stop is not what this test is about (test_api_drain.py), and
        # the default 5 s of it was most of this test's teardown.
        '[api]\nport = 0\ndrain_delay_seconds = 0\n[log]\nformat = "json"\nlevel = "debug"\n'
    )
    tenant = aivedio(config, "tenants", "create", "acme")
    created = aivedio(config, "keys", "create", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)["key"]
    tenant_id = json.loads(tenant.stdout)["id"]
    signer = TokenSigner.hs256(base64.b64decode(SECRET))
    token, _ = signer.issue(tenant_id, uuid.uuid4(), 1, ttl_seconds=3600)
    for cli in (tenant, created):  # the CLI's own log says nothing of them either
        assert not leaked(cli.stderr, key, token)
    log_path = tmp_path / "api.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivedio", "api"],
            env=env_for(config, AIVEDIO_PLAYBACK_TOKEN_SECRET=SECRET),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        port = None
        deadline = time.monotonic() + 20
        while port is None and time.monotonic() < deadline:
            port = next(
                (e["port"] for e in events(log_path) if e["event"] == "api_listening"), None
            )
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.05)
        assert isinstance(port, int), log_path.read_text()
        yield Served(port, log_path, key, token)
    finally:
        proc.terminate()
        proc.wait(20)


def http(line: bytes, *headers: bytes, body: bytes = b"") -> bytes:
    """A request as bytes: the line, Host and ``headers``, each ended by CRLF, and ``body``."""
    return b"".join(h + b"\r\n" for h in (line, b"Host: 127.0.0.1", *headers)) + b"\r\n" + body


@dataclass(frozen=True)
class Malformed:
    name: str
    parts: list[bytes]  # sent with a pause between them
    event: str = "http_request_malformed"  # the one warning it must give


def malformed(key: bytes, token: bytes) -> list[Malformed]:
    auth = b"Authorization: Bearer " + key
    media = b"GET /media/" + token
    watch = b"GET /watch/" + str(uuid.uuid4()).encode()
    chunked = b"Transfer-Encoding: chunked"
    json_body = b"Content-Type: application/json"
    return [
        Malformed("control byte after the key", [http(b"GET /v1/assets HTTP/1.1", auth + b"\x01")]),
        Malformed(
            "header over the line limit", [http(b"GET /v1/assets HTTP/1.1", auth + b"A" * 9000)]
        ),
        Malformed("NUL in a media path", [http(media + b"/hls/\x00master.m3u8 HTTP/1.1")]),
        Malformed(
            "full-width dots in a media path",
            [http(media + "/\uff0e\uff0e/hls/master.m3u8 HTTP/1.1".encode())],
        ),
        Malformed("request line over the limit", [http(media + b"/" + b"a" * 9000 + b" HTTP/1.1")]),
        Malformed("bad request line", [http(media + b"/hls/master.m3u8 HTTP/1.1 junk")]),
        Malformed("bad method", [http(b"G\x01T" + media[3:] + b"/hls/master.m3u8 HTTP/1.1")]),
        Malformed("bad header name byte", [http(b"GET /v1/assets HTTP/1.1", b"X-K\x7fey: " + key)]),
        Malformed(
            "non-ASCII header name",
            [http(b"GET /v1/assets HTTP/1.1", b"Authoriz\xc3\xa9tion: Bearer " + key)],
        ),
        Malformed("header without a colon", [http(b"GET /v1/assets HTTP/1.1", b"Bearer " + key)]),
        Malformed(
            "token in a query, control byte",
            [http(watch + b"?token=" + token + b"\x01 HTTP/1.1")],
        ),
        Malformed(
            "key in a query, NUL", [http(b"GET /v1/assets?api_key=" + key + b"&x=\x00 HTTP/1.1")]
        ),
        Malformed(
            "broken chunk size",
            [http(b"POST /v1/videos HTTP/1.1", auth, chunked, body=b"zz\r\n" + key + b"\r\n")],
        ),
        Malformed(
            "chunked and Content-Length",
            [
                http(
                    b"POST /v1/providers/sim/callbacks HTTP/1.1",
                    chunked,
                    b"Content-Length: 5",
                    b"X-Aivedio-Signature: " + key,
                    body=b"0\r\n\r\n",
                )
            ],
        ),
        Malformed(
            # aiohttp gives up on the body without telling the handler, which waits until
            # the client closes: the one warning is the incomplete body.
            "broken chunk mid-body",
            [
                http(b"POST /v1/videos HTTP/1.1", auth, json_body, chunked, body=b"1\r\n{\r\n"),
                b"zz" + token + b"\r\n",
            ],
            "http_request_incomplete",
        ),
        Malformed(
            "body that is not gzip",
            [
                http(
                    b"POST /v1/videos HTTP/1.1",
                    auth,
                    json_body,
                    b"Content-Encoding: gzip",
                    b"Content-Length: 64",
                    body=(token + key)[:64],
                )
            ],
        ),
    ]


def test_malformed_requests_leave_one_warning_each_and_no_secret(served: Served) -> None:
    key, token = served.key.encode(), served.token.encode()
    # The key and the token are live: well-formed, they are accepted (404: no such asset,
    # where a bad key is 401 and a bad token 403).
    asset = b"GET /v1/assets/" + str(uuid.uuid4()).encode() + b" HTTP/1.1"
    ok = exchange(served.port, [http(asset, b"Connection: close", b"Authorization: Bearer " + key)])
    assert ok.startswith(b"HTTP/1.1 404"), ok
    media = b"GET /media/" + token + b"/hls/master.m3u8 HTTP/1.1"
    ok = exchange(served.port, [http(media, b"Connection: close")])
    assert ok.startswith(b"HTTP/1.1 404"), ok
    assert not [e for e in events(served.log_path) if e["level"] != "info"]

    cases = malformed(key, token)
    for i, case in enumerate(cases):
        answer = exchange(served.port, case.parts)
        deadline = time.monotonic() + 10  # the mid-body case waits for the client to close
        while time.monotonic() < deadline:
            text = written(served.log_path)
            warnings = [e for e in events(served.log_path) if e["level"] == "warning"]
            if len(warnings) > i or not_json(text):
                break
            time.sleep(0.05)
        assert not leaked(text, served.key, served.token), (case.name, text)
        assert not not_json(text), (case.name, text)
        assert len(warnings) == i + 1, (case.name, text)
        assert warnings[-1]["event"] == case.event, (case.name, warnings[-1])
        assert warnings[-1]["error_class"], (case.name, warnings[-1])
        # Nor is either echoed to the client (as aiohttp's own 400 body did).
        assert not leaked(answer.decode("latin-1"), served.key, served.token), (case, answer)
    time.sleep(0.5)  # anything logged late would still be in the file

    text = served.log_path.read_text()
    assert not leaked(text, served.key, served.token)
    assert not not_json(text)
    assert "Traceback" not in text
    lines = events(served.log_path)
    warnings = [e for e in lines if e["level"] == "warning"]
    assert [w["event"] for w in warnings] == [case.event for case in cases]
    assert not [e for e in lines if e["level"] in ("error", "critical")]


def test_the_workers_health_port_answers_garbage_with_one_warning(
    database: str, tmp_path: Path
) -> None:
    key = "av_live_0123abcd_" + "K" * 43
    worker = WorkerProcess(write_config(tmp_path / "w.toml", database), tmp_path / "w.log")
    try:
        bad = http(b"GET /readyz HTTP/1.1", b"Authorization: Bearer " + key.encode() + b"\x01")
        answer = exchange(worker.port, [bad])
        deadline = time.monotonic() + 10
        while not [e for e in worker.events() if e["event"] == "http_request_malformed"]:
            text = worker.log_path.read_text()
            assert not leaked(text, key), text
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
    finally:
        worker.stop()
    assert answer.split(b" ", 2)[1] == b"400", answer
    assert not leaked(answer.decode("latin-1"), key)
    text = worker.log_path.read_text()
    assert not leaked(text, key)
    assert "Traceback" not in text
    assert not not_json(text)
    malformed = [e for e in worker.events() if e["event"] == "http_request_malformed"]
    assert [(e["level"], e["error_class"]) for e in malformed] == [("warning", "BadHttpMessage")]
