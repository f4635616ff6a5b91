"""The S3 engines of the tests: SeaweedFS (``tests/support/seaweedfs.py``) and moto's server.

``s3_endpoint`` is parametrized over both, so every S3 test runs on each: a deviation of
either engine from what the store relies on is a test failure. moto is a mock (one thread,
objects in memory); SeaweedFS is a real distributed store with its own habits (listing
order, content types it sniffs); users run others still (AWS S3, R2, MinIO, Ceph), and
``docs/operations.md`` lists what each engine tested does differently.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from scripts.lib import seaweedfs

from aivedio.config.load import StorageConfig

BUCKET = "aivedio-test"
# SeaweedFS checks them (its identity file); moto accepts any.
CREDENTIALS = {
    "s3_access_key_id": seaweedfs.ACCESS_KEY_ID,
    "s3_secret_access_key": seaweedfs.SECRET_ACCESS_KEY,
}
ENGINES = ("seaweedfs", "moto")


# -- the moto server ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_until_answering(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer at {url} within {timeout_s}s")


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with pytest.MonkeyPatch.context() as mp, open(log_path, "wb") as log_file:
        # Dummy credentials, and never ask an instance-metadata service for real ones.
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_until_answering(f"{endpoint}/moto-api/", proc, timeout_s=20)
            client = s3_client(endpoint)
            client.create_bucket(Bucket=BUCKET)
            client.close()
            yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(params=ENGINES)
def s3_endpoint(request: pytest.FixtureRequest) -> str:
    """The endpoint of each S3 engine in turn, with the bucket ``BUCKET``."""
    endpoint: str = request.getfixturevalue(f"{request.param}_endpoint")
    return endpoint


def s3_client(endpoint: str) -> Any:
    """A boto3 client of the engine at ``endpoint``, with the tests' credentials."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=seaweedfs.ACCESS_KEY_ID,
        aws_secret_access_key=seaweedfs.SECRET_ACCESS_KEY,
    )


def s3_config(endpoint: str, prefix: str) -> StorageConfig:
    return StorageConfig(url=f"s3://{BUCKET}/{prefix}", s3_endpoint_url=endpoint, **CREDENTIALS)
