"""The container image as an operator runs it: ``aivedio api`` and ``aivedio worker`` from the
image built by ``scripts/image``, against this machine's PostgreSQL, take one provider output
from its signed callback to PLAYABLE.

The containers run as the image says (uid 10001) with a read-only root filesystem, a tmpfs on
/tmp only, every capability dropped and no new privileges: the restricted Pod Security
standard's settings. They share the host's network (``--network=host``) because PostgreSQL
and the simulated provider listen on loopback.

The image is built by ``scripts/image``: ``scripts/test`` runs it beside the checks, cached,
and says in ``AIVEDIO_IMAGE_BUILD_STATUS`` where the build writes its exit status when it ends;
the test waits for that, fails with the build log's tail if it failed, and runs the image by
the id the build wrote (``var/image/image.id``). Otherwise ``AIVEDIO_IMAGE`` names the image,
or the version's tag. Without podman, or with a podman that cannot run containers, the test is
skipped and says why; when the image named is not there, it fails.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TEST_KEY
from tests.support.media_fixtures import h264_720p

TOKEN_SECRET = base64.b64encode(b"p" * 32).decode()
CALLBACK_SECRET = "image-e2e-callback-secret"
START_SECONDS = 60
PLAYABLE_SECONDS = 120


def default_image() -> str:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"localhost/aivedio:{version}"


def podman_argv(*args: str) -> list[str]:
    driver = os.environ.get("AIVEDIO_IMAGE_STORAGE_DRIVER")
    return ["podman", *(["--storage-driver", driver] if driver else []), *args]


def podman_env(**extra: str) -> dict[str, str]:
    """The environment podman runs in: scripts/image's containers.conf (runc, rlimits this
    machine allows) unless CONTAINERS_CONF names another."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "image" / "containers.conf"))
    env.update(extra)
    return env


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        podman_argv(*args),
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# How long the image test waits for a build scripts/test started beside it (a cold build
# from Debian's archive takes a few minutes; a cached one seconds).
BUILD_WAIT_SECONDS = 1200


def built_image(status_file: Path) -> str:
    """Wait for the build scripts/test started to end; its image id, or the test fails."""
    deadline = time.monotonic() + BUILD_WAIT_SECONDS
    while not status_file.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the image build did not end in {BUILD_WAIT_SECONDS} s ({status_file})")
        time.sleep(1)
    log = status_file.with_name("build.log")
    if status_file.read_text().strip() != "0":
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
        pytest.fail(f"scripts/image failed (see {log}):\n{tail}")
    return (status_file.with_name("image.id").read_text().strip()).removeprefix("sha256:")


@pytest.fixture(scope="module")
def image() -> str:
    """The image's name, once podman is known to work and the image to be there."""
    status = os.environ.get("AIVEDIO_IMAGE_BUILD_STATUS")
    name = (
        built_image(Path(status)) if status else os.environ.get("AIVEDIO_IMAGE") or default_image()
    )
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed here (scripts/image installs it): no image to run")
    info = podman("info", "--format", "{{.Store.GraphDriverName}}")
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: `podman info` failed: {info.stderr.strip()}")
    if podman("image", "exists", name).returncode != 0:
        if status or os.environ.get("AIVEDIO_IMAGE"):
            pytest.fail(f"AIVEDIO_IMAGE={name} is not in podman's storage: run scripts/image")
        pytest.skip(f"image {name} is not built here: run scripts/image, then this test")
    return name


# The first test to ask for the image may wait for the build (``built_image``).
@pytest.mark.timeout(BUILD_WAIT_SECONDS + 120)
def test_image_runs_as_uid_10001_with_its_labels(image: str) -> None:
    inspected = podman("image", "inspect", image)
    assert inspected.returncode == 0, inspected.stderr
    config = json.loads(inspected.stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "/opt/aivedio/bin/aivedio"]
    labels = config["Labels"]
    for name in ("title", "version", "source", "revision", "licenses", "created"):
        assert labels.get(f"org.opencontainers.image.{name}"), name
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    # What the sandbox and the pipeline need is there, and no compiler is.
    script = (
        "id -u; ffmpeg -version | head -n1; python3 --version;"
        " for t in prlimit unshare tini gcc cc apt-get; do command -v $t || echo no $t; done"
    )
    shell = ["run", "--rm", "--network=none", "--read-only", "--entrypoint", "/bin/sh"]
    probe = podman(*shell, image, "-c", script)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[0] == "10001"
    assert lines[1].startswith("ffmpeg version 5.1")
    assert lines[2].startswith("Python 3.11.")
    assert lines[3:] == [
        "/usr/bin/prlimit",
        "/usr/bin/unshare",
        "/usr/bin/tini",
        "no gcc",
        "no cc",
        "no apt-get",
    ]


class Container:
    """``podman run`` in the foreground: its stderr (the JSON log) in a file; SIGTERM to the
    podman process is passed to the container's PID 1 (tini), then to aivedio."""

    def __init__(self, image: str, mounts: list[str], log_path: Path, *args: str) -> None:
        self.name = f"aivedio-e2e-{uuid.uuid4().hex[:8]}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            podman_argv("run", "--rm", "--name", self.name, *run_options(mounts), image, *args),
            env=container_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def wait_for_event(self, name: str) -> dict[str, Any]:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            for event in self.events():
                if event.get("event") == name:
                    return event
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_path.read_text()}")
            time.sleep(0.1)
        raise AssertionError(f"no {name} from {self.name}: {self.log_path.read_text()}")

    def terminate(self, timeout: float) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            podman("rm", "--force", "--time", "0", self.name)
            self.proc.wait(30)
        self._log.close()


def run_options(mounts: list[str]) -> list[str]:
    return [
        "--network=host",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs=/tmp:rw,mode=1777,size=1g",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--env=AIVEDIO_CONFIG=/etc/aivedio/aivedio.toml",
        "--env=AIVEDIO_URL_ENCRYPTION_KEY",
        "--env=AIVEDIO_PLAYBACK_TOKEN_SECRET",
        *(f"--volume={mount}" for mount in mounts),
    ]


def container_env() -> dict[str, str]:
    """podman's environment with the two secrets, which ``--env NAME`` passes on."""
    return podman_env(
        AIVEDIO_URL_ENCRYPTION_KEY=TEST_KEY, AIVEDIO_PLAYBACK_TOKEN_SECRET=TOKEN_SECRET
    )


def cli(image: str, mounts: list[str], *args: str) -> str:
    done = subprocess.run(
        podman_argv("run", "--rm", *run_options(mounts), image, *args),
        env=container_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"aivedio {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture
def simulated_provider(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``python -m aivedio.sim`` on this machine serving one H.264/AAC MP4 over HTTPS (its own
    test CA, under tmp_path/ca, which the containers mount): the JSON line it prints."""
    clip = h264_720p(tmp_path / "media", seconds=2)
    argv = [sys.executable, "-m", "aivedio.sim", "--ca-dir", str(tmp_path / "ca")]
    with subprocess.Popen(
        [*argv, "--file", f"task-image:0:{clip}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            yield json.loads(proc.stdout.readline())
        finally:
            proc.kill()


def write_config(path: Path, dsn: str, sim: dict[str, Any]) -> None:
    path.write_text(f"""
[database]
url = "{dsn}"
[storage]
url = "file:///data/objects"
[api]
host = "127.0.0.1"
port = 0
[worker]
http_port = 0
poll_interval_seconds = 0.2
[log]
format = "json"
[net]
allowed_ports = [{sim["port"]}]
allow_cidrs = ["127.0.0.0/8"]
ca_file = "/etc/aivedio/ca.pem"
[providers.sim]
api_base_url = "{sim["base_url"]}"
callback_secret = "{CALLBACK_SECRET}"
tenant = "image"
[moderation]
backend = "local"
[moderation.local]
allow_all = true
[sweeper]
periodic = false
""")
    path.chmod(0o644)


def http(
    method: str, url: str, *, key: str | None = None, body: bytes | None = None, **headers: str
) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 - loopback
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def signed_callback(base: str, sim: dict[str, Any]) -> tuple[int, Any]:
    """The provider's SUCCEEDED, signed as ``sha256=HMAC-SHA256(secret, "{ts}.{body}")``."""
    output = sim["outputs"][0]
    described = {k: output[k] for k in ("index", "url", "expires_at", "sha256", "size")}
    described["content_type"] = "video/mp4"
    body = json.dumps(
        {
            "event_id": "evt-task-image",
            "task_id": output["task_id"],
            "status": "SUCCEEDED",
            "outputs": [described],
        }
    ).encode()
    timestamp = str(int(time.time()))
    mac = hmac.new(CALLBACK_SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return http(
        "POST",
        f"{base}/v1/providers/sim/callbacks",
        body=body,
        Content_Type="application/json",
        X_Aivedio_Timestamp=timestamp,
        X_Aivedio_Signature="sha256=" + mac.hexdigest(),
    )


def wait_for_playable(base: str, key: str, generation_task_id: str) -> tuple[str, str]:
    """The video's id and state once PLAYABLE (or ENRICHED, past it); fails on an error."""
    deadline = time.monotonic() + PLAYABLE_SECONDS
    seen: Any = None
    while time.monotonic() < deadline:
        _, task = http("GET", f"{base}/v1/generation-tasks/{generation_task_id}", key=key)
        seen = task
        asset_id = task["outputs"][0]["asset_id"]
        if asset_id is not None:
            _, status = http("GET", f"{base}/v1/videos/{asset_id}/status", key=key)
            seen = status
            if status["state"] in ("PLAYABLE", "ENRICHED"):
                return str(asset_id), str(status["state"])
            assert status.get("error_class") is None, status
        time.sleep(0.5)
    raise AssertionError(f"not PLAYABLE in {PLAYABLE_SECONDS} s: {seen}")


@pytest.mark.timeout(BUILD_WAIT_SECONDS + 300)
def test_api_and_worker_from_the_image_take_a_provider_output_to_playable(
    image: str, empty_database: str, tmp_path: Path, simulated_provider: dict[str, Any]
) -> None:
    etc, data = tmp_path / "etc", tmp_path / "data"
    etc.mkdir()
    data.mkdir()
    data.chmod(0o777)  # the containers write as uid 10001
    shutil.copy(simulated_provider["ca_file"], etc / "ca.pem")
    (etc / "ca.pem").chmod(0o644)
    write_config(etc / "aivedio.toml", empty_database, simulated_provider)
    mounts = [f"{etc}:/etc/aivedio:ro", f"{data}:/data"]

    cli(image, mounts, "migrate")
    cli(image, mounts, "tenants", "create", "image")
    key = json.loads(cli(image, mounts, "keys", "create", "--tenant", "image"))["key"]

    api = Container(image, mounts, tmp_path / "api.log", "api")
    worker = Container(image, mounts, tmp_path / "worker.log", "worker")
    try:
        base = f"http://127.0.0.1:{api.wait_for_event('api_listening')['port']}"
        worker.wait_for_event("http_listening")
        status, accepted = signed_callback(base, simulated_provider)
        assert status == 202, accepted
        video_id, state = wait_for_playable(base, key, accepted["generation_task_id"])
        print(f"video {video_id} {state} from the image's API and worker")
        code, playback = http("GET", f"{base}/v1/videos/{video_id}/playback", key=key)
        assert code == 200, playback
        assert api.terminate(30) == 0
        assert worker.terminate(60) == 0
    finally:
        api.stop()
        worker.stop()

    # The published objects were written by the image's user, on the one writable mount.
    objects = [p for p in (data / "objects").rglob("*") if p.is_file()]
    assert objects
    assert {p.stat().st_uid for p in objects} == {10001}
    assert "worker_stopped" in [e.get("event") for e in worker.events()]
    assert [e.get("event") for e in api.events()][-1] == "api_stopped"
    isolation = [e for e in worker.events() if e.get("event") == "sandbox_network_isolation"]
    assert isolation, "the worker never started ffmpeg"
    print(f"ffmpeg network isolation in the container: {isolation[0]}")
