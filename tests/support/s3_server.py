"""moto's S3 server as a real subprocess on a loopback port, shared by the S3 tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import boto3
import pytest

from aivedio.config.load import StorageConfig

BUCKET = "aivedio-test"
CREDENTIALS = {"s3_access_key_id": "testing", "s3_secret_access_key": "testing"}


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
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
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


def s3_config(endpoint: str, prefix: str) -> StorageConfig:
    return StorageConfig(url=f"s3://{BUCKET}/{prefix}", s3_endpoint_url=endpoint, **CREDENTIALS)
