"""The SeaweedFS server the tests, the demo, chaos and the fetch benchmark start
(``scripts/lib/seaweedfs.py``) listens on loopback only, on ports of its own, reports
nothing to anyone, and checks the credentials it is given."""

from __future__ import annotations

import json
from pathlib import Path

from scripts.lib.seaweedfs import ACCESS_KEY_ID, SECRET_ACCESS_KEY, SERVERS, Engine


def flags(argv: list[str]) -> dict[str, str]:
    found = {}
    for arg in argv[2:]:
        name, _, value = arg.removeprefix("-").partition("=")
        found[name] = value
    return found


def test_every_server_binds_loopback_on_a_port_of_its_own_and_sends_no_telemetry(
    tmp_path: Path,
) -> None:
    engine = Engine.create(tmp_path / "sw")
    argv = engine.argv()
    assert Path(argv[0]).name == "weed" and argv[1] == "server"
    given = flags(argv)
    assert given["ip"] == given["ip.bind"] == "127.0.0.1"
    assert given["master.telemetry"] == "false"
    # The gateways we do not use are off, not on their fixed default ports.
    assert given["s3.port.iceberg"] == given["s3.port.lance"] == "0"
    ports = [int(given[f"{s}.port{kind}"]) for s in SERVERS for kind in ("", ".grpc")]
    assert len(set(ports)) == len(ports) == 8
    assert engine.endpoint == f"http://127.0.0.1:{given['s3.port']}"
    assert given["dir"] == str(tmp_path / "sw" / "data") and Path(given["dir"]).is_dir()
    # Its unix sockets live in its own directory, not /tmp, where another server's would be.
    assert Path(given["filer.localSocket"]).parent == Path(given["s3.localSocket"]).parent
    assert Path(given["s3.localSocket"]).parent == tmp_path / "sw"


def test_the_s3_gateway_is_given_one_identity_so_signatures_are_checked(tmp_path: Path) -> None:
    engine = Engine.create(tmp_path / "sw")
    assert flags(engine.argv())["s3.config"] == str(engine.s3_config)
    (identity,) = json.loads(engine.s3_config.read_text())["identities"]
    assert identity["credentials"] == [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}]
