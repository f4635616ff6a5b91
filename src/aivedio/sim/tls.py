"""A throwaway certificate authority for the simulated provider (tests and the demo).

Needs ``trustme`` (a dev dependency): importing this module in production is a mistake.
"""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path

import trustme

DEFAULT_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")


def make_test_ca(
    names: Sequence[str] = DEFAULT_NAMES, directory: Path | None = None
) -> tuple[trustme.CA, ssl.SSLContext, Path]:
    """A fresh CA, a server context with a leaf certificate for ``names``, and the CA's PEM.

    The PEM goes to ``directory/ca.pem`` (created if needed), or to a new temporary directory
    that is not removed (pass a directory to control its lifetime). Clients trust the CA with
    ``ca.configure_trust(ctx)`` or ``ssl.create_default_context(cafile=pem)``.
    """
    if not names:
        raise ValueError("make_test_ca needs at least one name")
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(server_ctx)
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="aivedio-sim-ca-"))
    directory.mkdir(parents=True, exist_ok=True)
    pem = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    return ca, server_ctx, pem
