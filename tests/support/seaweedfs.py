"""SeaweedFS, a real distributed object store, as the S3 engine of the tests.

One ``weed server`` per test session (per xdist worker), on free loopback ports, with a data
directory of its own, started on first use and stopped at the end of the session. How it is
started is ``scripts/lib/seaweedfs.py``'s, shared with the demo, the chaos harness and the
fetch benchmark.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from scripts.lib import seaweedfs

from tests.support.s3_server import BUCKET


@pytest.fixture(scope="session")
def seaweedfs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = seaweedfs.Engine.create(tmp_path_factory.mktemp("seaweedfs"))
    with open(engine.directory / "server.log", "wb") as log_file:
        proc = subprocess.Popen(
            engine.argv(), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            engine.wait_until_ready(proc, seaweedfs.START_TIMEOUT_SECONDS)
            engine.ensure_bucket(BUCKET)
            yield engine.endpoint
        finally:
            seaweedfs.discard(proc)  # its data goes with the session's tmp dir
